// datapar train: the training loop, readable top to bottom (see train.h for the modes).
//
// Steps: 1. check the options (plan_training; nothing runs before it passes)
//        2. join the job (ddp only)   3. load the data   4. build the model, seeded
//        5. resume from a checkpoint  6. wrap it: single / DataParallel / DDP, and its optimizer
//        7. per epoch: train, evaluate exactly, checkpoint, report (rank 0)
// run_plan() does 2-4 and calls run() for 5-7; the helpers above each are in that order.
//
// Metrics are exact over ranks: training sums (loss x rows, correct, rows) and the test
// counts are all-reduced; the test set is read with the sampler's evaluation mode, whose
// padding rows are skipped, so every test sample counts exactly once however many ranks.
#include "train.h"

#include <ATen/Parallel.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "datapar/autograd/checkpoint_wrapper.h"
#include "datapar/cpu_allocator.h"
#include "datapar/data/balanced_batches.h"
#include "datapar/data/fashion_mnist.h"
#include "datapar/data/loader.h"
#include "datapar/data/synthetic.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/rank_balancer.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/ft/fault_tolerant_ddp.h"
#include "datapar/ft/fault_tolerant_fsdp.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/parallel/data_parallel.h"
#include "datapar/process_group/gloo.h"
#include "datapar/process_group/metadata.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/train/checkpoint.h"
#include "datapar/train/dcp_checkpoint.h"
#include "datapar/train/metrics.h"
#include "datapar/train/optimizer_state.h"
#include "datapar/train/plot.h"
#include "datapar/train/resume_agreement.h"
#include "datapar/trace.h"
#include "datapar/ft/launched_job.h"
#include "trajectory_flags.h"

namespace datapar::tools {
namespace {

using Clock = std::chrono::steady_clock;
using Forward = std::function<at::Tensor(const at::Tensor&)>;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The first `limit` samples (all when limit is 0 or larger than the set).
std::shared_ptr<TensorDataset> take(const TensorDataset& d, int64_t limit) {
  if (limit <= 0 || limit >= d.size()) return std::make_shared<TensorDataset>(d.data(), d.target());
  return std::make_shared<TensorDataset>(d.data().narrow(0, 0, limit), d.target().narrow(0, 0, limit));
}

struct Data {
  std::shared_ptr<TensorDataset> train, test;
};

Data load_data(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  if (plan.data_dir.empty()) {  // synthetic: the subset's sizes, one task per seed
    SyntheticImagesOptions s;
    s.seed = o.seed;
    s.size = 6000;
    const TensorDataset train = make_synthetic_images(s);
    s.size = 1000;
    s.train = false;
    return {take(train, o.limit), take(make_synthetic_images(s), o.limit)};
  }
  FashionMnistOptions f;
  f.root = plan.data_dir;
  f.limit = o.limit;  // read no more than is used: memory follows --limit, not the files
  const FashionMnist train(f);
  f.train = false;
  return {take(train, o.limit), take(FashionMnist(f), o.limit)};
}

// d2l initialises ResNet-18's convolutions and linear layers from N(0, 0.01^2).
void d2l_init(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto* conv = m->as<torch::nn::Conv2dImpl>()) conv->weight.normal_(0, 0.01);
    if (auto* linear = m->as<torch::nn::LinearImpl>()) linear->weight.normal_(0, 0.01);
  }
}

// d2l initialises LeNet's convolutions and linear layers with Xavier-uniform: with
// sigmoids, PyTorch's default initialisation leaves LeNet at chance for many epochs.
void xavier_init(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto* conv = m->as<torch::nn::Conv2dImpl>()) torch::nn::init::xavier_uniform_(conv->weight);
    if (auto* linear = m->as<torch::nn::LinearImpl>()) torch::nn::init::xavier_uniform_(linear->weight);
  }
}

// Sums (or maxima) of `values` over the job, through the group's device (nccl: the GPU);
// the values themselves outside ddp.
template <typename T>
std::vector<T> reduce(const std::vector<T>& values, ReduceOp op, ProcessGroup* over = nullptr) {
  if (over == nullptr && !is_initialized()) return values;
  ProcessGroup& group = over != nullptr ? *over : *default_group();
  at::Tensor t = metadata_tensor(group, values);
  group.all_reduce(t, op)->synchronize();
  if constexpr (std::is_same_v<T, int64_t>) {
    return host_int64s(t);
  } else {
    return host_doubles(t);
  }
}

// Which part of the test set a rank evaluates: part `rank` of `size`, the parts summed over
// `group` (nullptr: the job's default group; unused when size is 1).
struct EvalPart {
  int rank = 0;
  int size = 1;
  ProcessGroup* group = nullptr;
};

// Test accuracy, exact over all ranks: returns {correct, samples} summed over the parts
// (by default one per rank of the job).
std::pair<int64_t, int64_t> evaluate(const TrainPlan& plan, const Data& data, torch::nn::Module& model,
                                     const Forward& forward, const c10::Device& device,
                                     std::optional<EvalPart> part = std::nullopt) {
  const EvalPart p = part.value_or(EvalPart{plan.rank, plan.world_size, nullptr});
  torch::NoGradGuard no_grad;
  model.eval();
  DistributedSampler sampler(DistributedSamplerOptions::evaluation(data.test->size(), p.size, p.rank));
  DataLoader loader(data.test, {plan.rank_batch, plan.options.workers});
  loader.start_epoch(sampler);
  int64_t correct = 0, samples = 0;  // padding rows skipped
  while (auto batch = loader.next()) {
    const at::Tensor predicted = forward(batch->data.to(device)).argmax(1).cpu();
    const at::Tensor real = batch->is_padding.logical_not();
    correct += predicted.eq(batch->target).logical_and(real).sum().item<int64_t>();
    samples += real.sum().item<int64_t>();
  }
  if (p.size == 1) return {correct, samples};
  const std::vector<int64_t> counts = reduce(std::vector<int64_t>{correct, samples}, ReduceOp::kSum, p.group);
  return {counts[0], counts[1]};
}

