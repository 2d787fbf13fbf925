// Fault-tolerant DiLoCo (datapar/ft/fault_tolerant_diloco.h, issue 48) with its members as
// processes over loopback and the store and decider in the test, as the fault-tolerant DDP
// tests run them: three members train rounds of 4 inner steps (SGD with momentum) and the
// outer Nesterov step. Without failures the final model is plain DiLoCo's over three ranks;
// with one member SIGKILLed in the middle of a round, the others commit that round with
// their own inner steps (trained once, never again) and the rounds after it, a replacement
// joins at a round boundary, every process exits 0 and every member ends with one model.
#include "datapar/ft/fault_tolerant_diloco.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/state_dict.h"
#include "file_system.h"
#include "testing/expect_throw.h"
#include "testing/ft_job.h"
#include "testing/gloo_ranks.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

// A namespace of its own: a unity batch shares one translation unit (cmake/datapar_unity.cmake).
namespace datapar::ft::diloco_members {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "ft-diloco-test";
constexpr int kH = 4;  // inner steps a round
constexpr int64_t kSamples = 96;
constexpr int64_t kBatch = 8;

std::shared_ptr<TcpStore> connect(uint16_t port) { return testing::connect_member(port, kToken); }

// The members' model and data (testing/ft_job.h).
struct Net : testing::FtNet {};
struct Data : testing::FtData {
  Data() : testing::FtData(kSamples) {}
};

DiLoCoOptions diloco_options() {
  DiLoCoOptions o;
  o.sync_every = kH;  // Nesterov, the paper's lr 0.7 and momentum 0.9
  return o;
}

torch::optim::SGDOptions inner_options(double momentum = 0.9) {
  return torch::optim::SGDOptions(0.05).momentum(momentum);
}

// Inner step `s` of round `round` of rank `rank`: its rows depend on these alone.
void inner_step(Net& net, torch::optim::SGD& inner, const Data& data, int rank, int64_t round, int s) {
  at::Generator g = at::detail::createCPUGenerator(100000 * rank + round * kH + s);
  const at::Tensor rows = at::randperm(kSamples, g, at::kLong).narrow(0, 0, kBatch);
  inner.zero_grad();
  torch::nn::functional::mse_loss(net.forward(data.x.index_select(0, rows)), data.y.index_select(0, rows)).backward();
  inner.step();
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

// What a member does: train `rounds` rounds, pausing `pause` after each inner step, killing
// itself (SIGKILL) after half the inner steps of round `die_in` (if >= 0). Its log,
// rounds-<index>.log: "trained R" when it trains round R's inner steps, "committed R C T"
// when round R is committed with C members' inner steps at T ms (steady clock); its final
// parameters to final-<index>.pt. `save`: the first member also writes the job's state at
// the end (model.pt, outer.pt: DiLoCo's); `resume`: every member starts from it.
struct Life {
  int64_t rounds = 0;
  int64_t die_in = -1;
  std::chrono::milliseconds pause{0};
  double inner_momentum = 0.9;
  bool save = false, resume = false;
};

int member_main(uint16_t port, const std::string& dir, int index, Life life) {
  at::set_num_threads(1);
  std::ofstream log(dir + "/rounds-" + std::to_string(index) + ".log");
  const Data data;
  ElasticGroup elastic(connect(port), "job", testing::three_member_options(),
                       [](std::shared_ptr<Store> store, int rank, int size) {
                         return new_gloo_process_group(std::move(store), rank, size, {"127.0.0.1", 5s, false});
                       });
  auto net = std::make_shared<Net>();
  torch::optim::SGD inner(net->parameters(), inner_options(life.inner_momentum));
  std::optional<FaultTolerantDiLoCo> storage;
  if (life.resume) {
    load_state_dict(*net, load_state_dict_file(dir + "/model.pt"));
    storage.emplace(net, inner, elastic, diloco_options(), load_state_dict_file(dir + "/outer.pt"));
  } else {
    storage.emplace(net, inner, elastic, diloco_options());
  }
  FaultTolerantDiLoCo& trainer = *storage;
  while (trainer.round() < life.rounds) {
    const bool committed = trainer.train_round([&](int rank, int) {
      const int64_t round = trainer.round();  // after a join, the round this member took from the others
      log << "trained " << round << std::endl;
      for (int s = 0; s < kH; ++s) {
        if (round == life.die_in && s == kH / 2) ::raise(SIGKILL);
        inner_step(*net, inner, data, rank, round, s);
        std::this_thread::sleep_for(life.pause);
      }
    });
    if (committed) {
      log << "committed " << trainer.round() - 1 << ' ' << trainer.contributors() << ' ' << now_ms() << std::endl;
    }
  }
  trainer.finish([&](int rank, int) {
    if (!life.save || rank != 0) return;
    save_state_dict(trainer.state_dict(), dir + "/outer.pt");
    save_state_dict(state_dict(*net), dir + "/model.pt");
  });
  save_state_dict(state_dict(*net), dir + "/final-" + std::to_string(index) + ".pt");
  return 0;
}

// Plain DiLoCo over three ranks (threads) on the same data: what the members must end with.
// In a child of its own, as the members are (a process whose threads have started must not fork).
StateDict plain_diloco(const std::string& dir, int64_t rounds, double inner_momentum = 0.9) {
  const pid_t pid = datapar::detail::fork_child(
      [&] {
        at::set_num_threads(1);
        std::mutex generator;  // Net's initialisation seeds the default generator, which threads must not share
        testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
          const Data data;
          std::shared_ptr<Net> net;
          {
            const std::lock_guard<std::mutex> lock(generator);
            net = std::make_shared<Net>();
          }
          torch::optim::SGD inner(net->parameters(), inner_options(inner_momentum));
          DiLoCo diloco(net->parameters(), group, diloco_options());
          for (int64_t round = 0; round < rounds; ++round) {
            for (int s = 0; s < kH; ++s) {
              inner_step(*net, inner, data, rank, round, s);
              diloco.step();
            }
          }
          if (rank == 0) save_state_dict(state_dict(*net), dir + "/reference.pt");
        });
        return ::testing::Test::HasFailure() ? 1 : 0;
      },
      "plain DiLoCo");
  EXPECT_EQ(datapar::detail::wait_child(pid, Clock::now() + 60s).exit_code, 0);
  return load_state_dict_file(dir + "/reference.pt");
}

