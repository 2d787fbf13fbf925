// Two "hosts" on one machine for tests: two network namespaces joined by a veth pair, each
// with its own address, so traffic between them crosses a real (virtual) link rather than
// loopback. Needs root (CAP_NET_ADMIN) and iproute2; tests call namespace_skip_reason() first and
// GTEST_SKIP() with it when it is not empty.
#pragma once

#include <unistd.h>

#include <string>

#include "testing/processes.h"

namespace datapar::testing {

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
    const ProcessResult setup = run_shell("sh -c '" + script + "'");
    setup_output_ = setup.output;
    ok_ = setup.exit_code == 0;
  }
  ~NamespacePair() {
    run_shell("ip netns del " + a_ + "; ip netns del " + b_);
  }
  bool ok() const { return ok_; }
  const std::string& setup_output() const { return setup_output_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& address_a() const { return address_a_; }
  const std::string& address_b() const { return address_b_; }

 private:
  std::string a_, b_, address_a_, address_b_, setup_output_;
  bool ok_ = false;
};

// Why namespace tests cannot run here, or "" when they can.
inline std::string namespace_skip_reason() {
  if (::geteuid() != 0) return "needs root to create network namespaces (ip netns)";
  if (run_shell("ip -V").exit_code != 0) return "needs iproute2 (the ip command)";
  return "";
}

}  // namespace datapar::testing