// Reads the epochs before `first_epoch` back from a resumed run's metrics file, so that the
// file and the plot cover the whole run; later lines (an epoch after the checkpoint) go.
std::vector<train::EpochMetrics> earlier_epochs(const std::string& path, int64_t first_epoch) {
  std::vector<train::EpochMetrics> kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    train::EpochMetrics m = train::from_json(line);
    if (m.epoch <= first_epoch) kept.push_back(m);
  }
  return kept;
}

// "171,85": rows per device or rank, as printed when they change.
std::string join(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

// Rank 0 says when --balance auto moves the split, and why. Each of the balancer's
// measurements covers `steps_per_measurement` steps (RankBalancer sums its interval).
void report_balance(const char* who, int64_t step, const std::vector<int64_t>& rows, const LoadBalancer& balancer,
                    int64_t steps_per_measurement = 1) {
  const auto milliseconds = [](const std::vector<double>& seconds) {
    std::string text;
    for (double c : seconds) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%s%.3g", text.empty() ? "" : ",", c * 1e3);
      text += buffer;
    }
    return text;
  };
  std::vector<double> fixed = balancer.fixed_seconds();
  for (double& f : fixed) f /= static_cast<double>(steps_per_measurement);
  const bool any_fixed = std::any_of(fixed.begin(), fixed.end(), [](double f) { return f > 0; });
  std::printf("balance: step %ld: rows per %s %s (measured ms per row %s%s%s)\n", (long)step, who,
              join(rows).c_str(), milliseconds(balancer.seconds_per_row()).c_str(),
              any_fixed ? "; fixed ms per step " : "", any_fixed ? milliseconds(fixed).c_str() : "");
  std::fflush(stdout);
}

// 5 (--checkpoint-format dcp). The newest complete epoch-N directory, loaded by every rank
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

// 5. Resumes (or, for --evaluate, loads) the newest checkpoint that loads; every rank
// loads onto its device. Note [Damaged checkpoints] (checkpoint.h): rank 0 moves damaged
// ones aside, so that this run, which writes those epochs again, cannot overwrite them
// (--evaluate moves nothing). With none intact, a run that had checkpoints (damaged ones,
// or ones moved aside before) stops unless --start-over, and so does an explicit --resume
// with none at all; only a launcher's restart before the first checkpoint starts from
// epoch 1 by itself. Returns the epochs the checkpoint holds: 0 starts from epoch 1.
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

// What StepOptimizer needs of FullyShardedDataParallel, whatever the model's type.
struct ShardedModel {
  std::vector<at::Tensor> shards;
  std::function<StateDict()> full_state_dict;
  std::function<train::OptimizerState(const torch::optim::Optimizer&)> full_optimizer_state;
  std::function<void(torch::optim::Optimizer&, const train::OptimizerState&)> load_full_optimizer_state;
};

// 6. The step's optimizer, one interface for the epoch loop and the checkpoint: SGD; under
// --zero (ZeRO-1) each rank's shard of it, which takes its state from the restored SGD,
// whose own state then goes; under fsdp an SGD over the shards, which takes its part of the
// restored SGD's state the same way.
class StepOptimizer {
 public:
  // `parameters`: DDP's, for --zero; unused otherwise.
  StepOptimizer(torch::optim::SGD& sgd, bool zero, std::vector<at::Tensor> parameters) : sgd_(sgd) {
    if (!zero) return;
    const torch::optim::SGDOptions options = static_cast<const torch::optim::SGDOptions&>(sgd.defaults());
    zero_ = std::make_unique<ZeroRedundancyOptimizer>(std::move(parameters), [options](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(std::move(p), options);
    });
    zero_->load_full_state(sgd);
    sgd.state().clear();
  }

  // fsdp. `restored`: the SGD's state, taken before the model was sharded.
  StepOptimizer(torch::optim::SGD& sgd, ShardedModel sharded, const train::OptimizerState& restored)
      : sgd_(sgd), sharded_(std::move(sharded)) {
    shards_ = std::make_unique<torch::optim::SGD>(sharded_.shards,
                                                  static_cast<const torch::optim::SGDOptions&>(sgd.defaults()));
    sharded_.load_full_optimizer_state(*shards_, restored);
    sgd.state().clear();
  }

  void zero_grad() {
    if (zero_) {
      zero_->zero_grad();
    } else {
      stepped().zero_grad();
    }
  }

  void step() {
    if (zero_) {
      zero_->step();  // this rank's shard, then every rank's parameters to all
    } else {
      stepped().step();
    }
  }

