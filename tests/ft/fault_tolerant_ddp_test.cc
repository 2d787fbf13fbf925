// Fault-tolerant DDP (datapar/ft/fault_tolerant_ddp.h, issue 31) with its members as
// processes over loopback and the store and decider in the test: a job of three trains 24
// steps (three epochs of 8 global batches of 12 samples, SGD with momentum); one member is
// killed with SIGKILL at a step that depends on the seed and a replacement is started.
// The final model must equal one process's training on the whole global batches within
// 1e-5 relative, on every member, the replacement included; every sample of every epoch
// must have been trained once, in a committed step.
#include "datapar/ft/fault_tolerant_ddp.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

#include "child_process.h"
#include "datapar/amp/grad_scaler.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/ft/fault_tolerant_fsdp.h"
#include "datapar/fsdp/fully_shard.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/state_dict.h"
#include "optim/state_key.h"
#include "file_system.h"
#include "testing/ft_job.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar::ft {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "ft-ddp-test";
constexpr int64_t kSamples = 96;
constexpr int64_t kBatch = 12;
constexpr int64_t kBatchesPerEpoch = kSamples / kBatch;
constexpr int64_t kSteps = 3 * kBatchesPerEpoch;
constexpr int kSlices = 3;  // the job's full size: each global batch in three, whoever is alive

// How the members keep the model and the optimizer state. kHsdp: four members in two
// replica groups of two, each group sharding the model over itself.
enum class Mode { kDdp, kZero, kFsdp, kHsdp };

int members_of(Mode mode) { return mode == Mode::kHsdp ? 4 : 3; }

FtOptions options(Mode mode = Mode::kDdp) {
  FtOptions o = testing::three_member_options();
  if (mode == Mode::kHsdp) {
    o.expected_members = 4;
    o.replica_group_size = 2;
  }
  return o;
}

std::shared_ptr<TcpStore> connect(uint16_t port) { return testing::connect_member(port, kToken); }

// The members' model and data (testing/ft_job.h).
struct Net : testing::FtNet {};
struct Data : testing::FtData {
  Data() : testing::FtData(kSamples) {}
};

// The samples of global batch `step`: defined by the step alone, whoever is alive.
at::Tensor batch_rows(int64_t step) {
  at::Generator g = at::detail::createCPUGenerator(1000 + step / kBatchesPerEpoch);
  const at::Tensor order = at::randperm(kSamples, g, at::kLong);
  return order.narrow(0, (step % kBatchesPerEpoch) * kBatch, kBatch);
}

// Rank `rank` of `size`'s share of them.
at::Tensor share(const at::Tensor& rows, int rank, int size) {
  const int64_t begin = kBatch * rank / size, end = kBatch * (rank + 1) / size;
  return rows.narrow(0, begin, end - begin);
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.05).momentum(0.9); }

torch::optim::SGD make_sgd(Net& net) { return torch::optim::SGD(net.parameters(), sgd_options()); }

// Float16 training's gradient scaler (scaled: the losses x a scale, unscaled before the
// step), its scale growing every 3 steps without an overflow, and the overflows injected:
// at these steps the second slice's gradient has an inf in one element of the head's bias,
// which under FSDP only one member's shard (and its keeper's) holds. The step is skipped
// and the scale halved on every member, as in one process.
amp::GradScalerOptions scaler_options() {
  amp::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  return o;
}
bool overflows(int64_t step) { return step == 6 || step == 14; }
void inject_overflow(Net& net) { net.head->bias.mutable_grad().narrow(0, 1, 1).fill_(INFINITY); }

// The scaler's state as a line, to compare members with one process.
std::string scale_line(const amp::GradScaler& scaler) {
  return std::to_string(scaler.get_scale()) + " " + std::to_string(scaler.growth_tracker());
}

// The momentum buffers of `optimizer` over `net`'s parameters, by parameter index.
StateDict momentum_of(const torch::optim::Optimizer& optimizer, Net& net) {
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  StateDict out;
  const std::vector<at::Tensor> params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = optimizer.state().find(datapar::detail::optimizer_state_key<StateMap>(params[i]));
    if (it == optimizer.state().end()) continue;
    out.insert(std::to_string(i), static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer());
  }
  return out;
}

