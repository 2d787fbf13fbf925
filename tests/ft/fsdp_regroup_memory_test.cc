// Fault-tolerant FSDP's memory when the membership changes (issue 47): a job of three members
// (processes) trains a model of 8 units (Linear(768, 768): 2.25 MiB of float32 each) with SGD
// and momentum; one is killed at step 3, and the two others regroup from the three's layout
// into theirs. Each member counts the bytes of its CPU tensors (testing/counting_cpu_allocator.h)
// at the peak of every train_step call (of a call that joined an epoch, up to its training:
// the regroup itself). A regroup peaks at most one unit whole (its parameters and momentum)
// above the highest peak of an ordinary step: the state is
// re-sharded unit by unit (Note [Re-sharding unit by unit] in src/ft/fsdp_two_copies.cc), never
// put together whole (as it was: 8 units' parameters and momentum on every member at once).
// The same under HSDP (four members in two replica groups of two): member 2 killed takes its
// group out, a replacement brings it back, and it and member 3 take their shards from the
// other group (Note [Shards from the matching rank] in src/ft/fsdp_replicas.cc): the calls
// that regrouped, and the replacement's first, peak at most one unit above a step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "datapar/fsdp/fully_shard.h"
#include "datapar/ft/fault_tolerant_fsdp.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/counting_cpu_allocator.h"
#include "testing/ft_job.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar::ft {
namespace fsdp_regroup_memory_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "ft-fsdp-memory-test";
constexpr int kUnits = 8;
constexpr int64_t kWidth = 768;
constexpr int64_t kBatch = 12;
constexpr int64_t kSteps = 8;
constexpr int64_t kDiesAt = 3;
constexpr int64_t kUnitBytes = kWidth * (kWidth + 1) * static_cast<int64_t>(sizeof(float));  // weight and bias

// kHsdp: four members in replica groups of two.
enum class Layout { kFsdp, kHsdp };

int members_of(Layout layout) { return layout == Layout::kHsdp ? 4 : 3; }

FtOptions options(Layout layout) {
  FtOptions o = testing::three_member_options();
  if (layout == Layout::kHsdp) {
    o.expected_members = 4;
    o.replica_group_size = 2;
  }
  return o;
}

std::shared_ptr<TcpStore> connect(uint16_t port) { return testing::connect_member(port, kToken); }

// Eight units, nothing of the root's.
struct WideNetImpl : torch::nn::Module {
  WideNetImpl() {
    torch::manual_seed(7);  // the same initial parameters in every process
    blocks = register_module("blocks", torch::nn::Sequential());
    for (int i = 0; i < kUnits; ++i) {
      blocks->push_back(torch::nn::Linear(kWidth, kWidth));
      blocks->push_back(torch::nn::Tanh());
    }
  }
  at::Tensor forward(const at::Tensor& x) { return blocks->forward(x); }
  torch::nn::Sequential blocks{nullptr};
};

// A member: logs each train_step call's peak of CPU tensor bytes, as "start", "step" or
// "regroup" (the call joined a new membership after the first); member 2 dies at kDiesAt.
// Under kHsdp it sits in the replica slot of member `seat`.
int member(uint16_t port, const std::string& dir, int index, int seat, Layout layout) {
  static testing::CountingCpuAllocator counting;  // outlives every tensor of the process
  counting.install();
  at::set_num_threads(1);
  const ReplicaSlot slot = layout == Layout::kHsdp ? ReplicaSlot{seat / 2, seat % 2} : ReplicaSlot{};
  ElasticGroup elastic(
      connect(port), "job", options(layout),
      [](std::shared_ptr<Store> store, int rank, int size) {
        return new_gloo_process_group(std::move(store), rank, size, {"127.0.0.1", 5s, false});
      },
      slot);
  FaultTolerantFsdp<WideNetImpl> trainer(
      [] { return std::make_shared<WideNetImpl>(); },
      [](WideNetImpl& net, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& o) {
        fully_shard_each<torch::nn::LinearImpl>(net, group, o);
      },
      [](std::vector<at::Tensor> params) {
        return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01).momentum(0.9));
      },
      elastic, members_of(layout));
  at::Generator generator = at::detail::createCPUGenerator(5);
  const at::Tensor x = at::randn({kBatch, kWidth}, generator);
  std::ofstream log(dir + "/peaks-" + std::to_string(index) + ".log");
  while (trainer.step() < kSteps) {
    if (index == 2 && trainer.step() == kDiesAt) ::raise(SIGKILL);
    const int64_t joined = trainer.epochs_joined();
    counting.reset_peak();
    int64_t joining = 0;  // the peak up to the step's training: of joining the epoch and taking the state
    trainer.train_step(
        [&](FullyShardedDataParallel<WideNetImpl>& fsdp, const Slice& slice) -> int64_t {
          const int64_t begin = slice.begin(kBatch), end = slice.end(kBatch);
          fsdp.forward(x.narrow(0, begin, end - begin)).pow(2).mean().backward();
          return end - begin;
        },
        [&](int, int) { joining = counting.peak(); });
    const char* kind = joined == 0 ? "start" : (trainer.epochs_joined() != joined ? "regroup" : "step");
    log << kind << ' ' << (kind[1] == 't' && kind[2] == 'e' ? counting.peak() : joining) << std::endl;
    std::this_thread::sleep_for(50ms);  // time for the decider to see the death between steps
  }
  trainer.finish();
  return 0;
}