  // Every rank holds the same parameters; rank 0 writes (atomically) for all. Under --zero
  // the whole state is gathered on rank 0 first (every rank takes part), under fsdp on every
  // rank: the checkpoint is the one plain SGD writes, and resumes in any mode. In the dcp
  // format every rank writes its share, under --zero its own optimizer shard, in the names a
  // whole SGD has: that checkpoint too resumes in any mode.
  void save_checkpoint(const torch::nn::Module& model, int64_t epoch, const TrainPlan& plan) {
    const std::string path = train::checkpoint_path(plan.options.checkpoint_dir, epoch);
    const train::Progress progress = {{"seed", static_cast<int64_t>(plan.options.seed)}};
    if (plan.options.checkpoint_format == "dcp") {
      train::Checkpoint c;
      if (!shards_) c = train::make_checkpoint(model, sgd_, epoch, progress);  // under --zero: no state (zero_ has it)
      if (shards_) {
        c.model = sharded_.full_state_dict();
        c.optimizer = sharded_.full_optimizer_state(*shards_);
        c.epoch = epoch;
        c.progress = progress;
        c.rng = train::get_rng_state();
      }
      train::save_dcp_checkpoint(c, model, train::dcp_checkpoint_path(plan.options.checkpoint_dir, epoch),
                                 is_initialized() ? default_group().get() : nullptr, zero_.get());
      return;
    }
    if (shards_) {
      train::Checkpoint c;
      c.model = sharded_.full_state_dict();
      c.optimizer = sharded_.full_optimizer_state(*shards_);
      c.epoch = epoch;
      c.progress = progress;
      c.rng = train::get_rng_state();
      train::save_checkpoint(c, path, plan.rank);
      return;
    }
    const std::unique_ptr<torch::optim::Optimizer> whole = zero_ ? zero_->consolidate(0) : nullptr;
    if (zero_ && !whole) return;  // not rank 0
    train::save_checkpoint(train::make_checkpoint(model, whole ? *whole : sgd_, epoch, progress), path, plan.rank);
  }

 private:
  torch::optim::SGD& stepped() { return shards_ ? *shards_ : sgd_; }

  torch::optim::SGD& sgd_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;
  ShardedModel sharded_;
  std::unique_ptr<torch::optim::SGD> shards_;
};

// What one epoch's training gave, summed (or, for times, the maximum) over the job.
struct EpochTotals {
  double loss_sum = 0, correct = 0, rows = 0;  // loss x rows, right answers, rows
  double seconds = 0, data_wait_seconds = 0;   // as long as its slowest rank
};

// 7c. Rank 0's account of the run: an epoch line per epoch, the metrics file (a resumed
// run keeps the epochs before its checkpoint, so that the file and the plot cover the
// whole run) and the plot, redrawn every epoch so that a long run always has a current one.
class Report {
 public:
  // `writer`: this process reports (rank 0; under --fault-tolerant, see take_over()).
  Report(const TrainPlan& plan, int64_t first_epoch, bool writer) : plan_(plan) {
    if (writer) take_over(first_epoch + 1);
  }
  Report(const TrainPlan& plan, int64_t first_epoch) : Report(plan, first_epoch, plan.rank == 0) {}

  // This process reports from epoch `epoch` on. Under --fault-tolerant the reporter is each
  // epoch's rank 0, which can be another member each time: it takes the epochs before from
  // the metrics file the earlier reporters wrote (without --metrics, the plot shows the
  // epochs this member reported).
  void take_over(int64_t epoch) {
    const TrainOptions& o = plan_.options;
    if (o.metrics.empty()) return;
    history_ = epoch > 1 ? earlier_epochs(o.metrics, epoch - 1) : std::vector<train::EpochMetrics>{};
    metrics_ = std::make_unique<train::MetricsWriter>(o.metrics, /*append=*/false);
    for (const auto& m : history_) metrics_->write(m);
  }

  // `print`: the epoch line too (the fault-tolerant loop prints its own).
  void epoch(int64_t epoch, const EpochTotals& t, std::pair<int64_t, int64_t> test, double eval_seconds,
             bool print = true) {
    const TrainOptions& o = plan_.options;
    train::EpochMetrics m;
    m.epoch = epoch;
    m.epochs = o.epochs;
    m.train_samples = static_cast<int64_t>(t.rows);
    m.train_loss = t.loss_sum / m.train_samples;
    m.train_accuracy = t.correct / m.train_samples;
    m.test_correct = test.first;
    m.test_samples = test.second;
    m.test_accuracy = test.second ? static_cast<double>(test.first) / test.second : 0.0;
    m.seconds = t.seconds;
    m.samples_per_second = m.train_samples / m.seconds;
    m.eval_seconds = eval_seconds;
    m.data_wait_seconds = t.data_wait_seconds;
    m.data_wait_share = m.data_wait_seconds / m.seconds;
    m.model = o.model;
    m.mode = o.mode;
    m.devices = plan_.devices_label;
    m.world_size = plan_.world_size;
    m.batch_size = plan_.global_batch;
    m.lr = plan_.lr;
    if (print) {
      std::printf("%s\n", train::format_epoch_line(m).c_str());
      std::fflush(stdout);
    }
    history_.push_back(m);
    if (metrics_) metrics_->write(m);
    if (!o.plot.empty()) {
      train::plot_metrics(history_, o.plot,
                          "datapar train: " + o.model + ", " + o.mode + " on " + plan_.devices_label + ", batch " +
                              std::to_string(plan_.global_batch) + ", lr " + std::to_string(plan_.lr).substr(0, 6));
    }
  }

 private:
  const TrainPlan& plan_;
  std::vector<train::EpochMetrics> history_;
  std::unique_ptr<train::MetricsWriter> metrics_;
};

