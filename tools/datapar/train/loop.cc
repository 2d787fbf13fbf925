// The training loop. See loop.h.
#include "loop.h"

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "datapar/data/balanced_batches.h"
#include "datapar/data/distributed_sampler.h"
#include "datapar/data/loader.h"
#include "datapar/ddp/rank_balancer.h"
#include "datapar/distributed.h"
#include "datapar/trace.h"
#include "datapar/error.h"
#include "datapar/train/async_checkpoint.h"
#include "datapar/train/cuda_graph_step.h"
#include "datapar/train/metrics.h"
#include "datapar/train/stragglers.h"
#include "evaluation.h"
#include "rank_state.h"
#include "report.h"
#include "step_autocast.h"
#include "timing.h"

namespace datapar::tools {
namespace {

class EpochLoop {
 public:
  EpochLoop(const TrainPlan& plan, const Data& data, Strategy& strategy, int64_t first_epoch)
      : plan_(plan), o_(plan.options), data_(data), strategy_(strategy), device_(plan.devices.front().torch_device()),
        leader_(plan.rank == 0), report_(plan, first_epoch),
        bar_(stdout, leader_ && train::is_terminal(stdout)), sampler_(sampler_options()), loader_(data.train, loader_options()) {
    // ddp --balance auto or W0,W1,...: each global batch split by the ranks' measured speed
    // (rank_balancer.h) or by the given shares; the loader restarts from the next step
    // whenever measured shares change.
    if (has_ranks(plan.mode) && plan.world_size > 1 && device_.is_cpu()) {
      stragglers_ = std::make_unique<train::StragglerMeter>();
    }
    if (o_.amp == "fp16") {  // float16's small gradients scaled up before backward (grad_scaler.h)
      amp::GradScalerOptions options;
      options.group = strategy.sharded_gradients_group();
      scaler_.emplace(options);
      strategy.use_grad_scaler(&*scaler_);
      if (first_epoch > 0) load_scaler_state(plan, *scaler_, first_epoch);
    }
    if (plan.mode == Mode::kDdp && o_.balance != "even") {
      if (o_.balance == "auto") rank_balancer_ = std::make_unique<RankBalancer>(strategy.balanced_group());
      balanced_ = std::make_unique<BalancedBatches>(BalancedBatchesOptions{
          data.train->size(), plan.global_batch, plan.world_size, plan.rank, /*shuffle=*/true, o_.seed});
    }
  }

  ~EpochLoop() {
    if (scaler_) strategy_.use_grad_scaler(nullptr);  // the strategy outlives the loop's scaler
  }
  EpochLoop(const EpochLoop&) = delete;
  EpochLoop& operator=(const EpochLoop&) = delete;

  void run(int64_t first_epoch) {
    for (int64_t epoch = first_epoch; epoch < o_.epochs; ++epoch) {
      const EpochTotals totals = train_epoch(epoch);
      strategy_.end_of_epoch();
      // Evaluate, exactly over the ranks.
      const auto eval_start = Clock::now();
      std::optional<trace::Span> evaluating;
      evaluating.emplace("evaluate", "epoch");
      const std::pair<int64_t, int64_t> test =
          evaluate(plan_, data_, strategy_.module(), [this](const at::Tensor& x) { return strategy_.forward(x); }, device_);
      evaluating.reset();
      const double eval_seconds = seconds_since(eval_start);
      // Checkpoint, and report.
      if (!o_.checkpoint_dir.empty()) {
        const trace::Span span("checkpoint", "epoch");
        strategy_.save_checkpoint(epoch + 1);
        if (scaler_) save_scaler_state(plan_, *scaler_, epoch + 1);  // each rank's: DiLoCo's replicas skip their own steps
      }
      if (leader_) report_.epoch(epoch + 1, totals, test, eval_seconds);
    }
    if (leader_ && first_epoch >= o_.epochs) {
      std::printf("nothing to do: the checkpoint has %ld epochs\n", (long)first_epoch);
    }
  }

 private:
  DistributedSamplerOptions sampler_options() const {
    DistributedSamplerOptions options{data_.train->size(), plan_.world_size, plan_.rank};
    options.seed = o_.seed;
    return options;
  }

  DataLoaderOptions loader_options() const {
    DataLoaderOptions options{plan_.rank_batch, o_.workers};
    options.pin_memory = device_.is_cuda();  // copies to the GPU that do not wait
    return options;
  }

  std::vector<double> rank_shares() const { return rank_balancer_ ? rank_balancer_->weights() : plan_.balance_weights; }

