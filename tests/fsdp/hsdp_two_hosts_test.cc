// Hybrid sharding across two "hosts" (network namespaces joined by a veth link, two ranks
// in each, one `datapar launch` per host): `datapar bench fsdp --hsdp` counts the bytes each
// variant sends over the link (the kernel's counters), and HSDP sends at most 1/shard-size
// (here 1/2) of what FSDP over all four ranks sends: only the all-reduce of the gradient
// shards crosses, the gathers and reduce-scatters stay on each host.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "testing/namespaces.h"
#include "testing/processes.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar {
namespace hsdp_two_hosts_test {

std::string datapar_bin() { return std::string(DATAPAR_BIN_DIR) + "/datapar"; }

TEST(HsdpTwoHosts, SendsAtMostAHalfOfFsdpsBytesOverTheLinkBetweenHosts) {
  const std::string skip = testing::namespace_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  testing::NamespacePair hosts;
  ASSERT_TRUE(hosts.ok()) << "could not set up the namespaces:\n" << hosts.setup_output();
  const testing::TempDir temp("hsdp_two_hosts");
  const std::string& dir = temp.path();
  auto node = [&](const std::string& ns, const std::string& address, int node_rank) {
    // Both namespaces share this machine's hostname: tell Gloo which address is ours.
    return "ip netns exec " + ns + " env DATAPAR_STORE_TOKEN=hsdp DATAPAR_GLOO_HOSTNAME=" + address + " timeout 120 " + datapar_bin() +
           " launch --nproc-per-node 2 --nnodes 2 --node-rank " + std::to_string(node_rank) + " --master-addr " +
           hosts.address_a() + " --master-port 29531 -- " + datapar_bin() +
           " bench fsdp --hsdp --model mlp --steps 10 --warmup 2 --rounds 1";
  };
  const std::string command = node(hosts.b(), hosts.address_b(), 1) + " > " + dir + "/b.log 2>&1 & b=$!; sleep 0.2; " +
                              node(hosts.a(), hosts.address_a(), 0) + " > " + dir + "/a.log 2>&1; a=$?; wait $b; " +
                              "echo \"exit codes $a $?\"";
  const std::string output = testing::run_shell("sh -c '" + command + "'").output;
  const std::string a = testing::read_text(dir + "/a.log"), b = testing::read_text(dir + "/b.log");
  ASSERT_NE(output.find("exit codes 0 0"), std::string::npos) << output << "\nnode 0:\n" << a << "\nnode 1:\n" << b;
  std::smatch m;
  const std::regex line(R"(bytes over the machines' links per step: ddp (\d+), fsdp (\d+), hsdp (\d+))");
  ASSERT_TRUE(std::regex_search(a, m, line)) << a;
  const double fsdp = std::stod(m[2]), hsdp = std::stod(m[3]);
  // An MLP of 0.67M float32 parameters: FSDP over the link gathers and reduce-scatters it.
  EXPECT_GT(fsdp, 2e6) << a;
  EXPECT_GT(hsdp, 0) << "the gradient shards' all-reduce crosses the link\n" << a;
  EXPECT_LE(hsdp, fsdp / 2) << a;
  EXPECT_NE(a.find("hsdp (shard groups of 2, replicated 2 times)"), std::string::npos) << a;
}

}  // namespace hsdp_two_hosts_test
}  // namespace datapar
