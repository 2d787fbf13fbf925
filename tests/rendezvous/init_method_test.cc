#include "datapar/rendezvous/init_method.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <fstream>
#include <map>
#include <thread>

#include "datapar/error.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/expect_throw.h"
#include "testing/fake_env.h"
#include "testing/ports.h"
#include "testing/processes.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

using testing::fake_env;

// The tcp:// and env:// tests name rank 0's port in the URL or MASTER_PORT, as users do,
// so they take a ReservedPort (datapar/rendezvous/reserved_port.h), which no other process
// can take meanwhile.

// Runs rendezvous for each (rank, world_size) on its own thread; returns what each threw ("" if nothing).
std::vector<std::string> join_all(const std::string& url, const std::vector<std::pair<int, int>>& members,
                                  std::chrono::milliseconds timeout = 10s) {
  std::vector<std::string> errors(members.size());
  std::vector<std::thread> threads;
  std::vector<Rendezvous> results(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        results[i] = rendezvous(url, members[i].first, members[i].second, timeout, fake_env({}));
        EXPECT_EQ(results[i].rank, members[i].first);
        results[i].store->add("after", 1);  // the store works once joined
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(InitMethod, ParsesTheThreeForms) {
  EXPECT_EQ(parse_init_method("env://").kind, InitMethod::Kind::kEnv);
  const InitMethod tcp = parse_init_method("tcp://10.1.2.3:29500");
  EXPECT_EQ(tcp.kind, InitMethod::Kind::kTcp);
  EXPECT_EQ(tcp.host, "10.1.2.3");
  EXPECT_EQ(tcp.port, 29500);
  EXPECT_EQ(parse_init_method("tcp://[::1]:1234").host, "::1");
  EXPECT_EQ(parse_init_method("file:///shared/job/store").path, "/shared/job/store");
}

TEST(InitMethod, MalformedUrlsSayWhatIsValid) {
  EXPECT_THROW_MSG(parse_init_method("tcp://host"), InvalidArgumentError, "needs HOST:PORT");
  EXPECT_THROW_MSG(parse_init_method("tcp://host:http"), InvalidArgumentError, "not a port number");
  EXPECT_THROW_MSG(parse_init_method("tcp://host:70000"), InvalidArgumentError, "outside 1..65535");
  EXPECT_THROW_MSG(parse_init_method("file://relative/path"), InvalidArgumentError, "absolute path");
  EXPECT_THROW_MSG(parse_init_method("http://x:1"), InvalidArgumentError, "Use env://, tcp://HOST:PORT or file://");
  EXPECT_THROW_MSG(parse_init_method(""), InvalidArgumentError, "not a URL");
}

TEST(InitMethod, ReadsTorchrunOpenMpiAndSlurmVariables) {
  auto torchrun = identity_from_environment(fake_env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                      {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(torchrun);
  EXPECT_EQ(torchrun->rank, 3);
  EXPECT_EQ(torchrun->world_size, 8);
  EXPECT_EQ(torchrun->local_rank, 1);
  EXPECT_EQ(torchrun->local_world_size, 2);
  EXPECT_EQ(torchrun->source, "torchrun");
  auto mpi = identity_from_environment(fake_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  ASSERT_TRUE(mpi);
  EXPECT_EQ(mpi->source, "Open MPI");
  EXPECT_EQ(mpi->local_world_size, -1);
  auto slurm = identity_from_environment(fake_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
                                                   {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "3(x2)"}}));
  ASSERT_TRUE(slurm);
  EXPECT_EQ(slurm->rank, 5);
  EXPECT_EQ(slurm->source, "Slurm");
  EXPECT_EQ(slurm->local_world_size, -1);  // "3(x2)" is not a plain count
  EXPECT_FALSE(identity_from_environment(fake_env({})));
  EXPECT_THROW_MSG(identity_from_environment(fake_env({{"RANK", "one"}, {"WORLD_SIZE", "2"}})), InvalidArgumentError,
                   "RANK=\"one\" is not a valid integer");
}

TEST(Rendezvous, TcpWithThreeRanks) {
  const ReservedPort port;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port.port());
  for (const std::string& e : join_all(url, {{0, 3}, {1, 3}, {2, 3}})) EXPECT_EQ(e, "");
}

TEST(Rendezvous, EnvReadsMasterAddrPortRankAndWorldSize) {
  const ReservedPort reserved;
  const std::string port = std::to_string(reserved.port());
  std::vector<std::thread> threads;
  std::vector<int> ranks(2, -1);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const auto env = fake_env({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"RANK", std::to_string(r)},
                                 {"WORLD_SIZE", "2"}});
      try {
        ranks[r] = rendezvous("env://", -1, -1, 10s, env).rank;  // the store is dropped at once
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ranks, (std::vector<int>{0, 1}));
  EXPECT_THROW_MSG(rendezvous("env://", 0, 1, 1s, fake_env({{"MASTER_PORT", "1"}})), InvalidArgumentError,
                   "MASTER_ADDR is not set");
  EXPECT_THROW_MSG(rendezvous("env://", -1, -1, 1s, fake_env({})), InvalidArgumentError,
                   "rank and world size are unknown");
}

TEST(Rendezvous, FileWithThreeRanks) {
  const testing::TempDir temp("rendezvous");
  const std::string& dir = temp.path();
  for (const std::string& e : join_all("file://" + dir + "/store", {{0, 3}, {1, 3}, {2, 3}})) EXPECT_EQ(e, "");
  EXPECT_THROW_MSG(rendezvous("file:///nonexistent-dir/store", 0, 1, 1s, fake_env({})), InvalidArgumentError,
                   "/nonexistent-dir of file:///nonexistent-dir/store does not exist");
}

TEST(Rendezvous, ClearErrorsForBadRanksAndDisagreements) {
  EXPECT_THROW_MSG(rendezvous("tcp://127.0.0.1:1", 3, 3, 1s, fake_env({})), InvalidArgumentError,
                   "rank 3 is outside [0, 3)");
  const ReservedPort port, port2;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port.port());
  // Rank 1 twice, and rank 2 with another world size; the short timeout ends the rest.
  auto errors = join_all(url, {{0, 3}, {1, 3}, {1, 3}}, 2s);
  EXPECT_EQ(std::count_if(errors.begin(), errors.end(),
                          [](const std::string& e) { return e.find("rank 1 is claimed by two processes") != std::string::npos; }),
            1);
  const std::string url2 = "tcp://127.0.0.1:" + std::to_string(port2.port());
  errors = join_all(url2, {{0, 2}, {1, 3}}, 2s);
  EXPECT_TRUE(errors[1].find("has world size 3 but the job agreed on 2") != std::string::npos ||
              errors[0].find("has world size 2 but the job agreed on 3") != std::string::npos)
      << errors[0] << " | " << errors[1];
}

