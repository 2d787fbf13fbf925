// The shared-memory collectives (src/process_group/shm) under a Gloo group whose members
// share this machine: results, the choice between shared memory and TCP, and failures.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/gloo.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/tcp_store.h"
#include "collectives/shm_collectives.h"
#include "testing/conformance.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, group) on `size` threads, each a rank of one Gloo group made with
// options(rank), then (`meet_at_end`) a barrier.
void run_ranks(int size, const std::function<GlooOptions(int)>& options,
               const std::function<void(int, ProcessGroup&)>& fn, bool meet_at_end = true) {
  testing::run_gloo_ranks_with_options(
      size, options, [&](int rank, const std::shared_ptr<ProcessGroup>& group) { fn(rank, *group); }, meet_at_end);
}

GlooOptions local(int) { return {"127.0.0.1", 30s}; }

bool through_shared_memory(const Work& work) { return work.what().find("shared memory") != std::string::npos; }

// Sizes past one slot (2 MiB at these world sizes) take several rounds.
constexpr int64_t kLarge = 700'000;

// The conformance suite (testing/conformance.h) through the shared-memory layer, whose
// collectives say so in their Work.
TEST(SharedMemory, PassesTheConformanceSuite) {
  for (int n : {2, 3}) {
    run_ranks(n, local, [](int, ProcessGroup& group) {
      at::Tensor t = at::ones({5});
      auto work = group.all_reduce(t);
      work->wait();
      EXPECT_TRUE(through_shared_memory(*work)) << work->what();
      testing::expect_conformance(group);
    });
  }
}

TEST(SharedMemory, AllReducesPastASlotTakeSeveralRounds) {
  for (int n : {2, 3}) {
    run_ranks(n, local, [n](int rank, ProcessGroup& group) {
      // Several rounds, values that differ per element and rank, averaged.
      at::Tensor big = at::arange(kLarge, at::kDouble) * (rank + 1);
      group.all_reduce(big, ReduceOp::kAvg)->wait();
      EXPECT_TRUE(at::allclose(big, at::arange(kLarge, at::kDouble) * ((n + 1) / 2.0)));
      // Not contiguous: reduced through a copy, written back in place.
      at::Tensor wide = at::ones({4, 6}, at::kFloat).t();
      group.all_reduce(wide)->wait();
      EXPECT_TRUE(at::equal(wide, at::full({6, 4}, n, at::kFloat)));
    });
  }
}

TEST(SharedMemory, EveryMemberGetsTheSameBits) {
  run_ranks(3, local, [](int rank, ProcessGroup& group) {
    // The ranks are threads: each draws from a generator of its own, not the global one.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(rank));
    at::Tensor t = at::randn({kLarge}, gen);
    group.all_reduce(t)->wait();
    std::vector<at::Tensor> all = {at::empty_like(t), at::empty_like(t), at::empty_like(t)};
    group.all_gather(all, t)->wait();
    EXPECT_TRUE(at::equal(all[0], all[1]) && at::equal(all[1], all[2]));
  });
}

TEST(SharedMemory, ReduceScatterAllGatherAndBroadcastMoveEveryByte) {
  for (int n : {2, 3}) {
    run_ranks(n, local, [n](int rank, ProcessGroup& group) {
      // reduce_scatter: block d of rank q holds (q + 1) * (arange + d); rank r receives block r summed.
      std::vector<at::Tensor> inputs;
      for (int d = 0; d < n; ++d) inputs.push_back((at::arange(kLarge, at::kLong) + d) * (rank + 1));
      at::Tensor out = at::empty({kLarge}, at::kLong);
      auto work = group.reduce_scatter(out, inputs);
      work->wait();
      EXPECT_TRUE(through_shared_memory(*work));
      EXPECT_TRUE(at::equal(out, (at::arange(kLarge, at::kLong) + rank) * (n * (n + 1) / 2)));
      at::Tensor mean = at::empty({3}, at::kFloat);
      std::vector<at::Tensor> small;
      for (int d = 0; d < n; ++d) small.push_back(at::full({3}, static_cast<float>(rank + d)));
      group.reduce_scatter(mean, small, ReduceOp::kAvg)->wait();
      EXPECT_TRUE(at::allclose(mean, at::full({3}, (n - 1) / 2.0 + rank)));

      // all_gather, several rounds, of a non-contiguous input.
      at::Tensor mine = (at::arange(2 * kLarge, at::kInt) + rank).view({kLarge, 2}).t();
      std::vector<at::Tensor> gathered;
      for (int r = 0; r < n; ++r) gathered.push_back(at::empty({2, kLarge}, at::kInt));
      group.all_gather(gathered, mine)->wait();
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(at::equal(gathered[r], (at::arange(2 * kLarge, at::kInt) + r).view({kLarge, 2}).t())) << r;
      }

      // Outputs that are not contiguous are filled through a copy.
      std::vector<at::Tensor> strided;
      for (int r = 0; r < n; ++r) strided.push_back(at::empty({3, 2}, at::kFloat).t());
      group.all_gather(strided, at::full({2, 3}, static_cast<float>(rank)))->wait();
      for (int r = 0; r < n; ++r) EXPECT_TRUE(at::equal(strided[r], at::full({2, 3}, static_cast<float>(r)))) << r;

      // broadcast from the last rank, several rounds; bytes of any dtype.
      at::Tensor b = rank == n - 1 ? at::arange(kLarge, at::kDouble) : at::zeros({kLarge}, at::kDouble);
      group.broadcast(b, n - 1)->wait();
      EXPECT_TRUE(at::equal(b, at::arange(kLarge, at::kDouble)));
      at::Tensor flags = at::full({9}, rank == 0, at::kBool);
      group.broadcast(flags, 0)->wait();
      EXPECT_TRUE(flags.all().item<bool>());

      // Coalesced: dtypes mixed, each travels as one buffer.
      std::vector<at::Tensor> mixed = {at::full({2}, rank, at::kFloat), at::full({3}, rank, at::kLong),
                                       at::full({4}, rank, at::kFloat)};
      group.all_reduce_coalesced(mixed)->wait();
      for (const at::Tensor& t : mixed) EXPECT_EQ(t.sum().item<double>(), t.numel() * n * (n - 1) / 2.0);
      std::vector<at::Tensor> params = {at::full({2}, rank, at::kFloat), at::full({2, 2}, rank, at::kDouble)};
      group.broadcast_coalesced(params, 1)->wait();
      for (const at::Tensor& t : params) EXPECT_TRUE(at::equal(t, at::ones_like(t)));

      // What shared memory does not do goes through TCP, in order with the rest.
      at::Tensor r = at::full({4}, rank, at::kFloat);
      group.reduce(r, 0)->wait();
      if (rank == 0) EXPECT_TRUE(at::equal(r, at::full({4}, n * (n - 1) / 2, at::kFloat)));
      at::Tensor sent = at::arange(n, at::kFloat) + 10 * rank;
      at::Tensor received = at::empty({n}, at::kFloat);
      group.all_to_all_single(received, sent)->wait();
      EXPECT_TRUE(at::equal(received, at::arange(n, at::kFloat) * 10 + rank));
      group.barrier()->wait();
    });
  }
}