double largest_difference(const StateDict& a, const StateDict& b) {
  double worst = 0;
  for (const auto& item : a) worst = std::max(worst, (item.value() - b[item.key()]).abs().max().item<double>());
  return worst;
}

// A member's log: the rounds it trained, in order, and for each committed round its
// contributors and when.
struct Log {
  std::vector<int64_t> trained;
  std::map<int64_t, int64_t> contributors;
  std::map<int64_t, int64_t> committed_at;
};

Log read_log(const std::string& dir, int index) {
  const std::string path = dir + "/rounds-" + std::to_string(index) + ".log";
  Log log;
  std::istringstream lines(datapar::detail::exists(path) ? testing::read_text(path) : "");
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string what;
    int64_t round = -1, contributors = 0, at = 0;
    fields >> what >> round;
    if (what == "trained") log.trained.push_back(round);
    if (what == "committed" && fields >> contributors >> at) {
      log.contributors[round] = contributors;
      log.committed_at[round] = at;
    }
  }
  return log;
}

struct Job {
  testing::TempDir dir;
  std::shared_ptr<TcpStore> server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, kToken, 10s, ""});
  uint16_t port = server->port();
};

// Three members living `life` with the store and decider of `job`, their files in `dir`;
// each must exit 0.
void run_three(const Job& job, const std::string& dir, const Life& life) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    pids.push_back(datapar::detail::fork_child([&, i] { return member_main(job.port, dir, i, life); }, "member"));
  }
  const Decider decider(connect(job.port), "job", testing::three_member_options());
  const auto deadline = Clock::now() + 60s;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(datapar::detail::wait_child(pids[static_cast<size_t>(i)], deadline).exit_code, 0) << "member " << i;
  }
}

TEST(FaultTolerantDiLoCo, ThreeMembersWithoutFailuresTrainAsPlainDiLoCo) {
  constexpr int64_t kRounds = 5;
  Job job;
  run_three(job, job.dir.path(), {kRounds, -1, 0ms});
  const StateDict reference = plain_diloco(job.dir.path(), kRounds);
  for (int i = 0; i < 3; ++i) {
    const Log log = read_log(job.dir.path(), i);
    EXPECT_EQ(log.trained, (std::vector<int64_t>{0, 1, 2, 3, 4})) << "member " << i;
    for (const auto& [round, contributors] : log.contributors) EXPECT_EQ(contributors, 3) << "round " << round;
    const StateDict final_model = load_state_dict_file(job.dir.path() + "/final-" + std::to_string(i) + ".pt");
    EXPECT_LT(largest_difference(final_model, reference), 1e-6) << "member " << i;
  }
}

