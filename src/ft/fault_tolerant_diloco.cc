// FaultTolerantDiLoCo. See datapar/ft/fault_tolerant_diloco.h.
//
// Note [A round that survives its members]
// The inner steps talk to no one, so a member's death shows only in the average or the vote
// at the round's end. The round is then averaged again over the new membership from what the
// survivors hold: their parameters after their inner steps (trained_round_ says the round
// is done), their outer parameters and momentum as the round began (only apply() moves
// them, after a commit). A member that joins meanwhile (its state taken at the newest round)
// would hold the survivors up for a whole round if it trained it, so it does not: it sits the
// round out with weight 0 and starts training at the next. Who trained is exchanged with the
// steps when the epoch forms, so every member decides alike; when no member at the newest
// round has trained it (a round boundary), everyone trains it, so the weights never sum to 0
// while a member that trained is alive.
#include "datapar/ft/fault_tolerant_diloco.h"

#include <ATen/core/Dict.h>
#include <torch/utils.h>

#include <string>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "datapar/ft/fault_tolerant_ddp.h"
#include "datapar/process_group/metadata.h"
#include "ft/standings.h"
#include "optim/param_state.h"
#include "serialization/torch_file.h"

namespace datapar::ft {
namespace {

using Dict = c10::impl::GenericDict;

// The columns of what each member says besides its step when an epoch forms.
enum Column : size_t { kHasState, kTrainedRound };

std::string state_bytes(const StateDict& state) {
  Dict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : state) dict.insert(item.key(), item.value());
  return datapar::detail::torch_save_bytes(dict);
}

StateDict state_from_bytes(const std::string& bytes) {
  const c10::IValue root = datapar::detail::torch_load_bytes(bytes.data(), bytes.size());
  if (!root.isGenericDict()) {
    throw CheckpointError("ft::FaultTolerantDiLoCo: the DiLoCo state a member sent is not a dict.");
  }
  StateDict state;
  for (const auto& e : root.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor()) {
      throw CheckpointError(
          "ft::FaultTolerantDiLoCo: an entry of the DiLoCo state a member sent is not a named tensor.");
    }
    state.insert(e.key().toStringRef(), e.value().toTensor());
  }
  return state;
}

// Not the group's owner: the ElasticGroup is, and retires it when the epoch ends. A DiLoCo
// uses its own group only when it is made; each round's average names the epoch's group.
std::shared_ptr<ProcessGroup> borrowed(const std::shared_ptr<ProcessGroup>& group) {
  return std::shared_ptr<ProcessGroup>(std::shared_ptr<ProcessGroup>(), group.get());
}

void check_inner_optimizer(const torch::optim::Optimizer& inner) {
  DATAPAR_CHECK(datapar::detail::optimizer_kind(inner) != datapar::detail::OptimizerKind::kOther,
                "ft::FaultTolerantDiLoCo: the inner optimizer is ",
                datapar::detail::optimizer_kind_name(datapar::detail::optimizer_kind(inner)),
                "; a member that joins takes a peer's, which works for SGD, Adam and AdamW.");
}

}  // namespace

FaultTolerantDiLoCo::FaultTolerantDiLoCo(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& inner,
                                         ElasticGroup& elastic, DiLoCoOptions options)
    : StepProtocol(elastic, 0), module_(std::move(module)), inner_(inner), options_(std::move(options)) {
  DATAPAR_CHECK(module_ != nullptr, "ft::FaultTolerantDiLoCo: the module is null.");
  DATAPAR_CHECK(options_.fragments == 1, "ft::FaultTolerantDiLoCo: ", options_.fragments,
                " fragments; fault tolerance takes whole rounds (Streaming DiLoCo is not supported under it yet), "
                "so use fragments = 1.");
  check_inner_optimizer(inner_);
}

FaultTolerantDiLoCo::FaultTolerantDiLoCo(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& inner,
                                         ElasticGroup& elastic, DiLoCoOptions options, const StateDict& state)
    : FaultTolerantDiLoCo(std::move(module), inner, elastic, std::move(options)) {
  const at::Tensor* rounds = state.find("rounds");
  const at::Tensor* since_sync = state.find("since_sync");
  DATAPAR_CHECK(rounds != nullptr && since_sync != nullptr && since_sync->item<int64_t>() == 0,
                "ft::FaultTolerantDiLoCo: the state to resume from is not a DiLoCo's at a round boundary (its "
                "state_dict() between rounds).");
  step_ = rounds->item<int64_t>();
  resumed_ = state;
}

