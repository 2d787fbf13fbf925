// The flight recorder and DETAIL's check (issue 49), with ranks as threads of one Gloo group:
// seeded faults (a rank that skips a collective, calls all_gather where the others call
// all_reduce, another size, another dtype, or sleeps past the timeout) are named by the
// analysis of the dumps, collective and rank; under DATAPAR_DISTRIBUTED_DEBUG=DETAIL the
// mismatches fail at once on every rank, with both calls named.
#include "datapar/process_group/flight_recorder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "datapar/error.h"
#include "file_system.h"
#include "testing/ddp_scenarios.h"
#include "testing/gloo_ranks.h"
#include "testing/temp_dir.h"
#include "trace/recorder.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Two ranks as threads of a child process (Gloo ends a process whose peer sends bytes that do
// not fit, in std::terminate: the recorder dumps first): three all_reduces of float32[8] each,
// then collective #4: `fault` on rank 1, an all_reduce of float32[8] on rank 0. Errors
// (timeouts, mismatches) are caught; at the end every group's records are dumped, and the
// parent analyses what the child left.
// `dump_at_end` false: the dump is the one the first failure wrote.
std::string analysis_of(const std::function<void(ProcessGroup&)>& fault, const std::string& dir,
                        bool dump_at_end = true) {
  const pid_t pid = detail::fork_child(
      [&] {
        enable_flight_recorder(2000, dir);
        std::atomic<int> done{0};
        testing::run_gloo_ranks_with_options(
            2, [](int) { return GlooOptions{"127.0.0.1", 1500ms, false}; },
            [&](int rank, std::shared_ptr<ProcessGroup> group) {
              for (int i = 0; i < 3; ++i) group->all_reduce(at::ones({8}))->wait();
              try {
                if (rank == 1) {
                  fault(*group);
                } else {
                  group->all_reduce(at::ones({8}))->wait();
                }
              } catch (const Error&) {
                // a timeout or a broken pair: what the analysis is for
              }
              ++done;  // both groups alive until the dump
              while (done.load() < 2) std::this_thread::sleep_for(1ms);
              if (rank == 0 && dump_at_end) dump_flight_recorder("the test");
              ++done;
              while (done.load() < 4) std::this_thread::sleep_for(1ms);
            },
            /*meet_at_end=*/false);
        return 0;
      },
      "flight recorder test");
  detail::wait_child(pid);
  return analyze_flight_records(dir);
}

TEST(FlightRecorder, NamesARankThatCalledAnotherCollective) {
  const testing::TempDir temp("fr_other_op");
  const std::string said = analysis_of(
      [](ProcessGroup& g) {
        std::vector<at::Tensor> out{at::empty({8}), at::empty({8})};
        g.all_gather(out, at::ones({8}))->wait();
      },
      temp.path());
  EXPECT_NE(said.find("the ranks part at collective #4"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 0 called all_reduce(sum) on float32[8]"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 1 called all_gather on float32[8]"), std::string::npos) << said;
}