// A job of three stopped after 3 rounds (its state written at the end, as a checkpoint
// would hold it) and a job that resumes from it for 2 more: plain DiLoCo's 5 rounds. The
// inner SGD without momentum: each member's inner state is then none, whichever rank the
// second job gives it.
TEST(FaultTolerantDiLoCo, AJobResumedFromItsStateEndsAsAnUninterruptedOne) {
  Job first, second;
  const std::string dir = first.dir.path();
  run_three(first, dir, {3, -1, 0ms, 0.0, /*save=*/true, /*resume=*/false});
  run_three(second, dir, {5, -1, 0ms, 0.0, /*save=*/false, /*resume=*/true});
  const StateDict reference = plain_diloco(dir, 5, 0.0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(read_log(dir, i).trained, (std::vector<int64_t>{3, 4})) << "member " << i;
    const StateDict final_model = load_state_dict_file(dir + "/final-" + std::to_string(i) + ".pt");
    EXPECT_LT(largest_difference(final_model, reference), 1e-6) << "member " << i;
  }
}

constexpr int64_t kRounds = 12, kDieIn = 2;
constexpr int kVictim = 1, kReplacement = 3;

// What the survivors (members 0 and 2) and the replacement logged.
struct Outage {
  std::map<int, Log> logs;
  int64_t died_at = 0;  // ms, steady clock
};

// SIGKILLs member 1 after 2 of the 4 inner steps of round 2 and starts a replacement (member
// 3): at once, or once the survivors committed round `replace_after`. Checks what holds
// either way: every process exits 0 (the victim killed), each survivor trains every round
// once (the victim's round with its own inner steps, never again) and commits every round,
// the victim's with two members' inner steps; every member ends with the same model.
Outage kill_and_replace(std::optional<int64_t> replace_after) {
  constexpr auto kPause = 30ms;
  Job job;
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    const Life life{kRounds, i == kVictim ? kDieIn : -1, kPause};
    pids.push_back(datapar::detail::fork_child(
        [&, i, life] { return member_main(job.port, job.dir.path(), i, life); }, "member"));
  }
  const Decider decider(connect(job.port), "job", testing::three_member_options());
  const auto deadline = Clock::now() + 60s;
  const datapar::detail::ChildExit died = datapar::detail::wait_child(pids[kVictim], deadline);
  EXPECT_EQ(died.signal, SIGKILL) << "the victim did not die as planned (exit " << died.exit_code << ")";
  Outage outage;
  outage.died_at = now_ms();
  if (replace_after) {
    while (!read_log(job.dir.path(), 0).contributors.count(*replace_after) && Clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_TRUE(read_log(job.dir.path(), 0).contributors.count(*replace_after))
        << "the survivors stopped committing rounds when a member died:\n"
        << testing::read_text(job.dir.path() + "/rounds-0.log");
  }
  pids[kVictim] = datapar::detail::fork_child(
      [&] { return member_main(job.port, job.dir.path(), kReplacement, {kRounds, -1, kPause}); }, "replacement");
  for (int i = 0; i < 3; ++i) {
    const datapar::detail::ChildExit exit = datapar::detail::wait_child(pids[static_cast<size_t>(i)], deadline);
    EXPECT_EQ(exit.exit_code, 0) << "member " << (i == kVictim ? kReplacement : i) << " (signal " << exit.signal << ")";
  }
  std::vector<int64_t> once;
  for (int64_t r = 0; r < kRounds; ++r) once.push_back(r);
  for (int i : {0, 2, kReplacement}) outage.logs[i] = read_log(job.dir.path(), i);
  for (int i : {0, 2}) {
    SCOPED_TRACE("survivor " + std::to_string(i));
    const Log& log = outage.logs[i];
    EXPECT_EQ(log.trained, once) << testing::read_text(job.dir.path() + "/rounds-" + std::to_string(i) + ".log");
    EXPECT_EQ(static_cast<int64_t>(log.contributors.size()), kRounds);
    for (int64_t r = 0; r < kDieIn; ++r) EXPECT_EQ(log.contributors.at(r), 3) << "round " << r;
    EXPECT_EQ(log.contributors.at(kDieIn), 2) << "the round the victim died in: the survivors' inner steps";
  }
  const StateDict first = load_state_dict_file(job.dir.path() + "/final-0.pt");
  for (int i : {2, kReplacement}) {
    const StateDict other = load_state_dict_file(job.dir.path() + "/final-" + std::to_string(i) + ".pt");
    EXPECT_LT(largest_difference(other, first), 1e-6) << "member " << i;
  }
  return outage;
}