  // One epoch's training: its sums (and, for times, maxima) over the job.
  EpochTotals train_epoch(int64_t epoch) {
    strategy_.module().train();
    if (balanced_) {
      balanced_->set_epoch(epoch);
      loader_.start_epoch(balanced_->batches(0, rank_shares()));
    } else {
      sampler_.set_epoch(epoch);
      loader_.start_epoch(sampler_);
    }
    bar_.start(epoch + 1, o_.epochs, loader_.num_batches());
    // Summed on the device, read when the progress bar redraws and at the epoch's end: a
    // read per step would make every step wait for the GPU.
    const at::TensorOptions on_device = at::TensorOptions().device(device_);
    loss_sum_ = at::zeros({}, on_device.dtype(at::kDouble));
    correct_ = at::zeros({}, on_device.dtype(at::kLong));
    rows_ = 0;
    epoch_steps_ = 0;
    data_wait_ = std::chrono::nanoseconds(0);
    const auto start = Clock::now();
    while (train_step()) {
    }
    const std::vector<double> sums =
        reduce(std::vector<double>{loss_sum_.item<double>(), static_cast<double>(correct_.item<int64_t>()),
                                   static_cast<double>(rows_)},
               ReduceOp::kSum);
    const std::vector<double> times = reduce(
        std::vector<double>{seconds_since(start), (data_wait_ + loader_.stats().wait).count() / 1e9}, ReduceOp::kMax);
    bar_.clear();
    EpochTotals totals{sums[0], sums[1], sums[2], times[0], times[1]};
    if (stragglers_) {
      const train::StragglerReport r = stragglers_->report(*default_group());
      totals.straggler_scores = r.scores;
      totals.straggler = r.straggler;
      if (trace::enabled()) {  // on the timeline too, at the epoch's end
        std::string text = "straggler scores:";
        for (double s : r.scores) text += " " + std::to_string(s).substr(0, 5);
        if (r.straggler >= 0) text += "; straggler: rank " + std::to_string(r.straggler);
        trace::mark(text, "stragglers");
      }
    }
    return totals;
  }

  // The next batch: forward, backward, step. False at the epoch's end.
  bool train_step() {
    trace::set_step(step_);  // the timeline's steps count from the run's first
    std::optional<Batch> batch;
    {
      const trace::Span span("data wait", "data");
      batch = loader_.next();
    }
    if (!batch) return false;
    if (plan_.checkpoint_writer) plan_.checkpoint_writer->check();  // a failed background write, reported now
    const auto step_start = Clock::now();
    const auto waited_before = Work::time_blocked_on_this_thread();
    const at::Tensor x = batch->data.to(device_, /*non_blocking=*/true);
    const at::Tensor y = batch->target.to(device_, /*non_blocking=*/true);
    if (o_.cuda_graph) return graphed_step(x, y);
    strategy_.zero_grad();
    at::Tensor logits, loss;
    if (rank_balancer_) rank_balancer_->begin_step(strategy_.communication_stats(), plan_.devices.front());
    {
      const trace::Span span("forward", "step");
      const StepAutocast autocast(plan_);                       // --amp
      logits = strategy_.forward(x);                            // (B, 10)
      loss = at::cross_entropy_loss(logits.to(at::kFloat), y);  // mean over B
    }
    {
      const trace::Span span("backward", "step");
      (scaler_ ? scaler_->scale(loss) : loss).backward();  // ddp: gradients averaged over ranks here
    }
    if (rank_balancer_ && rank_balancer_->end_step(x.size(0), strategy_.communication_stats())) rebalance();
    {
      const trace::Span span("optimizer step", "step");
      strategy_.step();  // under --amp fp16 skipped on an overflow
      if (scaler_) scaler_->update();
    }
    strategy_.after_step(step_);
    if (o_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.step_delay_ms));
    if (stragglers_) {
      const auto waited = Work::time_blocked_on_this_thread() - waited_before;
      stragglers_->step(seconds_since(step_start), waited.count() / 1e9);
    }
    count_step(loss.detach(), logits.argmax(1).eq(y).sum(), x.size(0));
    return true;
  }

  // A step's loss (a 0-dim tensor) and right answers, on the device: summed there.
  void count_step(const at::Tensor& loss, const at::Tensor& correct, int64_t rows) {
    ++step_;
    loss_sum_.add_(loss.to(at::kDouble), static_cast<double>(rows));
    correct_.add_(correct);
    rows_ += rows;
    if (bar_.due(++epoch_steps_)) bar_.update(epoch_steps_, loss_sum_.item<double>() / rows_, rows_ * plan_.world_size);
  }

