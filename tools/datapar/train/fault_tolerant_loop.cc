// The fault-tolerant training loop. See fault_tolerant_loop.h.
#include "fault_tolerant_loop.h"

#include <cstdio>
#include <optional>
#include <vector>

#include "datapar/train/async_checkpoint.h"
#include "evaluation.h"
#include "rank_state.h"
#include "report.h"
#include "step_autocast.h"
#include "timing.h"

namespace datapar::tools {
namespace {

class FaultTolerantLoop {
 public:
  FaultTolerantLoop(const TrainPlan& plan, const Data& data, FaultTolerantStrategy& strategy, ft::ElasticGroup& elastic,
                    BalancedBatches& batches, int64_t first_epoch)
      : plan_(plan), o_(plan.options), data_(data), strategy_(strategy), elastic_(elastic), batches_(batches),
        device_(plan.devices.front().torch_device()), per_epoch_(batches.num_steps()),
        reported_(first_epoch * per_epoch_), report_(plan, first_epoch, /*writer=*/false) {
    if (o_.amp == "fp16") {  // the protocol agrees on skipped steps; the state is the job's, rank 0's file
      scaler_.emplace();
      if (first_epoch > 0) load_scaler_state(plan_, *scaler_, first_epoch, /*rank=*/0);
      strategy_.use_grad_scaler(&*scaler_);
    }
  }
  ~FaultTolerantLoop() {
    if (scaler_) strategy_.use_grad_scaler(nullptr);  // the strategy outlives the loop's scaler
  }
  FaultTolerantLoop(const FaultTolerantLoop&) = delete;
  FaultTolerantLoop& operator=(const FaultTolerantLoop&) = delete;

  void run() {
    const int64_t total = per_epoch_ * o_.epochs;
    const auto epoch_end = [this](int rank, int size) { end_epoch(rank, size); };
    while (strategy_.committed_steps() < total) {
      if (plan_.checkpoint_writer) plan_.checkpoint_writer->check();  // a failed background write, reported now
      Rows step_rows;  // this rank's parts of the step
      const bool committed =
          strategy_.train_step([&](const ft::Slice& slice) { return train_slice(slice, step_rows); }, epoch_end);
      if (!committed) continue;
      if (strategy_.memberships_joined() != memberships_seen_) {  // the first step of a new membership
        memberships_seen_ = strategy_.memberships_joined();
        if (elastic_.rank() == 0) {
          std::printf("membership epoch %ld: %d ranks, training from step %ld  %.1f s\n",
                      (long)elastic_.epoch().number, elastic_.size(), (long)strategy_.committed_steps() - 1, seconds_since(start_));
          std::fflush(stdout);
        }
      }
      current_.loss_sum += step_rows.loss_sum;
      current_.correct += step_rows.correct;
      current_.rows += step_rows.rows;
    }
    strategy_.finish(epoch_end);
  }

 private:
  struct Rows {  // this rank's committed rows of an epoch
    double loss_sum = 0;
    int64_t rows = 0, correct = 0;
  };

  // One fixed slice of the step's global batch: forward and backward; its rows counted in
  // `step_rows` unless it is a shadow slice (trained only to keep the collectives in step).
  int64_t train_slice(const ft::Slice& slice, Rows& step_rows) {
    const int64_t step = strategy_.training_step();
    if (step / per_epoch_ != batches_epoch_) {
      batches_epoch_ = step / per_epoch_;
      batches_.set_epoch(batches_epoch_);
    }
    const at::Tensor global = batches_.global_batch(step % per_epoch_);
    const int64_t n = global.size(0), begin = slice.begin(n), end = slice.end(n);
    const Batch batch = data_.train->get_batch(global.narrow(0, begin, end - begin));
    const at::Tensor y = batch.target.to(device_);
    strategy_.module().train();
    at::Tensor logits, loss;
    {
      const StepAutocast autocast(plan_);  // --amp
      logits = strategy_.forward(batch.data.to(device_));
      loss = at::cross_entropy_loss(logits.to(at::kFloat), y);
    }
    (scaler_ ? scaler_->scale(loss) : loss).backward();
    if (slice.shadow) return y.size(0);
    step_rows.loss_sum += loss.item<double>() * static_cast<double>(y.size(0));
    step_rows.correct += logits.argmax(1).eq(y).sum().item<int64_t>();
    step_rows.rows += y.size(0);
    return y.size(0);
  }