template <typename Impl>
int run(const TrainPlan& plan, const Data& data, std::shared_ptr<Impl> model) {
  const TrainOptions& o = plan.options;
  const bool leader = plan.rank == 0;
  const c10::Device device = plan.devices.front().torch_device();
  model->to(device);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(plan.lr).momentum(o.momentum));

  // 5. Resume.
  const int64_t first_epoch = plan.resume || o.evaluate ? resume(plan, *model, sgd, device) : 0;

  // 6. The forward of the mode, and its optimizer. DataParallel and DDP are built after the
  // restore: DP's replicas and DDP's initial broadcast start from the restored parameters.
  std::unique_ptr<DataParallel<Impl>> dp;
  std::unique_ptr<DistributedDataParallel<Impl>> ddp;
  std::unique_ptr<FullyShardedDataParallel<Impl>> fsdp;
  std::unique_ptr<StepOptimizer> optimizer;
  if (o.checkpoint_activations) checkpoint_each<models::ResidualImpl>(*model);
  Forward forward = [&](const at::Tensor& x) { return model->forward(x); };
  if (o.mode == "dp") {
    DataParallelOptions options;
    options.devices = plan.devices;
    options.replicas = o.replicas == "copy" ? ReplicaStorage::kCopy : ReplicaStorage::kShared;
    options.auto_balance = o.balance == "auto";
    options.device_weights = plan.balance_weights;
    dp = std::make_unique<DataParallel<Impl>>(model, options);
    forward = [&](const at::Tensor& x) { return dp->forward(x); };
  } else if (o.mode == "ddp") {
    DdpOptions options;
    options.average_by_samples = true;  // an uneven last batch still gives the exact gradient
    ddp = std::make_unique<DistributedDataParallel<Impl>>(model, nullptr, options);
    forward = [&](const at::Tensor& x) { return ddp->forward(x); };
  } else if (o.mode == "fsdp") {
    FsdpOptions options;
    options.reshard_after_forward = o.reshard;
    options.average_by_samples = true;
    if (o.mp != "none") {
      options.param_dtype = o.mp == "bf16" ? at::kBFloat16 : at::kHalf;
      options.buffer_dtype = options.param_dtype;  // BatchNorm computes in one dtype on the CPU
    }
    const train::OptimizerState restored = train::optimizer_state_dict(sgd);
    // Units: each layer with parameters in the models' Sequentials (a residual block whole);
    // the rest (resnet18's stem) is the root's.
    fully_shard_each<torch::nn::LinearImpl, torch::nn::Conv2dImpl, models::ResidualImpl,
                     CheckpointedImpl<models::ResidualImpl>>(*model, nullptr, options);
    fsdp = std::make_unique<FullyShardedDataParallel<Impl>>(model, nullptr, options);
    forward = [&](const at::Tensor& x) { return fsdp->forward(x).to(at::kFloat); };  // the loss in float32
    ShardedModel sharded{fsdp->parameters(), [&] { return fsdp->full_state_dict(); },
                         [&](const torch::optim::Optimizer& opt) { return fsdp->full_optimizer_state(opt); },
                         [&](torch::optim::Optimizer& opt, const train::OptimizerState& state) {
                           fsdp->load_full_optimizer_state(opt, state);
                         }};
    optimizer = std::make_unique<StepOptimizer>(sgd, std::move(sharded), restored);
  }
  if (!optimizer) {
    optimizer = std::make_unique<StepOptimizer>(sgd, o.zero, o.zero ? ddp->parameters() : std::vector<at::Tensor>{});
  }

  if (o.evaluate) {
    const auto [correct, samples] = evaluate(plan, data, *model, forward, device);
    if (leader) {
      std::printf("test acc %.4f (%ld/%ld)  checkpoint epoch %ld  devices %s (%s%s)\n",
                  samples ? double(correct) / samples : 0.0, (long)correct, (long)samples, (long)first_epoch,
                  plan.devices_label.c_str(), o.mode.c_str(),
                  plan.world_size > 1 || o.mode == "ddp" || o.mode == "fsdp"
                      ? (", " + std::to_string(plan.world_size) + " ranks").c_str()
                      : "");
    }
    return 0;
  }

  // 7. Epochs: train, evaluate exactly, checkpoint, report. The sampler shuffles by
  // seed + epoch, the same on every rank and in every mode, so a resumed run reads exactly
  // the batches the uninterrupted one would have.
  Report report(plan, first_epoch);
  train::ProgressBar bar(stdout, leader && train::is_terminal(stdout));
  DistributedSamplerOptions sampler_options{data.train->size(), plan.world_size, plan.rank};
  sampler_options.seed = o.seed;
  DistributedSampler sampler(sampler_options);
  DataLoaderOptions loader_options{plan.rank_batch, o.workers};
  loader_options.pin_memory = device.is_cuda();  // copies to the GPU that do not wait
  DataLoader loader(data.train, loader_options);
  // ddp --balance auto or W0,W1,...: each global batch split by the ranks' measured speed
  // (rank_balancer.h) or by the given shares; the loader restarts from the next step
  // whenever measured shares change.
  std::unique_ptr<RankBalancer> rank_balancer;
  std::unique_ptr<BalancedBatches> balanced;
  if (ddp && o.balance != "even") {
    if (o.balance == "auto") rank_balancer = std::make_unique<RankBalancer>(ddp->process_group());
    balanced = std::make_unique<BalancedBatches>(BalancedBatchesOptions{
        data.train->size(), plan.global_batch, plan.world_size, plan.rank, /*shuffle=*/true, o.seed});
  }
  auto rank_shares = [&] { return rank_balancer ? rank_balancer->weights() : plan.balance_weights; };
  int64_t dp_rebalances = 0;
  int64_t step = 0;
  for (int64_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
    // 7a. Train: next batch, forward, backward, step.
    model->train();
    if (balanced) {
      balanced->set_epoch(epoch);
      loader.start_epoch(balanced->batches(0, rank_shares()));
    } else {
      sampler.set_epoch(epoch);
      loader.start_epoch(sampler);
    }
    bar.start(epoch + 1, o.epochs, loader.num_batches());
    // Summed on the device, read when the progress bar redraws and at the epoch's end:
    // a read per step would make every step wait for the GPU.
    const at::TensorOptions on_device = at::TensorOptions().device(device);
    at::Tensor loss_sum = at::zeros({}, on_device.dtype(at::kDouble)), correct = at::zeros({}, on_device.dtype(at::kLong));
    int64_t rows = 0, steps = 0;
    std::chrono::nanoseconds data_wait{0};  // over the epoch's loaders (a re-balance restarts it)
    const auto start = Clock::now();
    for (;;) {
      trace::set_step(step);  // the timeline's steps count from the run's first
      std::optional<Batch> batch;
      {
        const trace::Span span("data wait", "data");
        batch = loader.next();
      }
      if (!batch) break;
      const at::Tensor x = batch->data.to(device, /*non_blocking=*/true);
      const at::Tensor y = batch->target.to(device, /*non_blocking=*/true);
      optimizer->zero_grad();
      at::Tensor logits, loss;
      if (rank_balancer) rank_balancer->begin_step(ddp->communication_stats(), plan.devices.front());
      {
        const trace::Span span("forward", "step");
        logits = forward(x);                          // (B, 10)
        loss = at::cross_entropy_loss(logits, y);     // mean over B
      }
      {
        const trace::Span span("backward", "step");
        loss.backward();                              // ddp: gradients averaged over ranks here
      }
      if (rank_balancer && rank_balancer->end_step(x.size(0), ddp->communication_stats())) {
        data_wait += loader.stats().wait;
        loader.start_epoch(balanced->batches(steps + 1, rank_balancer->weights()));
        if (leader) {
          report_balance("rank", step, balanced->rank_rows(0, rank_balancer->weights()), rank_balancer->balancer(),
                         rank_balancer->interval());
        }
      }
      {
        const trace::Span span("optimizer step", "step");
        optimizer->step();
      }
      if (dp && dp->balancer() && dp->balancer()->rebalances() != dp_rebalances) {
        dp_rebalances = dp->balancer()->rebalances();  // measured at this step's forward
        if (leader) report_balance("device", step, dp->last_chunk_sizes(), *dp->balancer());
      }
      ++step;
      loss_sum.add_(loss.detach().to(at::kDouble), static_cast<double>(x.size(0)));
      correct.add_(logits.argmax(1).eq(y).sum());
      rows += x.size(0);
      if (bar.due(++steps)) bar.update(steps, loss_sum.item<double>() / rows, rows * plan.world_size);
    }
    const std::vector<double> sums = reduce(
        std::vector<double>{loss_sum.item<double>(), static_cast<double>(correct.item<int64_t>()), static_cast<double>(rows)},
        ReduceOp::kSum);
    const std::vector<double> times =
        reduce(std::vector<double>{seconds_since(start), (data_wait + loader.stats().wait).count() / 1e9}, ReduceOp::kMax);
    bar.clear();

    // 7b. Evaluate, exactly over the ranks.
    const auto eval_start = Clock::now();
    std::optional<trace::Span> evaluating;
    evaluating.emplace("evaluate", "epoch");
    const std::pair<int64_t, int64_t> test = evaluate(plan, data, *model, forward, device);
    evaluating.reset();
    const double eval_seconds = seconds_since(eval_start);

    // 7c. Checkpoint, and report.
    if (!o.checkpoint_dir.empty()) {
      const trace::Span span("checkpoint", "epoch");
      optimizer->save_checkpoint(*model, epoch + 1, plan);
    }
    if (leader) report.epoch(epoch + 1, {sums[0], sums[1], sums[2], times[0], times[1]}, test, eval_seconds);
  }
  if (leader && first_epoch >= o.epochs) std::printf("nothing to do: the checkpoint has %ld epochs\n", (long)first_epoch);
  return 0;
}