// The momentum buffers of a full optimizer state (optim/optimizer_state.h), by parameter
// index.
StateDict momentum_of(const OptimizerState& optimizer) {
  StateDict out;
  for (const auto& param : optimizer.at("state").toGenericDict()) {
    out.insert(std::to_string(param.key().toInt()), param.value().toGenericDict().at("momentum_buffer").toTensor());
  }
  return out;
}

// Trains until step kSteps, dying at `die_at` (if >= 0), pausing `pause` after each step;
// writes each committed step's samples to `log`.
// train(wrapper, slice) trains each of this rank's slices of the job's full size (under
// FSDP a shadow pass too, which is not logged).
template <typename Wrapper, typename Trainer>
void train_steps(Trainer& trainer, const Data& data, std::ofstream& log, int64_t die_at,
                 std::chrono::milliseconds pause, amp::GradScaler* scaler) {
  while (trainer.step() < kSteps) {
    if (trainer.step() == die_at) ::raise(SIGKILL);
    int64_t step = -1;
    std::vector<at::Tensor> mine;
    const bool committed = trainer.train_step([&](Wrapper& wrapper, const Slice& slice) -> int64_t {
      step = trainer.step();  // after a join, the step this member took from the others
      const at::Tensor rows = share(batch_rows(step), slice.index, slice.count);
      const at::Tensor loss =
          torch::nn::functional::mse_loss(wrapper.forward(data.x.index_select(0, rows)), data.y.index_select(0, rows));
      (scaler ? scaler->scale(loss) : loss).backward();
      if (scaler && overflows(step) && slice.index == 1 && !slice.shadow) {
        if constexpr (std::is_same_v<Wrapper, Net>) {
          inject_overflow(wrapper);
        } else {
          inject_overflow(*wrapper.module());
        }
      }
      if (!slice.shadow) mine.push_back(rows);
      return rows.numel();
    });
    if (committed) {
      log << step;
      for (const at::Tensor& rows : mine) {
        for (int64_t i = 0; i < rows.numel(); ++i) log << ' ' << rows[i].item<int64_t>();
      }
      log << std::endl;
    }
    std::this_thread::sleep_for(pause);  // time for a member to (re)join while the job runs
  }
}