// The victim stays down until the survivors committed two rounds after its own: they go on
// committing rounds meanwhile; the replacement joins at a round boundary and trains the
// last rounds with them.
TEST(FaultTolerantDiLoCo, AMemberKilledInTheMiddleOfARoundCostsOnlyItsOwnInnerSteps) {
  const Outage outage = kill_and_replace(kDieIn + 2);
  const Log& replacement = outage.logs.at(kReplacement);
  ASSERT_FALSE(replacement.contributors.empty()) << "the replacement committed no round";
  const int64_t back = replacement.contributors.begin()->first;  // its first committed round
  for (int i : {0, 2}) {
    // Rounds committed while the victim was down: after it died, before the replacement's first.
    int64_t down = 0;
    for (const auto& [round, at] : outage.logs.at(i).committed_at) down += at >= outage.died_at && round < back;
    EXPECT_GE(down, 3) << "survivor " << i;
  }
  EXPECT_EQ(replacement.trained.front(), back) << "it joined at a round boundary and trained that round";
  EXPECT_EQ(replacement.contributors.at(back), 3);
}

// The replacement starts at once and joins while the survivors average the victim's round
// again (the victim is evicted after the 1 s timeout): it takes the state at that round but
// does not train it (the survivors would wait for its inner steps); the round averages the
// survivors' alone (weight 0 for the replacement), and it trains the next rounds.
TEST(FaultTolerantDiLoCo, AMemberThatJoinsWhileARoundIsAveragedAgainSitsThatRoundOut) {
  const Outage outage = kill_and_replace(std::nullopt);
  const Log& replacement = outage.logs.at(kReplacement);
  ASSERT_TRUE(replacement.contributors.count(kDieIn)) << "the replacement did not join in the victim's round";
  EXPECT_EQ(replacement.contributors.at(kDieIn), 2);
  ASSERT_FALSE(replacement.trained.empty());
  EXPECT_EQ(replacement.trained.front(), kDieIn + 1) << "it sat the victim's round out";
  EXPECT_EQ(replacement.contributors.at(kDieIn + 1), 3);
}

// What it cannot do yet or at all, said at construction: Streaming DiLoCo (a round is the
// protocol's step), and an inner optimizer whose state a joining member cannot take.
TEST(FaultTolerantDiLoCo, RefusesFragmentsAndAnOptimizerItCannotMove) {
  Job job;
  const pid_t pid = datapar::detail::fork_child(
      [&] {
        ElasticGroup elastic(connect(job.port), "job", testing::three_member_options(),
                             [](std::shared_ptr<Store> store, int rank, int size) {
                               return new_gloo_process_group(std::move(store), rank, size);
                             });
        auto net = std::make_shared<Net>();
        torch::optim::SGD sgd(net->parameters(), inner_options());
        DiLoCoOptions streaming = diloco_options();
        streaming.fragments = 2;
        EXPECT_THROW_MSG(FaultTolerantDiLoCo(net, sgd, elastic, streaming), InvalidArgumentError,
                         "Streaming DiLoCo is not supported under it yet");
        torch::optim::RMSprop rmsprop(net->parameters());
        EXPECT_THROW_MSG(FaultTolerantDiLoCo(net, rmsprop, elastic, diloco_options()), InvalidArgumentError,
                         "which works for SGD, Adam and AdamW");
        return ::testing::Test::HasFailure() ? 1 : 0;
      },
      "member");
  EXPECT_EQ(datapar::detail::wait_child(pid, Clock::now() + 30s).exit_code, 0);
}

}  // namespace
}  // namespace datapar::ft::diloco_members
