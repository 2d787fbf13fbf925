// Rendezvous between two "hosts": two network namespaces joined by a veth pair, each with
// its own address, so the store traffic crosses a real (virtual) link rather than loopback.
// Needs root (CAP_NET_ADMIN) and iproute2; skipped with a message otherwise.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

std::string run(const std::string& command, int* status) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return output;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  *status = ::pclose(pipe);
  return output;
}

// Two namespaces "<a>" (10.231.S.1) and "<b>" (10.231.S.2) on one veth pair; removed on exit.
class NamespacePair {
 public:
  NamespacePair() {
    const int pid = static_cast<int>(::getpid());
    const std::string subnet = "10.231." + std::to_string(pid % 250) + ".";
    a_ = "dp_a_" + std::to_string(pid);
    b_ = "dp_b_" + std::to_string(pid);
    address_a_ = subnet + "1";
    address_b_ = subnet + "2";
    const std::string veth_a = "dpva" + std::to_string(pid % 100000);
    const std::string veth_b = "dpvb" + std::to_string(pid % 100000);
    const std::string script =
        "set -e; ip netns add " + a_ + "; ip netns add " + b_ + "; ip link add " + veth_a + " type veth peer name " +
        veth_b + "; ip link set " + veth_a + " netns " + a_ + "; ip link set " + veth_b + " netns " + b_ +
        "; ip -n " + a_ + " addr add " + address_a_ + "/24 dev " + veth_a + "; ip -n " + b_ + " addr add " +
        address_b_ + "/24 dev " + veth_b + "; ip -n " + a_ + " link set " + veth_a + " up; ip -n " + b_ +
        " link set " + veth_b + " up; ip -n " + a_ + " link set lo up; ip -n " + b_ + " link set lo up";
    int status = -1;
    setup_output_ = run("sh -c '" + script + "'", &status);
    ok_ = status == 0;
  }
  ~NamespacePair() {
    int status;
    run("ip netns del " + a_ + "; ip netns del " + b_, &status);
  }
  bool ok() const { return ok_; }
  const std::string& setup_output() const { return setup_output_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& address_a() const { return address_a_; }

 private:
  std::string a_, b_, address_a_, address_b_, setup_output_;
  bool ok_ = false;
};

TEST(TwoHosts, RendezvousAcrossANetworkNamespacePair) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces (ip netns)";
  int status = -1;
  run("ip -V", &status);
  if (status != 0) GTEST_SKIP() << "needs iproute2 (the ip command)";
  NamespacePair hosts;
  ASSERT_TRUE(hosts.ok()) << "could not set up the namespaces:\n" << hosts.setup_output();

  // Each namespace is fresh and private, so a fixed port cannot collide with anything.
  const std::string url = "tcp://" + hosts.address_a() + ":29500";
  const std::string probe = std::string(DATAPAR_BIN_DIR) + "/store_probe";
  // Rank 1 starts first: it must retry until rank 0's server is up on the other "host".
  const std::string command = "ip netns exec " + hosts.b() + " " + probe + " " + url + " 1 2 & b=$!; sleep 0.2; " +
                              "ip netns exec " + hosts.a() + " " + probe + " " + url + " 0 2; a=$?; wait $b; " +
                              "echo \"exit codes $a $?\"";
  const std::string output = run("sh -c '" + command + "'", &status);
  EXPECT_NE(output.find("rank 0 of 2 ok"), std::string::npos) << output;
  EXPECT_NE(output.find("rank 1 of 2 ok"), std::string::npos) << output;
  EXPECT_NE(output.find("exit codes 0 0"), std::string::npos) << output;
}

}  // namespace