// A member's life (train_steps); then it writes its final parameters to final-<index>.pt,
// and the last epoch's rank 0 the optimizer's momentum to momentum.pt. Under kZero,
// state-<index>.txt says how many bytes of the optimizer state this member keeps, and of
// how many. Under kHsdp it sits in the replica slot of member `seat` (its own index, or
// the one it replaces).
int member_life(uint16_t port, const std::string& dir, int index, int seat, int64_t die_at, bool shared_memory,
                std::chrono::milliseconds pause, Mode mode, bool fp16) {
  std::ofstream log(dir + "/samples-" + std::to_string(index) + ".log");
  const Data data;
  std::optional<amp::GradScaler> scaler;
  if (fp16) scaler.emplace(scaler_options());
  const auto write_scale = [&] {
    if (scaler) std::ofstream(dir + "/scale-" + std::to_string(index) + ".txt") << scale_line(*scaler);
  };
  const ReplicaSlot slot = mode == Mode::kHsdp ? ReplicaSlot{seat / 2, seat % 2} : ReplicaSlot{};
  ElasticGroup elastic(
      connect(port), "job", options(mode),
      [shared_memory](std::shared_ptr<Store> store, int rank, int size) {
        return new_gloo_process_group(std::move(store), rank, size, {"127.0.0.1", 5s, shared_memory});
      },
      slot);
  const auto make_optimizer = [](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(params, sgd_options());
  };
  if (mode == Mode::kFsdp || mode == Mode::kHsdp) {
    FaultTolerantFsdp<Net> trainer([] { return std::make_shared<Net>(); },
                                   [](Net& net, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& o) {
                                     fully_shard_each<torch::nn::LinearImpl>(net, group, o);
                                   },
                                   make_optimizer, elastic, members_of(mode));
    if (scaler) trainer.use_grad_scaler(&*scaler);
    train_steps<FullyShardedDataParallel<Net>>(trainer, data, log, die_at, pause, scaler ? &*scaler : nullptr);
    trainer.finish([&](int rank, int) {
      save_state_dict(trainer.fsdp().full_state_dict(), dir + "/final-" + std::to_string(index) + ".pt");
      const OptimizerState whole = trainer.fsdp().full_optimizer_state(trainer.optimizer());
      if (rank == 0) save_state_dict(momentum_of(whole), dir + "/momentum.pt");
    });
    log << "epochs " << trainer.epochs_joined() << std::endl;
    write_scale();
    return 0;
  }
  auto net = std::make_shared<Net>();
  torch::optim::SGD sgd = make_sgd(*net);
  const bool sharded = mode == Mode::kZero;
  ZeroOptions two_copies;
  two_copies.copies = 2;
  ZeroRedundancyOptimizer zero(net->parameters(), make_optimizer, two_copies);
  std::optional<FaultTolerantDdp<Net>> trainer_storage;
  if (sharded) {
    trainer_storage.emplace(net, zero, elastic, kSlices);
  } else {
    trainer_storage.emplace(net, sgd, elastic, kSlices);
  }
  FaultTolerantDdp<Net>& trainer = *trainer_storage;
  if (scaler) trainer.use_grad_scaler(&*scaler);
  train_steps<Net>(trainer, data, log, die_at, pause, scaler ? &*scaler : nullptr);
  trainer.finish([&](int rank, int) {
    std::unique_ptr<torch::optim::Optimizer> whole = sharded ? zero.consolidate(0) : nullptr;
    if (rank == 0) save_state_dict(momentum_of(whole ? *whole : sgd, *net), dir + "/momentum.pt");
  });
  log << "epochs " << trainer.epochs_joined() << std::endl;
  if (sharded) {
    std::ofstream(dir + "/state-" + std::to_string(index) + ".txt") << zero.state_bytes() << ' ' << 4 * [&] {
      int64_t n = 0;
      for (const at::Tensor& p : net->parameters()) n += p.numel();
      return n;
    }();
  }
  save_state_dict(state_dict(*net), dir + "/final-" + std::to_string(index) + ".pt");
  write_scale();
  return 0;
}

// member_life; a MembershipError (the job cannot go on) is written to error-<index>.txt,
// and the member exits with 3.
int member_main(uint16_t port, const std::string& dir, int index, int64_t die_at, bool shared_memory,
                std::chrono::milliseconds pause, Mode mode, int seat = -1, bool fp16 = false) {
  at::set_num_threads(1);
  try {
    return member_life(port, dir, index, seat < 0 ? index : seat, die_at, shared_memory, pause, mode, fp16);
  } catch (const MembershipError& e) {
    std::ofstream(dir + "/error-" + std::to_string(index) + ".txt") << e.what();
    return 3;
  }
}

// One process training on the whole global batches: what every member must end with.
// Trained in a child of its own, as the members are: this process forks the next job's
// members, and a process whose BLAS or OpenMP threads have started must not fork.
StateDict one_process(const std::string& dir, bool fp16) {
  const pid_t pid = datapar::detail::fork_child(
      [&] {
        at::set_num_threads(1);
        const Data data;
        auto net = std::make_shared<Net>();
        torch::optim::SGD sgd = make_sgd(*net);
        amp::GradScaler scaler(scaler_options());
        for (int64_t step = 0; step < kSteps; ++step) {
          const at::Tensor rows = batch_rows(step);
          sgd.zero_grad();
          const at::Tensor loss =
              torch::nn::functional::mse_loss(net->forward(data.x.index_select(0, rows)), data.y.index_select(0, rows));
          if (!fp16) {
            loss.backward();
            sgd.step();
            continue;
          }
          scaler.scale(loss).backward();
          if (overflows(step)) inject_overflow(*net);
          scaler.step(sgd);
          scaler.update();
        }
        if (fp16) std::ofstream(dir + "/reference-scale.txt") << scale_line(scaler);
        save_state_dict(state_dict(*net), dir + "/reference.pt");
        save_state_dict(momentum_of(sgd, *net), dir + "/reference-momentum.pt");
        return 0;
      },
      "one process");
  EXPECT_EQ(datapar::detail::wait_child(pid, Clock::now() + 60s).exit_code, 0);
  return load_state_dict_file(dir + "/reference.pt");
}

