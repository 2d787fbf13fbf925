// The checkpoint every mode writes. See checkpoint_writer.h.
#include "checkpoint_writer.h"

#include "datapar/distributed.h"
#include "datapar/train/async_checkpoint.h"
#include "datapar/train/dcp_checkpoint.h"

namespace datapar::tools {

void write_checkpoint(const TrainPlan& plan, const torch::nn::Module& model, train::Checkpoint c,
                      ZeroRedundancyOptimizer* zero) {
  const TrainOptions& o = plan.options;
  c.progress = {{"seed", static_cast<int64_t>(o.seed)}};
  const std::string path = o.checkpoint_format == "dcp" ? train::dcp_checkpoint_path(o.checkpoint_dir, c.epoch)
                                                        : train::checkpoint_path(o.checkpoint_dir, c.epoch);
  if (plan.checkpoint_writer) {  // --checkpoint-async
    if (o.checkpoint_format == "dcp") return plan.checkpoint_writer->save_dcp(c, model, path, zero);
    return plan.checkpoint_writer->save(c, path, plan.rank);
  }
  if (o.checkpoint_format == "dcp") {
    train::save_dcp_checkpoint(c, model, train::dcp_checkpoint_path(o.checkpoint_dir, c.epoch),
                               is_initialized() ? default_group().get() : nullptr, zero);
    return;
  }
  train::save_checkpoint(c, train::checkpoint_path(o.checkpoint_dir, c.epoch), plan.rank);
}

}  // namespace datapar::tools