TEST(FlightRecorder, NamesARankThatSkippedACollective) {
  // Rank 1 skips #4 (a broadcast on every other rank) and goes on to #5, a barrier.
  const testing::TempDir temp("fr_skip");
  const std::string said = analysis_of([](ProcessGroup& g) { g.barrier()->wait(); }, temp.path());
  EXPECT_NE(said.find("the ranks part at collective #4"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 0 called all_reduce(sum) on float32[8]; rank 1 called barrier"), std::string::npos)
      << said;
}

TEST(FlightRecorder, NamesARankThatCalledWithAnotherSize) {
  const testing::TempDir temp("fr_size");
  const std::string said = analysis_of([](ProcessGroup& g) { g.all_reduce(at::ones({16}))->wait(); }, temp.path());
  EXPECT_NE(said.find("the ranks part at collective #4"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 1 called all_reduce(sum) on float32[16]"), std::string::npos) << said;
}

TEST(FlightRecorder, NamesARankThatCalledWithAnotherDtype) {
  const testing::TempDir temp("fr_dtype");
  const std::string said =
      analysis_of([](ProcessGroup& g) { g.all_reduce(at::ones({8}, at::kDouble))->wait(); }, temp.path());
  EXPECT_NE(said.find("the ranks part at collective #4"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 1 called all_reduce(sum) on float64[8]"), std::string::npos) << said;
}

TEST(FlightRecorder, NamesARankAsleepAndTheCollectiveTheOthersWaitIn) {
  const testing::TempDir temp("fr_asleep");
  const std::string said = analysis_of(
      [](ProcessGroup& g) {
        std::this_thread::sleep_for(5s);  // well past the others' timeout (1.5 s)
        g.all_reduce(at::ones({8}))->wait();
      },
      temp.path(), /*dump_at_end=*/false);
  EXPECT_NE(said.find("rank 1 has not issued it (all_reduce(sum) on float32[8], which rank 0 issued)"),
            std::string::npos) << said;
  EXPECT_NE(said.find("rank 1's last is #3 all_reduce(sum) on float32[8], completed"), std::string::npos) << said;
}

TEST(FlightRecorder, AJobWithoutFaultsIsSaidToAgree) {
  const testing::TempDir temp("fr_fine");
  const std::string said = analysis_of([](ProcessGroup& g) { g.all_reduce(at::ones({8}))->wait(); }, temp.path());
  EXPECT_NE(said.find("every rank issued the same 4 collectives (#1 to #4); the last, all_reduce(sum) on "
                      "float32[8], completed on every rank."),
            std::string::npos) << said;
}

TEST(FlightRecorder, TheRingKeepsTheLastEntriesAndADirectoryWithoutDumpsIsAnError) {
  const testing::TempDir temp("fr_ring");
  enable_flight_recorder(5, temp.path());
  std::atomic<int> done{0};
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    for (int i = 0; i < 12; ++i) group->all_reduce(at::ones({2}))->wait();
    ++done;
    while (done.load() < 2) std::this_thread::sleep_for(1ms);
    if (rank == 0) dump_flight_recorder("the test");
    ++done;
    while (done.load() < 4) std::this_thread::sleep_for(1ms);
  });
  enable_flight_recorder(0);
  const std::string said = analyze_flight_records(temp.path());
  // 12 all_reduces: the last 5 kept.
  EXPECT_NE(said.find("every rank issued the same 5 collectives (#8 to #12); the last, all_reduce(sum) on "
                      "float32[2], completed"),
            std::string::npos) << said;
  const testing::TempDir empty("fr_empty");
  EXPECT_THROW(analyze_flight_records(empty.path()), InvalidArgumentError);
  std::ofstream(empty.path() + "/flight-recorder-rank-0.json") << "{\"format\": 3";
  EXPECT_THROW(analyze_flight_records(empty.path()), InvalidArgumentError);
}

// Each record says who issued it, where a caller labels its collectives (DDP's buckets, ZeRO's
// shards: trace::detail::CollectiveLabel), and when it was issued, began to run and ended.
TEST(FlightRecorder, ARecordSaysWhoIssuedItAndWhenItStartedAndEnded) {
  const testing::TempDir temp("fr_site");
  enable_flight_recorder(10, temp.path());
  std::atomic<int> done{0};
  std::string path;
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    {
      const trace::detail::CollectiveLabel label("bucket", 3, 32);
      group->all_reduce(at::ones({8}))->wait();
    }
    group->all_reduce(at::ones({2}))->wait();
    ++done;
    while (done.load() < 2) std::this_thread::sleep_for(1ms);
    if (rank == 0) path = dump_flight_recorder("the test");
    ++done;
    while (done.load() < 4) std::this_thread::sleep_for(1ms);
  });
  enable_flight_recorder(0);
  // One process: one dump with both ranks' groups.
  const nlohmann::json dump = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(dump.at("groups").size(), 2u) << dump.dump();
  for (const nlohmann::json& group : dump.at("groups")) {
    const nlohmann::json& entries = group.at("entries");
    ASSERT_EQ(entries.size(), 2u) << group.dump();
    EXPECT_EQ(entries[0].value("site", ""), "bucket 3") << entries[0].dump();
    EXPECT_FALSE(entries[1].contains("site")) << entries[1].dump();
    for (const nlohmann::json& e : entries) {
      ASSERT_TRUE(e.contains("started_ns")) << e.dump();
      EXPECT_LE(e.at("issued_ns").get<int64_t>(), e.at("started_ns").get<int64_t>()) << e.dump();
      EXPECT_LE(e.at("started_ns").get<int64_t>(), e.at("ended_ns").get<int64_t>()) << e.dump();
    }
  }
}

TEST(FlightRecorder, SigusrOneDumps) {
  const testing::TempDir temp("fr_signal");
  enable_flight_recorder(100, temp.path());
  std::atomic<int> done{0};
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    group->all_reduce(at::ones({3}))->wait();
    ++done;
    while (done.load() < 2) std::this_thread::sleep_for(1ms);
    if (rank == 0) {
      ::raise(SIGUSR1);
      const auto deadline = std::chrono::steady_clock::now() + 20s;
      while (detail::list_directory(temp.path()).empty() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(10ms);
      }
    }
    ++done;
    while (done.load() < 4) std::this_thread::sleep_for(1ms);
  });
  enable_flight_recorder(0);
  const std::string said = analyze_flight_records(temp.path());
  EXPECT_NE(said.find("every rank issued the same collective, #1, all_reduce(sum) on float32[3], completed on every "
                      "rank."),
            std::string::npos) << said;
}