TEST(SharedMemory, AnyMemberCanTurnItOffForAll) {
  run_ranks(
      2, [](int rank) { return GlooOptions{"127.0.0.1", 30s, /*shared_memory=*/rank == 0}; },
      [](int rank, ProcessGroup& group) {
        at::Tensor t = at::full({3}, rank + 1, at::kFloat);
        auto work = group.all_reduce(t);
        work->wait();
        EXPECT_FALSE(through_shared_memory(*work)) << work->what();
        EXPECT_TRUE(at::equal(t, at::full({3}, 3, at::kFloat)));
      });
}

// The region has a name only while the group is made (a crash leaves nothing behind).
TEST(SharedMemory, NothingIsLeftInDevShm) {
  const std::string prefix = "datapar-shm-" + std::to_string(::getpid()) + "-";
  const auto ours = [&] {
    int found = 0;
    if (DIR* dir = ::opendir("/dev/shm")) {
      while (const dirent* entry = ::readdir(dir)) found += std::string(entry->d_name).rfind(prefix, 0) == 0;
      ::closedir(dir);
    }
    return found;
  };
  run_ranks(2, local, [&](int rank, ProcessGroup& group) {
    at::Tensor t = at::ones({3});
    group.all_reduce(t)->wait();
    EXPECT_EQ(ours(), 0);
  });
}

TEST(SharedMemory, AMemberThatNeverArrivesIsNamedAtTheTimeout) {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  run_ranks(
      2, [](int) { return GlooOptions{"127.0.0.1", 1s}; },
      [&](int rank, ProcessGroup& group) {
        if (rank == 1) {
          done.wait();  // never joins the all_reduce
          return;
        }
        at::Tensor t = at::ones({3});
        const auto start = std::chrono::steady_clock::now();
        EXPECT_THROW_MSG(group.all_reduce(t)->wait(), TimeoutError, "rank 1 did not arrive");
        EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
        EXPECT_THROW_MSG(group.all_reduce(t)->wait(), CommError, "unusable since an earlier collective failed");
        // Those through the transport too: they would pair with the wrong ones (or wait the
        // whole timeout) otherwise.
        EXPECT_THROW_MSG(group.reduce(t, 0)->wait(), CommError, "unusable since an earlier collective failed");
        rank0_done.set_value();
      },
      /*meet_at_end=*/false);
}

// Members that are not all on one machine (here: one says it is elsewhere) get no region,
// and nothing is made.
class ScriptedExchange final : public detail::shm::Exchange {
 public:
  explicit ScriptedExchange(std::string other) : other_(std::move(other)) {}
  std::vector<std::string> all_gather(const std::string& mine, detail::shm::Clock::time_point) override {
    ++rounds;
    return {mine, other_};
  }
  int rounds = 0;

 private:
  std::string other_;
};

TEST(ShmCollectives, MembersOnAnotherMachineGetNone) {
  ScriptedExchange elsewhere("4242 another-boot 1:2 pid:[1] net:[2]");
  EXPECT_EQ(detail::shm::ShmCollectives::create(elsewhere, 0, 2, true, 5s), nullptr);
  EXPECT_EQ(elsewhere.rounds, 1);  // decided from the first round: no region was offered
  ScriptedExchange unwilling("4242 ");
  EXPECT_EQ(detail::shm::ShmCollectives::create(unwilling, 0, 2, true, 5s), nullptr);
}

}  // namespace
}  // namespace datapar
