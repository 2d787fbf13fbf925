// Rendezvous between two "hosts": two network namespaces joined by a veth pair, each with
// its own address, so the store traffic crosses a real (virtual) link rather than loopback.
// Needs root (CAP_NET_ADMIN) and iproute2; skipped with a message otherwise.
#include <gtest/gtest.h>

#include <string>

#include "testing/namespaces.h"

namespace {

using datapar::testing::NamespacePair;
using datapar::testing::run_shell;

TEST(TwoHosts, RendezvousAcrossANetworkNamespacePair) {
  const std::string skip = datapar::testing::namespace_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  NamespacePair hosts;
  ASSERT_TRUE(hosts.ok()) << "could not set up the namespaces:\n" << hosts.setup_output();

  // Each namespace is fresh and private, so a fixed port cannot collide with anything.
  const std::string url = "tcp://" + hosts.address_a() + ":29500";
  // Across machines a job needs a token that every process is given.
  const std::string probe = "env DATAPAR_STORE_TOKEN=twohosts " + std::string(DATAPAR_BIN_DIR) + "/store_probe";
  // Rank 1 starts first: it must retry until rank 0's server is up on the other "host".
  const std::string command = "ip netns exec " + hosts.b() + " " + probe + " " + url + " 1 2 & b=$!; sleep 0.2; " +
                              "ip netns exec " + hosts.a() + " " + probe + " " + url + " 0 2; a=$?; wait $b; " +
                              "echo \"exit codes $a $?\"";
  const std::string output = run_shell("sh -c '" + command + "'").output;
  EXPECT_NE(output.find("rank 0 of 2 ok"), std::string::npos) << output;
  EXPECT_NE(output.find("rank 1 of 2 ok"), std::string::npos) << output;
  EXPECT_NE(output.find("exit codes 0 0"), std::string::npos) << output;

  // Without one, a rank on the other "host" refuses at once (a token generated there could
  // not reach it) and says how to give one.
  const std::string bare = "env -u DATAPAR_STORE_TOKEN " + std::string(DATAPAR_BIN_DIR) + "/store_probe";
  const std::string refused = run_shell("ip netns exec " + hosts.b() + " timeout 20 " + bare + " " + url + " 1 2 2>&1").output;
  EXPECT_NE(refused.find("export DATAPAR_STORE_TOKEN="), std::string::npos) << refused;
}

}  // namespace
