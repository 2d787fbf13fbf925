#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "datapar/error.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

uint16_t free_port() {
  TcpStore probe({"127.0.0.1", 0, true, "", 5s});
  return probe.port();
}

std::optional<std::string> no_env(const std::string&) { return std::nullopt; }

// Runs fn(rank, group) on `size` threads, each a rank of one Gloo group over loopback.
void spawn(int size, const std::function<void(int, ProcessGroup&)>& fn) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Rendezvous rdzv = rendezvous(url, rank, size, 30s, no_env);
        auto group = new_gloo_process_group(rdzv.store, rank, size, {"127.0.0.1", 30s});
        fn(rank, *group);
        group->barrier()->wait();  // keep rank 0's store up until everyone is done
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooProcessGroup, AllReduceSumsRankIdsAtEveryWorldSize) {
  for (int n = 1; n <= 4; ++n) {
    spawn(n, [n](int rank, ProcessGroup& group) {
      EXPECT_EQ(group.backend(), "gloo");
      EXPECT_EQ(group.size(), n);
      for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kHalf, at::kBFloat16}) {
        at::Tensor t = at::full({7}, rank, at::TensorOptions().dtype(dtype));
        group.all_reduce(t)->wait();
        EXPECT_TRUE(at::equal(t, at::full({7}, n * (n - 1) / 2, at::TensorOptions().dtype(dtype))))
            << dtype << " at world size " << n << ": " << t;
      }
    });
  }
}

TEST(GlooProcessGroup, EveryReduceOp) {
  spawn(3, [](int rank, ProcessGroup& group) {
    auto value = [&](ReduceOp op) {
      at::Tensor t = at::full({3}, rank + 1, at::kDouble);
      group.all_reduce(t, op)->wait();
      return t[0].item<double>();
    };
    EXPECT_EQ(value(ReduceOp::kSum), 6.0);
    EXPECT_EQ(value(ReduceOp::kAvg), 2.0);
    EXPECT_EQ(value(ReduceOp::kMin), 1.0);
    EXPECT_EQ(value(ReduceOp::kMax), 3.0);
    EXPECT_EQ(value(ReduceOp::kProduct), 6.0);
  });
}

TEST(GlooProcessGroup, NonContiguousTensorsAndBroadcast) {
  spawn(2, [](int rank, ProcessGroup& group) {
    at::Tensor base = at::full({4, 6}, rank + 1, at::kFloat);
    at::Tensor view = base.t();  // non-contiguous
    group.all_reduce(view)->wait();
    EXPECT_TRUE(at::equal(base, at::full({4, 6}, 3.0f)));
    at::Tensor b = rank == 1 ? at::arange(10, at::kLong) : at::zeros({10}, at::kLong);
    group.broadcast(b, /*root=*/1)->wait();
    EXPECT_TRUE(at::equal(b, at::arange(10, at::kLong)));
  });
}

TEST(GlooProcessGroup, SeveralOperationsInFlight) {
  spawn(3, [](int rank, ProcessGroup& group) {
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 5; ++i) {
      tensors.push_back(at::full({1000}, rank * 10 + i, at::kFloat));
      works.push_back(group.all_reduce(tensors.back()));
    }
    for (int i = 4; i >= 0; --i) works[i]->wait();  // any order
    for (int i = 0; i < 5; ++i) EXPECT_EQ(tensors[i][0].item<float>(), 30.0f + 3 * i);
    EXPECT_TRUE(works[0]->is_completed());
  });
}

TEST(GlooProcessGroup, RejectsWhatItCannotDo) {
  spawn(1, [](int, ProcessGroup& group) {
    at::Tensor ints = at::ones({2}, at::kInt);
    EXPECT_THROW_MSG(group.all_reduce(ints, ReduceOp::kAvg), InvalidArgumentError, "avg needs a floating-point");
    EXPECT_THROW_MSG(group.broadcast(ints, 1), InvalidArgumentError, "root 1 is outside [0, 1)");
    at::Tensor bools = at::ones({2}, at::kBool);
    EXPECT_THROW_MSG(group.all_reduce(bools)->wait(), InvalidArgumentError, "not supported");
  });
  EXPECT_THROW_MSG(new_gloo_process_group(std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, "", 5s}), 2, 2),
                   InvalidArgumentError, "rank 2 is outside [0, 2)");
}

// A peer killed mid-job makes the others fail within the timeout, naming the operation.
TEST(GlooProcessGroup, AKilledPeerFailsTheOthersInsteadOfHanging) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        Rendezvous rdzv = rendezvous(url, rank, 3, 30s, no_env);
        auto group = new_gloo_process_group(rdzv.store, rank, 3, {"127.0.0.1", 20s});
        at::Tensor t = at::ones({16});
        group->all_reduce(t)->wait();  // all three together once
        if (rank == 2) ::raise(SIGKILL);
        try {
          group->all_reduce(t)->wait();
          code = 10;  // must not succeed without rank 2
        } catch (const CommError& e) {
          code = std::string(e.what()).find("all_reduce(sum) on rank") != std::string::npos ? 0 : 11;
        } catch (const TimeoutError&) {
          code = 12;
        }
      } catch (...) {
        code = 13;
      }
      std::_Exit(code);
    }
    pids.push_back(pid);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> status(3);
  for (int i = 0; i < 3; ++i) ::waitpid(pids[i], &status[i], 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 25s);
  EXPECT_TRUE(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(WIFEXITED(status[i])) << "rank " << i;
    EXPECT_EQ(WEXITSTATUS(status[i]), 0) << "rank " << i << " (10: succeeded, 11: unclear message, 12: timeout, 13: other)";
  }
}

}  // namespace
}  // namespace datapar