double relative_difference(const StateDict& a, const StateDict& b) {
  double worst = 0;
  for (const auto& item : a) {
    const at::Tensor other = b[item.key()];
    const double scale = std::max(1e-12, item.value().abs().max().item<double>());
    worst = std::max(worst, (item.value() - other).abs().max().item<double>() / scale);
  }
  return worst;
}

// What happens to member `victim` of a job: nothing, SIGKILL at the start of step `at`
// (then a replacement is started), or SIGSTOP once it committed step `at` (in its pause
// after the step), SIGCONT 1.5 s later.
struct Failure {
  enum Kind { kNone, kKill, kStop } kind = kNone;
  int victim = -1;
  int64_t at = -1;
};

// Whether `path` has a line that starts with `prefix`.
bool has_line(const std::string& path, const std::string& prefix) {
  std::istringstream lines(datapar::detail::exists(path) ? testing::read_text(path) : "");
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// The steps member `index` logged as committed.
std::vector<int64_t> committed_steps(const std::string& dir, int index) {
  std::vector<int64_t> steps;
  std::istringstream lines(testing::read_text(dir + "/samples-" + std::to_string(index) + ".log"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("epochs", 0) != 0) steps.push_back(std::stoll(line.substr(0, line.find(' '))));
  }
  return steps;
}

// Runs a job of three members (four under kHsdp) with `failure`. Checks the samples, the
// final models and the optimizer's final state.
// fp16: with a gradient scaler and overflows (scaler_options()); every member ends with the
// scale of one process.
void train_three_members(Failure failure, bool shared_memory, Mode mode = Mode::kDdp, bool fp16 = false) {
  const bool sharded = mode == Mode::kZero;
  testing::TempDir dir;
  const auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, kToken, 10s, ""});
  const uint16_t port = server->port();
  const auto pause = failure.kind == Failure::kStop ? 100ms : 60ms;
  const int first_members = members_of(mode);
  std::vector<pid_t> pids;
  for (int i = 0; i < first_members; ++i) {
    const int64_t dies = failure.kind == Failure::kKill && i == failure.victim ? failure.at : -1;
    pids.push_back(datapar::detail::fork_child(
        [&, i, dies] { return member_main(port, dir.path(), i, dies, shared_memory, pause, mode, -1, fp16); },
        "member"));
  }
  const Decider decider(connect(port), "job", options(mode));
  int members = first_members;
  const auto deadline = Clock::now() + 90s;
  const size_t victim = static_cast<size_t>(failure.victim);
  if (failure.kind == Failure::kKill) {
    const datapar::detail::ChildExit died = datapar::detail::wait_child(pids[victim], deadline);
    EXPECT_EQ(died.signal, SIGKILL) << "the victim did not die as planned (exit " << died.exit_code << ")";
    if (mode == Mode::kHsdp) {
      // The outage: the other replica group trains on alone, three steps at least, before
      // the replacement comes.
      const std::string log = dir.path() + "/samples-" + std::to_string(failure.victim < 2 ? 2 : 0) + ".log";
      while (!has_line(log, std::to_string(failure.at + 3) + " ") && Clock::now() < deadline) {
        std::this_thread::sleep_for(2ms);
      }
      ASSERT_TRUE(has_line(log, std::to_string(failure.at + 3) + " "))
          << "the other replica group stopped committing steps when a member of this one died";
    }
    const int seat = failure.victim;
    pids[victim] = datapar::detail::fork_child(
        [&] { return member_main(port, dir.path(), first_members, -1, shared_memory, pause, mode, seat, fp16); },
        "replacement");
    members = first_members + 1;
  } else if (failure.kind == Failure::kStop) {
    const std::string log = dir.path() + "/samples-" + std::to_string(failure.victim) + ".log";
    while (!has_line(log, std::to_string(failure.at) + " ") && Clock::now() < deadline) {
      std::this_thread::sleep_for(2ms);
    }
    ::kill(pids[victim], SIGSTOP);
    std::this_thread::sleep_for(1500ms);  // past the eviction timeout: the others go on without it
    ::kill(pids[victim], SIGCONT);
  }
  for (int i = 0; i < first_members; ++i) {
    const datapar::detail::ChildExit exit = datapar::detail::wait_child(pids[static_cast<size_t>(i)], deadline);
    const bool replaced = failure.kind == Failure::kKill && i == failure.victim;
    const int index = replaced ? first_members : i;
    const std::string error = dir.path() + "/error-" + std::to_string(index) + ".txt";
    EXPECT_EQ(exit.exit_code, 0) << "member " << index << " (signal " << exit.signal << ")"
                                 << (datapar::detail::exists(error) ? ": " + testing::read_text(error) : "");
  }
  // Every sample of every step, exactly once, over all members' committed steps.
  std::map<int64_t, std::vector<int64_t>> trained;
  for (int i = 0; i < members; ++i) {
    std::istringstream lines(testing::read_text(dir.path() + "/samples-" + std::to_string(i) + ".log"));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("epochs", 0) == 0) continue;
      std::istringstream fields(line);
      int64_t step = 0, row = 0;
      fields >> step;
      while (fields >> row) trained[step].push_back(row);
    }
  }
  ASSERT_EQ(static_cast<int64_t>(trained.size()), kSteps);
  for (auto& [step, rows] : trained) {
    std::sort(rows.begin(), rows.end());
    const at::Tensor expected = std::get<0>(batch_rows(step).sort());
    ASSERT_EQ(static_cast<int64_t>(rows.size()), kBatch) << "step " << step;
    for (int64_t i = 0; i < kBatch; ++i) EXPECT_EQ(rows[static_cast<size_t>(i)], expected[i].item<int64_t>());
  }
  const StateDict reference = one_process(dir.path(), fp16);
  for (int i = 0; i < members; ++i) {
    if (failure.kind == Failure::kKill && i == failure.victim) continue;
    const StateDict final_model = load_state_dict_file(dir.path() + "/final-" + std::to_string(i) + ".pt");
    EXPECT_LT(relative_difference(final_model, reference), 1e-5) << "member " << i;
    if (fp16) {
      EXPECT_EQ(testing::read_text(dir.path() + "/scale-" + std::to_string(i) + ".txt"),
                testing::read_text(dir.path() + "/reference-scale.txt"))
          << "member " << i << "'s gradient scaler (scale, growth count) against one process's";
    }
    if (!sharded) continue;
    // Each member keeps two shards of three: less than the whole state, more than none.
    std::istringstream state(testing::read_text(dir.path() + "/state-" + std::to_string(i) + ".txt"));
    int64_t kept = -1, whole = -1;
    state >> kept >> whole;
    EXPECT_GT(kept, 0) << "member " << i;
    EXPECT_LT(kept, whole) << "member " << i;
  }
  const StateDict momentum = load_state_dict_file(dir.path() + "/momentum.pt");
  EXPECT_EQ(momentum.size(), 4u);
  EXPECT_LT(relative_difference(momentum, load_state_dict_file(dir.path() + "/reference-momentum.pt")), 1e-5);
  if (failure.kind == Failure::kKill) {
    // The replacement took part: it joined, was healed and trained committed steps.
    const std::string log = testing::read_text(dir.path() + "/samples-" + std::to_string(first_members) + ".log");
    EXPECT_NE(log.find('\n'), log.rfind('\n')) << "the replacement committed no step:\n" << log;
  }
  if (failure.kind == Failure::kKill && mode == Mode::kHsdp) {
    // The victim's replica group left the job as a whole while it was gone: its other member
    // committed none of the steps the other group committed meanwhile (three at least).
    const std::vector<int64_t> back = committed_steps(dir.path(), first_members);
    ASSERT_FALSE(back.empty());
    const int mate = failure.victim ^ 1, other = failure.victim < 2 ? 2 : 0;
    int64_t outage = 0;
    for (int64_t step : committed_steps(dir.path(), other)) outage += step >= failure.at && step < back.front();
    EXPECT_GE(outage, 3) << "steps the other group committed while the victim's was out";
    for (int64_t step : committed_steps(dir.path(), mate)) {
      EXPECT_FALSE(step >= failure.at && step < back.front()) << "member " << mate << " committed step " << step
                                                              << " while its replica group was incomplete";
    }
  }
  if (failure.kind == Failure::kStop) {
    // The stopped member was evicted, and joined again when it continued.
    const std::string log = dir.path() + "/samples-" + std::to_string(failure.victim) + ".log";
    EXPECT_FALSE(has_line(log, "epochs 1")) << testing::read_text(log);
  }
}