  // An epoch's end, before the next epoch's first step and after the last step: run by every
  // member together, and again over a new membership when one fails in it (the report and
  // checkpoint are written once, by the first rank, unless it changed).
  void end_epoch(int rank, int size) {
    const int64_t step = strategy_.committed_steps();
    if (step == 0 || step % per_epoch_ != 0) return;
    if (ended_at_ != step) {  // the first run of this epoch end: its rows are done
      ended_at_ = step;
      ended_ = current_;
      current_ = {};
      ended_seconds_ = seconds_since(epoch_start_);
      epoch_start_ = Clock::now();
    }
    // The epoch's rows as the members alive saw them commit (all of them when none failed).
    const std::vector<double> job_rows = reduce(
        std::vector<double>{ended_.loss_sum, double(ended_.correct), double(ended_.rows)}, ReduceOp::kSum,
        elastic_.group().get());
    const auto eval_start = Clock::now();
    const auto [right, samples] = evaluate(plan_, data_, strategy_.module(), [this](const at::Tensor& x) { return strategy_.forward(x); }, device_,
                                           EvalPart{rank, size, elastic_.group().get()});
    const double eval_seconds = seconds_since(eval_start);
    std::optional<train::Checkpoint> checkpoint;  // gathered only when one is written
    if (!o_.checkpoint_dir.empty()) checkpoint = strategy_.checkpoint(step / per_epoch_);
    if (rank != 0 || step <= reported_) return;
    reported_ = step;
    const int64_t epoch = step / per_epoch_;
    std::printf("epoch %ld/%ld  loss %.4f  train acc %.4f (rank 0's rows)  test acc %.4f  %.1f s  %d ranks "
                "(membership epoch %ld)\n",
                (long)epoch, (long)o_.epochs, ended_.rows ? ended_.loss_sum / ended_.rows : 0.0,
                ended_.rows ? double(ended_.correct) / ended_.rows : 0.0, samples ? double(right) / samples : 0.0,
                seconds_since(start_), size, (long)elastic_.epoch().number);
    std::fflush(stdout);
    if (!o_.metrics.empty() || !o_.plot.empty()) {
      report_.take_over(epoch);
      report_.epoch(epoch, EpochTotals{job_rows[0], job_rows[1], job_rows[2], ended_seconds_, 0}, {right, samples},
                   eval_seconds, /*print=*/false);
    }
    if (o_.checkpoint_dir.empty()) return;
    checkpoint->progress = {{"seed", static_cast<int64_t>(o_.seed)}};
    const std::string path = train::checkpoint_path(o_.checkpoint_dir, epoch);
    if (scaler_) save_scaler_state(plan_, *scaler_, epoch, /*rank=*/0);  // first: the checkpoint names its epoch
    if (plan_.checkpoint_writer) return plan_.checkpoint_writer->save(*checkpoint, path, 0);  // --checkpoint-async
    train::save_checkpoint(*checkpoint, path, 0);
  }

  const TrainPlan& plan_;
  const TrainOptions& o_;
  const Data& data_;
  FaultTolerantStrategy& strategy_;
  ft::ElasticGroup& elastic_;
  BalancedBatches& batches_;
  const c10::Device device_;
  const int64_t per_epoch_;
  int64_t batches_epoch_ = -1;      // the epoch `batches_` is set to
  Rows current_, ended_;
  int64_t ended_at_ = -1;           // the step at which `ended_` ended
  int64_t reported_;                // the last epoch end this rank reported
  int64_t memberships_seen_ = 0;    // strategy_.memberships_joined() when last reported
  const Clock::time_point start_ = Clock::now();
  Clock::time_point epoch_start_ = start_;  // when this member saw the current epoch begin
  double ended_seconds_ = 0;        // how long the last epoch took, as this member saw it
  Report report_;
  std::optional<amp::GradScaler> scaler_;  // --amp fp16
};

}  // namespace

int train_fault_tolerant(const TrainPlan& plan, const Data& data, FaultTolerantStrategy& strategy, ft::ElasticGroup& elastic,
                         BalancedBatches& batches, int64_t first_epoch) {
  try {
    FaultTolerantLoop(plan, data, strategy, elastic, batches, first_epoch).run();
  } catch (const ft::TrainingComplete& e) {  // a replacement that came after the end
    std::printf("datapar train: %s\n", e.what());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace datapar::tools