FaultTolerantDiLoCo::~FaultTolerantDiLoCo() = default;

bool FaultTolerantDiLoCo::train_round(const InnerSteps& inner_steps, const BetweenSteps& before) {
  return run_step(
      [&](int rank, int size) {
        // Note [A round that survives its members]: trained in an attempt that failed, or sat out.
        if (trained_round_ == step_ || sits_out_) return;
        inner_steps(rank, size);
        trained_round_ = step_;
      },
      before);
}

StateDict FaultTolerantDiLoCo::state_dict() const {
  if (!diloco_ && resumed_) return *resumed_;
  DATAPAR_CHECK(diloco_ != nullptr, "ft::FaultTolerantDiLoCo::state_dict: no state before the first round began.");
  return diloco_->state_dict();
}

void FaultTolerantDiLoCo::rebuild() {
  ProcessGroup& group = *elastic_.group();
  if (resumed_) {  // nothing collective: its own state, unless a member is newer (below)
    diloco_ = std::make_unique<DiLoCo>(module_->parameters(), borrowed(elastic_.group()), options_, *resumed_);
    resumed_.reset();
  }
  // The steps the members committed as they have them (not as the epoch's record says), and
  // whether each has the job's state and has trained its round.
  const bool has_state = diloco_ != nullptr;
  const detail::Standings standings(group, Standing{step_, 0, -1, 0},
                                    {int64_t{has_state}, int64_t{has_state && trained_round_ == step_}});
  int source = -1;
  int64_t newest = -1;
  for (int r = 0; r < standings.size(); ++r) {
    if (standings.kept(r, kHasState) == 1 && standings.step(r) > newest) {
      newest = standings.step(r);
      source = r;
    }
  }
  if (source < 0) {
    // A new job: every member from the first one's parameters, as DiLoCo starts.
    diloco_ = std::make_unique<DiLoCo>(module_->parameters(), borrowed(elastic_.group()), options_);
    trained_round_ = -1;
    newest = step_;
  } else {
    bool anyone_behind = false;
    for (int r = 0; r < standings.size(); ++r) {
      anyone_behind = anyone_behind || standings.kept(r, kHasState) == 0 || standings.step(r) < newest;
    }
    if (anyone_behind) take_state(source, !has_state || step_ < newest);
  }
  bool anyone_trained = false;
  for (int r = 0; r < standings.size(); ++r) {
    anyone_trained = anyone_trained || (standings.step(r) == newest && standings.kept(r, kTrainedRound) == 1);
  }
  sits_out_ = anyone_trained && trained_round_ != step_;
  ready_ = true;
}

void FaultTolerantDiLoCo::take_state(int source, bool mine_behind) {
  ProcessGroup& group = *elastic_.group();
  const bool sends = group.rank() == source;
  // Both received before either is loaded: a failure between them leaves this member as it was.
  const std::string training =
      broadcast_bytes(group, source, sends ? detail::save_training_state(*module_, inner_, step_) : std::string());
  const std::string outer = broadcast_bytes(group, source, sends ? state_bytes(diloco_->state_dict()) : std::string());
  if (!mine_behind) return;
  step_ = detail::load_training_state(*module_, inner_, training);
  standing_.step = step_;  // kept if what follows fails
  diloco_ = std::make_unique<DiLoCo>(module_->parameters(), borrowed(elastic_.group()), options_,
                                     state_from_bytes(outer));
  start_from_outer_parameters();
  trained_round_ = -1;
}

void FaultTolerantDiLoCo::start_from_outer_parameters() {
  const torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = module_->parameters();
  const std::vector<at::Tensor>& outer = diloco_->outer_parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(outer[i]);
}

void FaultTolerantDiLoCo::before_vote() {
  // Changes nothing: a failure here or in the vote leaves the round to be averaged again.
  average_ = diloco_->average_parameters(*elastic_.group(), trained_round_ == step_ ? 1.0 : 0.0);
}

void FaultTolerantDiLoCo::apply() {
  diloco_->outer_step(average_);
  contributors_ = static_cast<int64_t>(average_.weights + 0.5);
  average_ = {};
  sits_out_ = false;
}

}  // namespace datapar::ft