// What run_fault_tolerant needs of its trainer: ft::FaultTolerantDdp (--mode ddp, with or
// without --zero) or ft::FaultTolerantFsdp (--mode fsdp). The trainers live in `owned`.
struct FtTrainer {
  std::function<int64_t()> step, epochs_joined;
  // train(forward, slice) trains one fixed slice of the step's global batch (ft/slice_gradients.h)
  // and returns its rows; a shadow slice is trained but not counted.
  using Part = std::function<int64_t(const Forward&, const ft::Slice& slice)>;
  std::function<bool(const Part&, const ft::Together&)> train_step;
  std::function<void(const ft::Together&)> finish;
  Forward forward;                               // this epoch's, for evaluation
  std::function<torch::nn::Module&()> module;    // this epoch's
  // Collective: the checkpoint of the model and optimizer now, on the epoch's rank 0.
  std::function<std::optional<train::Checkpoint>(int64_t epoch)> checkpoint;
  std::shared_ptr<void> owned;
};

template <typename Impl>
FtTrainer make_ft_trainer(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd,
                          ft::ElasticGroup& elastic, int64_t step) {
  const TrainOptions& o = plan.options;
  const auto options = static_cast<const torch::optim::SGDOptions&>(sgd.defaults());
  const ft::ShardedOptimizer::Factory make_sgd = [options](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(std::move(p), options);
  };
  FtTrainer t;
  if (o.mode == "fsdp") {
    using Trainer = ft::FaultTolerantFsdp<Impl>;
    FsdpOptions fsdp_options;
    fsdp_options.reshard_after_forward = o.reshard;
    // The units of the fsdp mode (run()); the model starts from `model` and `sgd` (resumed).
    auto trainer = std::make_shared<Trainer>(
        [] { return std::make_shared<Impl>(); },
        [](Impl& m, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& unit_options) {
          fully_shard_each<torch::nn::LinearImpl, torch::nn::Conv2dImpl, models::ResidualImpl,
                           CheckpointedImpl<models::ResidualImpl>>(m, group, unit_options);
        },
        make_sgd, elastic, plan.world_size, fsdp_options,
        typename Trainer::Start{state_dict(*model), train::optimizer_state_dict(sgd), step});
    t.train_step = [trainer](const FtTrainer::Part& train, const ft::Together& before) {
      return trainer->train_step(
          [&](FullyShardedDataParallel<Impl>& fsdp, const ft::Slice& slice) {
            return train([&](const at::Tensor& x) { return fsdp.forward(x); }, slice);
          },
          before);
    };
    t.forward = [trainer](const at::Tensor& x) { return trainer->fsdp().forward(x); };
    t.module = [trainer]() -> torch::nn::Module& { return *trainer->fsdp().module(); };
    t.checkpoint = [trainer, &elastic](int64_t epoch) -> std::optional<train::Checkpoint> {
      train::Checkpoint c;
      c.model = trainer->fsdp().full_state_dict();
      c.optimizer = trainer->fsdp().full_optimizer_state(trainer->optimizer());
      if (elastic.rank() != 0) return std::nullopt;
      c.epoch = epoch;
      c.rng = train::get_rng_state();
      return c;
    };
    t.step = [trainer] { return trainer->step(); };
    t.epochs_joined = [trainer] { return trainer->epochs_joined(); };
    t.finish = [trainer](const ft::Together& last) { trainer->finish(last); };
    t.owned = trainer;
    return t;
  }
  // ddp: the optimizer whole on every rank, or under --zero sharded, each shard kept twice.
  using Trainer = ft::FaultTolerantDdp<Impl>;
  struct Ddp {
    std::unique_ptr<ft::ShardedOptimizer> zero;
    std::unique_ptr<Trainer> trainer;
  };
  auto ddp = std::make_shared<Ddp>();
  // Each global batch in the job's full size of slices, whoever is alive (Note [Gradients
  // that do not depend on who is alive] in src/ft/slice_gradients.cc).
  if (o.zero) {
    ddp->zero = std::make_unique<ft::ShardedOptimizer>(model->parameters(), make_sgd);
    ddp->zero->load_full_state(sgd);  // what resume() restored, if anything
    ddp->trainer = std::make_unique<Trainer>(model, *ddp->zero, elastic, plan.world_size, step);
  } else {
    ddp->trainer = std::make_unique<Trainer>(model, sgd, elastic, plan.world_size, step);
  }
  Trainer* trainer = ddp->trainer.get();
  t.train_step = [trainer](const FtTrainer::Part& train, const ft::Together& before) {
    return trainer->train_step(
        [&](Impl& m, const ft::Slice& slice) {
          return train([&](const at::Tensor& x) { return m.forward(x); }, slice);
        },
        before);
  };
  t.forward = [model](const at::Tensor& x) { return model->forward(x); };
  t.module = [model]() -> torch::nn::Module& { return *model; };
  ft::ShardedOptimizer* zero = ddp->zero.get();
  t.checkpoint = [zero, model, &sgd, &elastic](int64_t epoch) -> std::optional<train::Checkpoint> {
    const std::unique_ptr<torch::optim::Optimizer> gathered = zero ? zero->consolidate(*elastic.group(), 0) : nullptr;
    if (elastic.rank() != 0) return std::nullopt;
    return train::make_checkpoint(*model, gathered ? *gathered : sgd, epoch);
  };
  t.step = [trainer] { return trainer->step(); };
  t.epochs_joined = [trainer] { return trainer->epochs_joined(); };
  t.finish = [trainer](const ft::Together& last) { trainer->finish(last); };
  t.owned = ddp;
  return t;
}