TEST(FaultTolerantDdp, ThreeMembersWithoutFailuresTrainAsOneProcess) { train_three_members({}, /*shared_memory=*/false); }

// Kill -9 one of three at a step that depends on the seed; the survivors go on, a
// replacement joins and takes the state; the model is the one of an uninterrupted run.
TEST(FaultTolerantDdp, AMemberKilledAtARandomStepIsReplacedAndTheModelIsUnchanged) {
  for (int seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    train_three_members({Failure::kKill, seed % 3, 1 + (seed * 5) % 11}, /*shared_memory=*/seed == 2);
  }
}

// SIGSTOP one of three: evicted after the timeout, the others go on; SIGCONT: its step
// fails (its group was abandoned, its lease ran out), it joins again, takes the state and
// trains on; nothing it did while stale is committed.
TEST(FaultTolerantDdp, AStoppedMemberIsEvictedAndRejoinsWhenItContinues) {
  train_three_members({Failure::kStop, 1, 3}, /*shared_memory=*/false);
  train_three_members({Failure::kStop, 2, 5}, /*shared_memory=*/true);
}

// ZeRO-1 under fault tolerance: each member keeps two of the three shards of the optimizer
// state. A member killed at a step that depends on the seed loses nothing: the survivors
// keep every shard between them, re-shard it over the new membership and hand the
// replacement its shards; the model and the momentum are those of an uninterrupted run.
TEST(FaultTolerantDdp, ShardedOptimizerStateSurvivesAKilledMember) {
  for (int seed = 1; seed <= 2; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    train_three_members({Failure::kKill, seed % 3, 2 + (seed * 7) % 11}, /*shared_memory=*/seed == 2, Mode::kZero);
  }
}

