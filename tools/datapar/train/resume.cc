// Resuming a run. See resume.h.
#include "resume.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/train/checkpoint.h"
#include "datapar/train/dcp_checkpoint.h"
#include "datapar/train/resume_agreement.h"

namespace datapar::tools {
namespace {

// --checkpoint-format dcp. The newest complete epoch-N directory, loaded by every rank
// together; newer directories that do not load (a save cut short, a damaged or hostile
// .metadata) are reported with the reason and moved aside by rank 0 (<dir>.damaged), so
// that training their epochs again writes them anew (issue 46: a cut .metadata made every
// retry fail with "epoch-2 holds a checkpoint already").
int64_t resume_dcp(const TrainPlan& plan, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                   const c10::Device& device) {
  const TrainOptions& o = plan.options;
  const bool leader = plan.rank == 0;
  ProcessGroup* group = is_initialized() ? default_group().get() : nullptr;
  std::vector<train::SkippedCheckpoint> skipped;
  std::optional<train::Checkpoint> found = train::load_latest_dcp_checkpoint(o.checkpoint_dir, model, group, &skipped);
  for (const train::SkippedCheckpoint& s : skipped) {
    if (!leader) continue;
    const std::string moved = o.evaluate ? "" : train::move_dcp_checkpoint_aside(s.path, s.problem);
    std::fprintf(stderr, "datapar train: skipping a checkpoint that does not load%s: %s\n",
                 moved.empty() ? "" : (" (moved aside to " + moved + ")").c_str(), s.problem.c_str());
  }
  if (group != nullptr && !o.evaluate) train::agree_on_resume(*group, found);
  if (found) {
    for (auto& item : found->model) item.value() = item.value().to(device);
    train::restore_checkpoint(*found, model, optimizer);
    if (leader && !o.evaluate) {
      std::printf("resuming from %s (%ld epochs done)\n", found->path.c_str(), (long)found->epoch);
      std::fflush(stdout);  // at once, not with the first epoch's report
    }
    return found->epoch;
  }
  DATAPAR_CHECK(!o.evaluate, "--evaluate: no complete checkpoint in ", o.checkpoint_dir, ".");
  DATAPAR_CHECK(!o.resume || o.start_over || skipped.empty(), "--resume: no complete checkpoint in ", o.checkpoint_dir,
                " (", skipped.size(), " incomplete).\n---> HINT: add --start-over to train from epoch 1.");
  DATAPAR_CHECK(!o.resume || o.start_over || !skipped.empty(), "--resume: no checkpoint in ", o.checkpoint_dir,
                " to resume from.\n---> HINT: leave out --resume to start a new run, or add --start-over to start "
                "from epoch 1 when there is none.");
  if (leader) std::printf("no checkpoint in %s: starting from epoch 1\n", o.checkpoint_dir.c_str());
  return 0;
}

}  // namespace

int64_t resume(const TrainPlan& plan, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               const c10::Device& device) {
  const TrainOptions& o = plan.options;
  const bool leader = plan.rank == 0;
  if (o.checkpoint_format == "dcp") return resume_dcp(plan, model, optimizer, device);
  const train::LatestCheckpoint found =
      train::load_latest_checkpoint(o.checkpoint_dir, o.evaluate ? -1 : plan.rank, device);
  // Before anything a rank could decide alone: every rank resumes the same checkpoint
  // (per-node directories, one emptied), or all stop, saying what each found.
  if (is_initialized() && !o.evaluate) train::agree_on_resume(*default_group(), found.checkpoint);
  for (const auto& d : found.damaged) {
    if (!leader) continue;
    std::fprintf(stderr, "datapar train: skipping a damaged checkpoint: %s\n", d.problem.c_str());
    if (!d.moved_to.empty()) {
      std::fprintf(stderr, "  moved it to %s (kept for inspection; no run overwrites it)\n", d.moved_to.c_str());
    }
  }
  if (found.checkpoint) {
    const train::Checkpoint& c = *found.checkpoint;
    train::restore_checkpoint(c, model, optimizer);
    if (leader && !o.evaluate) {
      std::printf("resuming from %s (%ld epochs done)\n", c.path.c_str(), (long)c.epoch);
      std::fflush(stdout);  // at once, not with the first epoch's report
    }
    return c.epoch;
  }
  const int64_t damaged = std::max<int64_t>(static_cast<int64_t>(found.damaged.size()), found.set_aside);
  const std::string why = o.evaluate ? "--evaluate" : o.resume ? "--resume" : "restart (DATAPAR_RESTART_COUNT > 0)";
  if (damaged > 0 && (o.evaluate || !o.start_over)) {
    throw CheckpointError(detail::str_cat(
        why, ": no intact checkpoint in ", o.checkpoint_dir, ": ", damaged, " damaged one",
        damaged == 1 ? " is" : "s are", " set aside there (*.pt.damaged), and starting from epoch 1 would silently ",
        "lose the run.\n---> HINT: copy an intact checkpoint back from elsewhere, or add --start-over to train from ",
        "epoch 1 (the damaged files stay)."));
  }
  DATAPAR_CHECK(!o.evaluate, "--evaluate: no checkpoint in ", o.checkpoint_dir, ".");
  DATAPAR_CHECK(!o.resume || o.start_over, "--resume: no checkpoint in ", o.checkpoint_dir,
                " to resume from.\n---> HINT: leave out --resume to start a new run, or add --start-over to start "
                "from epoch 1 when there is none.");
  if (leader) {
    std::printf("no %scheckpoint in %s: starting from epoch 1%s\n", damaged > 0 ? "intact " : "",
                o.checkpoint_dir.c_str(), o.start_over ? " (--start-over)" : "");
  }
  return 0;
}

}  // namespace datapar::tools