// --fault-tolerant (datapar/ft/fault_tolerant_ddp.h, docs/fault_tolerance.md): step g is
// global batch g of the run (BalancedBatches's order of its epoch, cut for the job's full
// size so that every rank alive has rows), split evenly over the ranks alive at that
// moment, and committed only when every one of them finished it; gradients are averaged by
// samples, so the training does not depend on who is alive. --zero shards the optimizer
// state, each shard kept by two ranks (datapar/ft/sharded_optimizer.h). At each epoch's end
// the ranks alive evaluate a part of the test set each (and, under --zero, gather the
// optimizer state on the first); the first reports and writes the checkpoint.
template <typename Impl>
int run_fault_tolerant(const TrainPlan& plan, const Data& data, std::shared_ptr<Impl> model) {
  const TrainOptions& o = plan.options;
  const c10::Device device = plan.devices.front().torch_device();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(plan.lr).momentum(o.momentum));
  ft::LaunchedJob job = ft::join_launched_job(resolve_job_config(process_environment()));
  check_same_trajectory(*job.store, "ft/" + ft::kLaunchedRun + "/trajectory", trajectory_flags(plan, data.train->size()));
  ft::ElasticGroup& elastic = *job.elastic;
  // Each epoch's global batches, as a job of the full size cuts its epochs (global_batch()).
  BalancedBatches batches(
      {data.train->size(), plan.global_batch, plan.world_size, 0, /*shuffle=*/true, static_cast<uint64_t>(o.seed)});
  const int64_t per_epoch = batches.num_steps();
  // --resume: from the newest checkpoint this rank can load. Ranks need not agree: one that
  // loaded an older checkpoint (or none: a replacement started later) takes the newest
  // step's state from a peer when it joins.
  const int64_t first_epoch = plan.resume ? resume(plan, *model, sgd, device) : 0;
  const FtTrainer trainer = make_ft_trainer(plan, model, sgd, elastic, first_epoch * per_epoch);

  const int64_t total = per_epoch * o.epochs;
  int64_t batches_epoch = -1;  // the epoch `batches` is set to
  struct Rows {  // this rank's committed rows of an epoch
    double loss_sum = 0;
    int64_t rows = 0, correct = 0;
  } current, ended;
  int64_t ended_at = -1;                        // the step at which `ended` ended
  int64_t reported = first_epoch * per_epoch;   // the last epoch end this rank reported
  int64_t memberships_seen = 0;                 // trainer.epochs_joined() when last reported
  const auto start = Clock::now();
  auto epoch_start = start;   // when this member saw the current epoch begin
  double ended_seconds = 0;   // how long the last epoch took, as this member saw it
  Report report(plan, first_epoch, /*writer=*/false);
  // An epoch's end, before the next epoch's first step and after the last step: run by
  // every member together, and again over a new membership when one fails in it (the
  // report and checkpoint are written once, by the first rank, unless it changed).
  const auto epoch_end = [&](int rank, int size) {
    const int64_t step = trainer.step();
    if (step == 0 || step % per_epoch != 0) return;
    if (ended_at != step) {  // the first run of this epoch end: its rows are done
      ended_at = step;
      ended = current;
      current = {};
      ended_seconds = seconds_since(epoch_start);
      epoch_start = Clock::now();
    }
    // The epoch's rows as the members alive saw them commit (all of them when none failed).
    const std::vector<double> job_rows = reduce(
        std::vector<double>{ended.loss_sum, double(ended.correct), double(ended.rows)}, ReduceOp::kSum,
        elastic.group().get());
    const auto eval_start = Clock::now();
    const auto [right, samples] = evaluate(plan, data, trainer.module(), trainer.forward, device,
                                           EvalPart{rank, size, elastic.group().get()});
    const double eval_seconds = seconds_since(eval_start);
    std::optional<train::Checkpoint> checkpoint;  // gathered only when one is written
    if (!o.checkpoint_dir.empty()) checkpoint = trainer.checkpoint(step / per_epoch);
    if (rank != 0 || step <= reported) return;
    reported = step;
    const int64_t epoch = step / per_epoch;
    std::printf("epoch %ld/%ld  loss %.4f  train acc %.4f (rank 0's rows)  test acc %.4f  %.1f s  %d ranks "
                "(membership epoch %ld)\n",
                (long)epoch, (long)o.epochs, ended.rows ? ended.loss_sum / ended.rows : 0.0,
                ended.rows ? double(ended.correct) / ended.rows : 0.0, samples ? double(right) / samples : 0.0,
                seconds_since(start), size, (long)elastic.epoch().number);
    std::fflush(stdout);
    if (!o.metrics.empty() || !o.plot.empty()) {
      report.take_over(epoch);
      report.epoch(epoch, EpochTotals{job_rows[0], job_rows[1], job_rows[2], ended_seconds, 0}, {right, samples},
                   eval_seconds, /*print=*/false);
    }
    if (o.checkpoint_dir.empty()) return;
    checkpoint->progress = {{"seed", static_cast<int64_t>(o.seed)}};
    train::save_checkpoint(*checkpoint, train::checkpoint_path(o.checkpoint_dir, epoch), 0);
  };
  try {
    while (trainer.step() < total) {
      Rows step_rows;  // this rank's parts of the step
      const bool committed = trainer.train_step(
          [&](const Forward& forward, const ft::Slice& slice) -> int64_t {
            const int64_t step = trainer.step();
            if (step / per_epoch != batches_epoch) {
              batches_epoch = step / per_epoch;
              batches.set_epoch(batches_epoch);
            }
            const at::Tensor global = batches.global_batch(step % per_epoch);
            const int64_t n = global.size(0), begin = slice.begin(n), end = slice.end(n);
            const Batch batch = data.train->get_batch(global.narrow(0, begin, end - begin));
            const at::Tensor y = batch.target.to(device);
            trainer.module().train();
            const at::Tensor logits = forward(batch.data.to(device));
            const at::Tensor loss = at::cross_entropy_loss(logits, y);
            loss.backward();
            if (slice.shadow) return y.size(0);
            step_rows.loss_sum += loss.item<double>() * static_cast<double>(y.size(0));
            step_rows.correct += logits.argmax(1).eq(y).sum().item<int64_t>();
            step_rows.rows += y.size(0);
            return y.size(0);
          },
          epoch_end);
      if (!committed) continue;
      if (trainer.epochs_joined() != memberships_seen) {  // the first step of a new membership
        memberships_seen = trainer.epochs_joined();
        if (elastic.rank() == 0) {
          std::printf("membership epoch %ld: %d ranks, training from step %ld  %.1f s\n", (long)elastic.epoch().number,
                      elastic.size(), (long)trainer.step() - 1, seconds_since(start));
          std::fflush(stdout);
        }
      }
      current.loss_sum += step_rows.loss_sum;
      current.correct += step_rows.correct;
      current.rows += step_rows.rows;
    }
    trainer.finish(epoch_end);
  } catch (const ft::TrainingComplete& e) {  // a replacement that came after the end
    std::printf("datapar train: %s\n", e.what());
    std::fflush(stdout);
  }
  return 0;
}