TEST(Rendezvous, MissingRanksAreNamedWhenTheTimeoutEnds) {
  const ReservedPort port;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port.port());
  const auto errors = join_all(url, {{0, 4}, {2, 4}}, 300ms);
  EXPECT_NE(errors[0].find("2 of 4 ranks never arrived (1, 3)"), std::string::npos) << errors[0];
  // Rank 2 times out the same way, unless rank 0 gave up first and took its server with it.
  EXPECT_TRUE(errors[1].find("2 of 4 ranks never arrived (1, 3)") != std::string::npos ||
              errors[1].find("lost the connection") != std::string::npos)
      << errors[1];
}

// Finding (file://): a foreign file was truncated, written to and deleted.
TEST(InitMethod, FileUrlNamingAForeignFileIsRefusedAndLeftAlone) {
  const testing::TempDir temp("rendezvous");
  const std::string& dir = temp.path();
  const std::string path = dir + "/model.pt";
  std::ofstream(path) << "not a store";
  EXPECT_THROW_MSG(rendezvous("file://" + path, 0, 1, 1s, fake_env({})), InvalidArgumentError,
                   path + " is not a datapar store");
  std::ifstream in(path);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "not a store");
}

// Finding: a job without a token ran its store open to anyone. Across machines, where no
// generated token can reach the other ranks, it refuses to start and says what to do.
TEST(InitMethod, JobAcrossMachinesWithoutATokenRefusesToStart) {
  for (int rank : {0, 1}) {
    const auto env = fake_env({{"MASTER_ADDR", "10.255.255.1"}, {"MASTER_PORT", "29500"}, {"RANK", std::to_string(rank)},
                               {"WORLD_SIZE", "4"}, {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", "2"}});
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW_MSG(rendezvous("env://", -1, -1, 3s, env), InvalidArgumentError, "DATAPAR_STORE_TOKEN");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  }
}

// torchrun, mpirun or srun on one machine without DATAPAR_STORE_TOKEN: rank 0's store
// makes a token and the other ranks, separate processes, find it.
TEST(InitMethod, ProcessesOfOneMachineShareAGeneratedToken) {
  ::unsetenv("DATAPAR_STORE_TOKEN");
  const ReservedPort port;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port.port());
  const testing::TempDir temp("rendezvous");
  const std::string& dir = temp.path();
  const std::string probe = std::string(DATAPAR_BIN_DIR) + "/store_probe";
  // Rank 0 last: the others wait for its server, and its token.
  const auto results = testing::run_processes({{probe, url, "2", "3"}, {probe, url, "1", "3"}, {probe, url, "0", "3"}},
                                              dir, std::chrono::seconds(60));
  for (const auto& r : results) EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Issue 27: two jobs started on one port with one token trained together (a rank of the
// second joined the first's store and took a rank of it). Each job's run id (DATAPAR_RUN_ID,
// which datapar launch sets) is checked at the join: the second job's rank is refused at
// once, and the first job's own rank still joins.
TEST(Rendezvous, ARankOfAnotherJobOnTheSamePortIsRefused) {
  const ReservedPort reserved;
  const std::string port = std::to_string(reserved.port());
  auto env = [&](int rank, const std::string& run) {
    return fake_env({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"RANK", std::to_string(rank)},
                     {"WORLD_SIZE", "2"}, {"DATAPAR_STORE_TOKEN", "shared-token"}, {"DATAPAR_RUN_ID", run}});
  };
  std::string first_rank0_error = "not run";
  std::thread rank0([&] {
    try {
      rendezvous("env://", -1, -1, 20s, env(0, "job-a"));
      first_rank0_error = "";
    } catch (const std::exception& e) {
      first_rank0_error = e.what();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW_MSG(rendezvous("env://", -1, -1, 20s, env(1, "job-b")), InvalidArgumentError,
                   "this store belongs to another job");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "refused at once, not at the timeout";
  EXPECT_EQ(rendezvous("env://", -1, -1, 20s, env(1, "job-a")).rank, 1);
  rank0.join();
  EXPECT_EQ(first_rank0_error, "");
}

TEST(Rendezvous, UnreachableMasterTimesOut) {
  const ReservedPort port;  // nothing listens there, and nothing else can start to
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port.port());
  EXPECT_THROW_MSG(rendezvous(url, 1, 2, 300ms, fake_env({})), TimeoutError, "Is the store server (rank 0) running?");
}

}  // namespace
}  // namespace datapar
