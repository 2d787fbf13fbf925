// FaultTolerantDiLoCo: DiLoCo (and local SGD) that goes on when a member dies, hangs or joins
// (issue 48; the step protocol of issue 31, docs/fault_tolerance.md). A member lost in the
// middle of a round costs its own inner steps at most: the others never stop training.
//
// The protocol's step is one DiLoCo round, not one inner step. train_round() runs this
// member's inner steps of the round (the user's function: forward, backward and the inner
// optimizer's step, sync_every times, with no communication at all, so that no peer can
// stop them), then averages the members' parameters (the pseudo-gradients) over the
// membership, votes, and takes the outer step only on a commit (local: nothing can fail
// after the commit). When a member fails in the average or the vote, the others form a new
// membership and average the round again over themselves: they do not train it again (their
// inner steps are done; the parameters hold them), and the failed attempt changed nothing
// (the average changes no state; the outer parameters and momentum move only in the outer
// step). A member that (re)joins takes, from a member at the newest round, the outer
// parameters, the outer momentum, the round and that member's inner optimizer state and
// buffers, and starts from the outer parameters at the next round boundary: it waits in
// join() for the others to end their round (ElasticGroup::vote's reconfigure), so the
// others never wait for it except at their sync.
//
//   ft::ElasticGroup elastic(store, "run", options, [](auto store, int rank, int size) {
//     return datapar::new_gloo_process_group(store, rank, size);
//   });
//   auto model = std::make_shared<Net>();
//   torch::optim::AdamW inner(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   DiLoCoOptions options;
//   options.sync_every = 50;                                  // H inner steps a round
//   ft::FaultTolerantDiLoCo trainer(model, inner, elastic, options);
//   while (trainer.round() < rounds) {
//     trainer.train_round([&](int rank, int size) {           // this member's H inner steps
//       for (int64_t s = 0; s < options.sync_every; ++s) {    // of round trainer.round(), as
//         inner.zero_grad();                                  // rank `rank` of `size` members
//         loss(model->forward(x), y).backward();
//         inner.step();
//       }
//     });
//   }
//   trainer.finish();
//
// Weighting: the average is over the members that trained this round, each with weight 1;
// a member that joined (took the state) while others had already trained the round does not
// train it (it would hold them up) and counts with weight 0 (DiLoCo::average_parameters).
// Without failures, the training is DiLoCo's over the same members (within the rounding of
// the all-reduce's order). Unlike FaultTolerantDdp, the result depends on who is alive:
// a round averages the inner steps of those who trained it, as DiLoCo over fewer ranks does.
//
// The inner optimizer must be one optim/optimizer_state.h supports (SGD, Adam, AdamW) and
// hold the module's parameters. Not yet: Streaming DiLoCo (DiLoCoOptions::fragments > 1).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "datapar/diloco/diloco.h"
#include "datapar/ft/elastic_group.h"
#include "datapar/ft/step_protocol.h"
#include "datapar/state_dict.h"

namespace datapar::ft {

class FaultTolerantDiLoCo : public detail::StepProtocol {
 public:
  // This member's inner steps of round round(), as rank `rank` of the `size` members of the
  // current membership epoch (e.g. to pick its share of the data): no collectives.
  using InnerSteps = std::function<void(int rank, int size)>;

  // Over `module`'s parameters, trained by `inner` (which holds them); round 0. The members
  // that start together start from the first one's parameters (DiLoCo's broadcast).
  // Throws InvalidArgumentError for bad `options` (as DiLoCo) or fragments > 1.
  FaultTolerantDiLoCo(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& inner,
                      ElasticGroup& elastic, DiLoCoOptions options = {});
  // Resumed from `state` (state_dict() of a run, written at a round boundary), the module and
  // the inner optimizer this member's as they were then.
  FaultTolerantDiLoCo(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& inner,
                      ElasticGroup& elastic, DiLoCoOptions options, const StateDict& state);
  ~FaultTolerantDiLoCo() override;

  // Trains round round(): joins a new epoch first when needed (taking the newest state if
  // this member is behind or new), runs `before` (if given; as FaultTolerantDdp::train_step),
  // calls inner_steps(rank, size) unless this member has trained this round already (an
  // earlier attempt that failed in the average) or joined while others had, averages the
  // parameters over the members and votes; takes the outer step only when every member may
  // commit. Returns whether the round was committed; if not, call again: the round is
  // averaged anew over the new membership, its inner steps kept. Throws MembershipError when
  // the job cannot go on, and whatever inner_steps or `before` throws that is not a failure
  // of a member.
  bool train_round(const InnerSteps& inner_steps, const BetweenSteps& before = {});

  // After the last round: as FaultTolerantDdp::finish.
  void finish(const BetweenSteps& last = {}) { run_finish(last); }

  // Rounds committed: the round the next train_round trains (StepProtocol::step()).
  int64_t round() const { return step(); }
  // How many members' inner steps the last committed round averaged (0 before one).
  int64_t contributors() const { return contributors_; }
  const DiLoCoOptions& options() const { return options_; }
  // What a resumed run needs besides each member's module and inner optimizer (DiLoCo's
  // state: the outer parameters, the momentum, the counts). REQUIRES: at a round boundary
  // (in `before` or `last`, or between train_round calls), after the first round began.
  StateDict state_dict() const;

 private:
  bool ready() const override { return ready_; }
  void drop() override { ready_ = false; }
  void rebuild() override;
  void zero_grad() override {}  // the inner steps zero their own gradients
  void before_vote() override;
  void apply() override;

  // rebuild()'s parts: the state of `source` (a member at the newest round) to the members
  // that lack it, and the parameters from the outer parameters.
  void take_state(int source, bool mine_behind);
  void start_from_outer_parameters();

  std::shared_ptr<torch::nn::Module> module_;
  torch::optim::Optimizer& inner_;
  DiLoCoOptions options_;
  std::unique_ptr<DiLoCo> diloco_;    // null until this member has the job's state
  std::optional<StateDict> resumed_;  // a resumed member's DiLoCo state, until its first epoch
  int64_t trained_round_ = -1;        // the round whose inner steps the parameters hold
  bool sits_out_ = false;             // joined this round after others trained it: weight 0
  DiLoCo::Average average_;           // this round's, between before_vote and apply
  int64_t contributors_ = 0;
  bool ready_ = false;
};

}  // namespace datapar::ft