TEST(FaultTolerantDdp, ShardedOptimizerStateSurvivesAStoppedMember) {
  train_three_members({Failure::kStop, 0, 4}, /*shared_memory=*/false, Mode::kZero);
}

TEST(FaultTolerantDdp, ShardedThreeMembersWithoutFailuresTrainAsOneProcess) {
  train_three_members({}, /*shared_memory=*/true, Mode::kZero);
}

// FSDP under fault tolerance: each member keeps its shard of the parameters and optimizer
// state and the previous member's. The same training as one process, with no failure,
// with a member killed at a step that depends on the seed (the survivors put the model
// together from the shards they keep and shard it anew; the replacement takes its shard),
// and with a member stopped past the timeout.
TEST(FaultTolerantFsdp, ThreeMembersWithoutFailuresTrainAsOneProcess) {
  train_three_members({}, /*shared_memory=*/false, Mode::kFsdp);
}

TEST(FaultTolerantFsdp, AMemberKilledAtARandomStepIsReplacedAndTheModelIsUnchanged) {
  for (int seed = 1; seed <= 2; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    train_three_members({Failure::kKill, seed % 3, 3 + (seed * 5) % 11}, /*shared_memory=*/seed == 2, Mode::kFsdp);
  }
}

TEST(FaultTolerantFsdp, AStoppedMemberIsEvictedAndRejoinsWhenItContinues) {
  train_three_members({Failure::kStop, 1, 4}, /*shared_memory=*/true, Mode::kFsdp);
}