  // --cuda-graph: the whole step captured once and replayed (train/cuda_graph_step.h); the
  // epoch's last partial batch is left out (a graph replays one shape; every rank's is
  // partial alike: the sampler pads the ranks' shares to one length).
  bool graphed_step(const at::Tensor& x, const at::Tensor& y) {
    if (!graph_) {
      torch::optim::Optimizer* optimizer = strategy_.whole_optimizer();
      DATAPAR_CHECK(optimizer != nullptr, "--cuda-graph: this mode has no whole optimizer to capture.");
      graph_.emplace(*optimizer, [this](const std::vector<at::Tensor>& in) {
        at::Tensor logits, loss;
        {
          const StepAutocast autocast(plan_);  // --amp bf16
          logits = strategy_.forward(in[0]);
          loss = at::cross_entropy_loss(logits.to(at::kFloat), in[1]);
        }
        loss.backward();
        strategy_.step();
        return std::vector<at::Tensor>{loss.detach(), logits.argmax(1).eq(in[1]).sum()};
      });
    }
    if (!graph_->fits({x, y})) {
      if (leader_ && !told_left_out_) {
        std::printf("--cuda-graph: the last batch of each epoch (%ld rows on this rank) is left out: a graph replays "
                    "the shape it captured\n", static_cast<long>(x.size(0)));
        told_left_out_ = true;
      }
      return true;
    }
    const std::vector<at::Tensor> out = [&] {
      const trace::Span span("graphed step", "step");
      return (*graph_)({x, y});
    }();
    count_step(out[0], out[1], x.size(0));
    strategy_.after_step(step_ - 1);
    return true;
  }

  // The measured shares changed: the rest of the epoch under them, from the next step.
  void rebalance() {
    data_wait_ += loader_.stats().wait;
    loader_.start_epoch(balanced_->batches(epoch_steps_ + 1, rank_balancer_->weights()));
    if (leader_) {
      report_balance("rank", step_, balanced_->rank_rows(0, rank_balancer_->weights()), rank_balancer_->balancer(),
                     rank_balancer_->interval());
    }
  }

  const TrainPlan& plan_;
  const TrainOptions& o_;
  const Data& data_;
  Strategy& strategy_;
  const c10::Device device_;
  const bool leader_;
  Report report_;
  train::ProgressBar bar_;
  DistributedSampler sampler_;
  DataLoader loader_;
  std::unique_ptr<RankBalancer> rank_balancer_;
  std::unique_ptr<BalancedBatches> balanced_;
  // Ranks on CPU devices: who the others wait for, from the time each rank's training thread
  // is blocked in collectives (on a GPU, nccl's waits do not block the host).
  std::unique_ptr<train::StragglerMeter> stragglers_;
  std::optional<amp::GradScaler> scaler_;  // --amp fp16
  std::optional<train::CudaGraphStep> graph_;  // --cuda-graph, made at the first step
  bool told_left_out_ = false;
  int64_t step_ = 0;  // of the run
  // The epoch's, so far:
  at::Tensor loss_sum_, correct_;
  int64_t rows_ = 0, epoch_steps_ = 0;
  std::chrono::nanoseconds data_wait_{0};  // over the epoch's loaders (a re-balance restarts it)
};

}  // namespace

int train_epochs(const TrainPlan& plan, const Data& data, Strategy& strategy, int64_t first_epoch) {
  EpochLoop(plan, data, strategy, first_epoch).run(first_epoch);
  return 0;
}

int evaluate_checkpoint(const TrainPlan& plan, const Data& data, Strategy& strategy, int64_t epoch) {
  const TrainOptions& o = plan.options;
  const auto [correct, samples] = evaluate(plan, data, strategy.module(),
                                           [&](const at::Tensor& x) { return strategy.forward(x); },
                                           plan.devices.front().torch_device());
  if (plan.rank != 0) return 0;
  std::printf("test acc %.4f (%ld/%ld)  checkpoint epoch %ld  devices %s (%s%s)\n",
              samples ? double(correct) / samples : 0.0, (long)correct, (long)samples, (long)epoch,
              plan.devices_label.c_str(), o.mode.c_str(),
              plan.world_size > 1 || has_ranks(plan.mode) ? (", " + std::to_string(plan.world_size) + " ranks").c_str()
                                                          : "");
  return 0;
}

}  // namespace datapar::tools