// Dumps from several threads at once (a failing collective, SIGUSR1, dump_flight_recorder)
// each write a whole file: they once shared one temporary, and a shorter dump written over
// a longer one left a file no analysis could read.
TEST(FlightRecorder, DumpsFromManyThreadsAtOnceLeaveAWholeFile) {
  const testing::TempDir temp("fr_threads");
  enable_flight_recorder(100, temp.path());
  std::atomic<bool> dumped{false};
  std::string problem;
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    group->all_reduce(at::ones({3}))->wait();
    if (rank != 0) {
      while (!dumped.load()) std::this_thread::sleep_for(1ms);  // no collective during the dumps
      return;
    }
    // Rounds of four dumps of unlike lengths let go at once; after each, the file must read.
    for (int round = 0; round < 120 && problem.empty(); ++round) {
      std::atomic<int> ready{0};
      std::vector<std::thread> dumpers;
      for (int t = 0; t < 4; ++t) {
        dumpers.emplace_back([&, t] {
          ++ready;
          while (ready.load() < 4) {
          }
          dump_flight_recorder(std::string(1 + 20000 * t, 'x'));
        });
      }
      for (std::thread& d : dumpers) d.join();
      try {
        analyze_flight_records(temp.path());
      } catch (const Error& e) {
        problem = "round " + std::to_string(round) + ": " + e.what();
      }
    }
    dumped = true;
  });
  enable_flight_recorder(0);
  EXPECT_EQ(problem, "");
  EXPECT_EQ(detail::list_directory(temp.path()).size(), 1u) << "a temporary was left beside the dump";
}

// DATAPAR_DISTRIBUTED_DEBUG=DETAIL: each mismatch fails on both ranks at once (not after the
// timeout), naming both calls.
void expect_detail_error(const std::function<void(ProcessGroup&)>& fault, const std::string& rank1_call) {
  check_collectives(true);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  testing::run_gloo_ranks_with_options(
      2, [](int) { return GlooOptions{"127.0.0.1", 20s, false}; },
      [&](int rank, std::shared_ptr<ProcessGroup> group) {
        group->all_reduce(at::ones({8}))->wait();
        try {
          if (rank == 1) {
            fault(*group);
          } else {
            group->all_reduce(at::ones({8}))->wait();
          }
        } catch (const InvalidArgumentError& e) {
          errors[rank] = e.what();
        }
      });
  check_collectives(false);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "not at once: the group's timeout is 20 s";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(errors[rank].find("rank 0 called all_reduce(sum) on float32[8]; rank 1 called " + rank1_call),
              std::string::npos) << "rank " << rank << ": " << errors[rank];
  }
}

TEST(CheckedCollectives, AnotherOperationFailsAtOnceNamingBothCalls) {
  expect_detail_error(
      [](ProcessGroup& g) {
        std::vector<at::Tensor> out{at::empty({8}), at::empty({8})};
        g.all_gather(out, at::ones({8}))->wait();
      },
      "all_gather on float32[8]");
}

TEST(CheckedCollectives, AnotherSizeFailsAtOnceNamingBothCalls) {
  expect_detail_error([](ProcessGroup& g) { g.all_reduce(at::ones({16}))->wait(); }, "all_reduce(sum) on float32[16]");
}

TEST(CheckedCollectives, AnotherDtypeFailsAtOnceNamingBothCalls) {
  expect_detail_error([](ProcessGroup& g) { g.all_reduce(at::ones({8}, at::kInt))->wait(); },
                      "all_reduce(sum) on int32[8]");
}

// The crash of issue 49: rank 0 counted its test set with an all_reduce while rank 1 went on
// into DDP's next step, whose backward all-reduces a bucket: the bytes crossed, and a rank
// read them as its own (once as bucket metadata: vector::_M_range_check). Under DETAIL it is
// this error, on both ranks, before any byte moves.
TEST(CheckedCollectives, EvaluationOnOneRankBesideDdpsForwardIsNamedInsteadOfACrash) {
  check_collectives(true);
  std::vector<std::string> errors(2);
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::manual_seed(0);
    DistributedDataParallel ddp(std::make_shared<testing::ProbeNetImpl>(), group);
    try {
      if (rank == 0) group->all_reduce(at::zeros({2}, at::kDouble))->wait();  // test counts
      ddp.forward(at::randn({4, 20}), true).sum().backward();
    } catch (const InvalidArgumentError& e) {
      errors[rank] = e.what();
    }
  }, /*shared_memory=*/true);
  check_collectives(false);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(errors[rank].find("rank 0 called all_reduce(sum) on float64[2]; rank 1 called all_reduce(sum) on float32["),
              std::string::npos) << "rank " << rank << ": " << errors[rank];
  }
}

}  // namespace
}  // namespace datapar