// Runs the job of `layout`; under kHsdp a replacement for member 2 (member 4) comes once it
// died. Checks the peaks of the members that regrouped (the replacement's first call too).
void regroup_within_one_unit(Layout layout) {
  testing::TempDir dir;
  const auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, kToken, 10s, ""});
  const uint16_t port = server->port();
  const int n = members_of(layout);
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    pids.push_back(datapar::detail::fork_child([&, i] { return member(port, dir.path(), i, i, layout); }, "member"));
  }
  const Decider decider(connect(port), "job", options(layout));
  const auto deadline = Clock::now() + 90s;
  EXPECT_EQ(datapar::detail::wait_child(pids[2], deadline).signal, SIGKILL);
  std::vector<int> regrouping = {0, 1};
  if (layout == Layout::kHsdp) {
    pids[2] = datapar::detail::fork_child([&] { return member(port, dir.path(), 4, 2, layout); }, "replacement");
    regrouping = {0, 1, 3, 4};
  } else {
    pids.pop_back();
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_EQ(datapar::detail::wait_child(pids[i], deadline).exit_code, 0) << "member " << i;
  }
  const double mib = 1 << 20;
  for (const int i : regrouping) {
    const std::string log = testing::read_text(dir.path() + "/peaks-" + std::to_string(i) + ".log");
    std::istringstream lines(log);
    int64_t step = 0, regroup = 0;
    for (std::string kind; lines >> kind;) {
      int64_t peak = 0;
      lines >> peak;
      if (kind == "step") step = std::max(step, peak);
      // The replacement's first call takes its shards from the others.
      if (kind == "regroup" || (i == 4 && kind == "start")) regroup = std::max(regroup, peak);
    }
    std::printf("%s member %d: peak of an ordinary step %.2f MiB, of a regroup %.2f MiB; one unit and its momentum "
                "%.2f MiB\n", layout == Layout::kHsdp ? "hsdp" : "fsdp", i, step / mib, regroup / mib,
                2 * kUnitBytes / mib);
    ASSERT_GT(step, 0) << log;
    ASSERT_GT(regroup, 0) << "member " << i << " never regrouped:\n" << log;
    EXPECT_LE(regroup, step + 2 * kUnitBytes)
        << "member " << i << ": a regroup peaked at " << regroup / mib << " MiB, an ordinary step at " << step / mib
        << " MiB, one unit with its momentum is " << 2 * kUnitBytes / mib << " MiB\n" << log;
  }
}

TEST(FaultTolerantFsdpMemory, ARegroupHoldsAtMostOneUnitMoreThanAStep) { regroup_within_one_unit(Layout::kFsdp); }

TEST(FaultTolerantFsdpMemory, AnHsdpGroupLeavingAndComingBackHoldsAtMostOneUnitMoreThanAStep) {
  regroup_within_one_unit(Layout::kHsdp);
}

}  // namespace fsdp_regroup_memory_test
}  // namespace datapar::ft