int run_plan(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  // Intra-op threads: ddp ranks share the cores of their node; dp gives each device its
  // share itself.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.threads > 0) {
    at::set_num_threads(o.threads);
  } else if (o.mode == "ddp" || o.mode == "fsdp") {
    at::set_num_threads(std::max(1, cores / plan.local_world_size));
  } else if (o.mode == "dp" && plan.devices.front().is_cpu()) {
    at::set_num_threads(1);  // the CPU devices' workers have the cores (README, Performance)
  }
  tune_cpu_allocator();

  // 2. Join the job before loading data, so that a rank that cannot join fails fast.
  if (!o.trace.empty()) {
    trace::start();
    trace::name_thread("main");
  }
  if ((o.mode == "ddp" || o.mode == "fsdp") && !o.fault_tolerant) {
    // The nccl group takes cuda:LOCAL_RANK (nccl.h), where plan_training put this rank's
    // model; mpirun and srun give the local rank under other names.
    JobConfig config = resolve_job_config();
    if (!config.local_rank) config.local_rank = std::to_string(plan.local_rank);
    init_process_group(o.backend, "env://", plan.rank, plan.world_size, kDefaultTimeout, config);
  }

  // 3. Data (FashionMnist names any missing or damaged file here, still before training).
  const Data data = load_data(plan);
  if (plan.rank == 0) {
    std::printf("datapar train: %s, %s on %s%s, batch %ld (%ld per %s), lr %g, %ld train / %ld test samples (%s)\n",
                o.model.c_str(), o.mode.c_str(), plan.devices_label.c_str(),
                o.mode == "ddp" || o.mode == "fsdp"
                    ? (", " + std::to_string(plan.world_size) + " ranks on " + o.backend +
                       (o.zero ? ", optimizer state sharded (ZeRO-1)" : "") +
                       (o.mode == "fsdp" ? std::string(o.reshard ? ", resharded after forward" : ", kept until backward") +
                                               (o.mp != "none" ? ", parameters in " + o.mp : "")
                                         : "") +
                       (o.checkpoint_activations ? ", activations recomputed" : ""))
                          .c_str()
                    : "",
                (long)plan.global_batch,
                (long)(o.mode == "dp" ? (plan.global_batch + plan.parallelism - 1) / plan.parallelism : plan.rank_batch),
                o.mode == "single" ? "step" : (o.mode == "dp" ? "device" : "rank"), plan.lr, (long)data.train->size(),
                (long)data.test->size(), plan.data_dir.empty() ? "synthetic" : plan.data_dir.c_str());
    std::fflush(stdout);
  }

  if (plan.rank == 0 && o.balance != "even" && o.mode != "single") {
    std::printf("balance: %s\n", o.balance == "auto" ? "auto (shares follow the measured speeds)"
                                                      : ("fixed shares " + o.balance).c_str());
  }

  // 4. The model, initialised from the seed: the same on every rank and in every mode.
  torch::manual_seed(o.seed);
  int code = 0;
  auto train_model = [&](auto model) {
    return o.fault_tolerant ? run_fault_tolerant(plan, data, model) : run(plan, data, model);
  };
  if (o.model == "mlp") {
    code = train_model(std::make_shared<models::MlpImpl>());
  } else if (o.model == "lenet") {
    auto lenet = std::make_shared<models::LeNetImpl>();
    xavier_init(*lenet);
    code = train_model(lenet);
  } else {
    auto resnet = std::make_shared<models::ResNet18Impl>();
    d2l_init(*resnet);
    code = train_model(resnet);
  }
  if (!o.trace.empty()) {
    trace::save(o.trace);  // every rank: rank 0 writes all ranks' events
    if (plan.rank == 0) std::printf("trace: %s\n", o.trace.c_str());
  }
  if (is_initialized()) destroy_process_group();
  return code;
}

}  // namespace

int train(const TrainOptions& options) {
  TrainPlan plan;
  try {
    plan = plan_training(options);
  } catch (const Error& e) {
    std::fprintf(stderr, "datapar train: %s\n", e.what());
    return 2;
  }
  try {
    return run_plan(plan);
  } catch (const InvalidArgumentError& e) {  // e.g. a missing data file, found at load time
    std::fprintf(stderr, "datapar train: rank %d: %s\n", plan.rank, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "datapar train: rank %d: %s\n", plan.rank, e.what());
    return 1;
  }
}

}  // namespace datapar::tools
