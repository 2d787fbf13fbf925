// See optimizer_factory.h.
#include "datapar/optim/optimizer_factory.h"

#include "datapar/error.h"
#include "optim/param_state.h"

namespace datapar {

OptimizerFactory optimizer_like(const torch::optim::Optimizer& optimizer) {
  const detail::OptimizerKind kind = detail::optimizer_kind(optimizer);
  DATAPAR_CHECK(kind != detail::OptimizerKind::kOther, "optimizer_like: ", detail::optimizer_kind_name(kind),
                " cannot be copied by datapar (SGD, Adam and AdamW can).\n---> HINT: write the OptimizerFactory ",
                "that makes yours.");
  DATAPAR_CHECK(!optimizer.param_groups().empty(), "optimizer_like: the ", detail::optimizer_kind_name(kind),
                " has no parameter group, so no options to copy.");
  // A copy taken now: the factory does not refer to `optimizer`, which may go first.
  std::shared_ptr<const torch::optim::OptimizerOptions> options = optimizer.param_groups().front().options().clone();
  return [kind, options](std::vector<at::Tensor> params) {
    return detail::make_optimizer(kind, std::move(params), *options);
  };
}

}  // namespace datapar