// HSDP under fault tolerance: four members in two replica groups of two, each group sharding
// the model over itself. The same training as one process without failures, and with a
// member of one group killed: its group leaves the job whole, the other trains on alone
// (its commits counted during the outage), and the replacement and its group-mate take
// their shards from the other group's matching members.
TEST(FaultTolerantHsdp, TwoReplicaGroupsWithoutFailuresTrainAsOneProcess) {
  train_three_members({}, /*shared_memory=*/true, Mode::kHsdp);
}

TEST(FaultTolerantHsdp, AMemberKilledTakesItsGroupOutTheOtherGoesOnAndTheModelIsUnchanged) {
  train_three_members({Failure::kKill, 2, 5}, /*shared_memory=*/false, Mode::kHsdp);
}

// Float16 training's gradient scaler under fault tolerance: overflows injected at two steps
// skip them on every member (under FSDP only one member's shard and its keeper's hold the
// inf: the others learn it from the agreement), the scale halves there and doubles every 3
// steps without one, only with committed steps; a replacement takes the scale with the
// model. Model, momentum and scale are one process's.
TEST(FaultTolerantDdp, GradScalerSkipsOverflowsOnEveryMemberAndAReplacementTakesTheScale) {
  train_three_members({}, /*shared_memory=*/false, Mode::kDdp, /*fp16=*/true);
  train_three_members({Failure::kKill, 1, 9}, /*shared_memory=*/false, Mode::kDdp, /*fp16=*/true);
}

TEST(FaultTolerantFsdp, GradScalerSkipsOverflowsOnEveryMemberAndAReplacementTakesTheScale) {
  train_three_members({Failure::kKill, 2, 7}, /*shared_memory=*/true, Mode::kFsdp, /*fp16=*/true);
}

// HSDP: the replica groups keep the same shards; a group that leaves and comes back takes
// the scale from the other.
TEST(FaultTolerantHsdp, GradScalerSkipsOverflowsOnEveryMemberAndAGroupBackTakesTheScale) {
  train_three_members({Failure::kKill, 1, 5}, /*shared_memory=*/false, Mode::kHsdp, /*fp16=*/true);
}

TEST(FaultTolerantDdp, ShardedGradScalerStateSurvivesAStoppedMember) {
  train_three_members({Failure::kStop, 1, 5}, /*shared_memory=*/false, Mode::kZero, /*fp16=*/true);
}

// Two of three members killed at once (in a ring of three any two are neighbours): a shard
// of the model is lost with both its keepers. The survivor (the job allows one member)
// stops with the reason instead of training a model with a hole in it.
TEST(FaultTolerantFsdp, TwoNeighboursLostAtOnceStopTheSurvivorWithTheReason) {
  testing::TempDir dir;
  const auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, kToken, 10s, ""});
  const uint16_t port = server->port();
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    pids.push_back(datapar::detail::fork_child(
        [&, i] { return member_main(port, dir.path(), i, i == 0 ? -1 : 4, false, 60ms, Mode::kFsdp); }, "member"));
  }
  FtOptions one_is_enough = options();
  one_is_enough.min_members = 1;
  const Decider decider(connect(port), "job", one_is_enough);
  const auto deadline = Clock::now() + 60s;
  for (size_t i = 1; i < 3; ++i) EXPECT_EQ(datapar::detail::wait_child(pids[i], deadline).signal, SIGKILL);
  EXPECT_EQ(datapar::detail::wait_child(pids[0], deadline).exit_code, 3);
  const std::string error = testing::read_text(dir.path() + "/error-0.txt");
  EXPECT_NE(error.find("no member keeps every shard of the model at step 4"), std::string::npos) << error;
  EXPECT_NE(error.find("--resume"), std::string::npos) << error;
}

}  // namespace
}  // namespace datapar::ft
