// datapar train: the plan run, top to bottom (see train.h for the modes).
//
// Steps: 1. check the options (plan_training, train_options.cc; nothing runs before it passes)
//        2. join the job (ddp, fsdp)   3. load the data (train/data.h)   4. build the model, seeded
//        5. resume from a checkpoint (train/resume.h)
//        6. wrap it in the mode's strategy (train/make_strategy.h: one file per mode)
//        7. per epoch: train, evaluate exactly, checkpoint, report (train/loop.h)
// or, under --fault-tolerant, 5-7 over the launcher's membership: make_strategy.h wraps the
// model in the mode's fault-tolerant strategy (train/fault_tolerant_strategy.h: the library's
// ft::FaultTolerantDdp or ft::FaultTolerantFsdp), train/fault_tolerant_loop.h trains.
//
// Metrics are exact over ranks: training sums (loss x rows, correct, rows) and the test
// counts are all-reduced; the test set is read with the sampler's evaluation mode, whose
// padding rows are skipped, so every test sample counts exactly once however many ranks.
#include "train.h"

#include <ATen/Parallel.h>
#include <torch/nn/init.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>

#include "datapar/cpu_allocator.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/ft/launched_job.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/trace.h"
#include "datapar/train/async_checkpoint.h"
#include "train/data.h"
#include "train/fault_tolerant_loop.h"
#include "train/loop.h"
#include "train/make_strategy.h"
#include "train/optimizer_flags.h"
#include "train/resume.h"
#include "trajectory_flags.h"

namespace datapar::tools {
namespace {

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

// 5-7: resume, wrap, train (or, with --evaluate, evaluate the checkpoint).
template <typename Impl>
int train_model(const TrainPlan& plan, const Data& data, std::shared_ptr<Impl> model) {
  const TrainOptions& o = plan.options;
  const c10::Device device = plan.devices.front().torch_device();
  model->to(device);
  const std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(plan, model->parameters());
  const int64_t first_epoch = plan.resume || o.evaluate ? resume(plan, *model, *optimizer, device) : 0;
  if (o.checkpoint_activations) checkpoint_each<models::ResidualImpl>(*model);
  const std::unique_ptr<Strategy> strategy = make_strategy(plan, model, *optimizer);
  if (o.evaluate) return evaluate_checkpoint(plan, data, *strategy, first_epoch);
  if (first_epoch > 0) strategy->resumed(first_epoch);
  return train_epochs(plan, data, *strategy, first_epoch);
}

// 5-7 under --fault-tolerant: this worker joins the launcher's membership; ranks need not
// agree on --resume's checkpoint: one that loaded an older one (or none: a replacement
// started later) takes the newest step's state from a peer when it joins.
template <typename Impl>
int train_model_fault_tolerant(const TrainPlan& plan, const Data& data, std::shared_ptr<Impl> model) {
  const TrainOptions& o = plan.options;
  const c10::Device device = plan.devices.front().torch_device();
  const std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(plan, model->parameters());
  // --mode hsdp: fault tolerance between replica groups (each a shard group).
  ft::LaunchedJob job = ft::join_launched_job(resolve_job_config(process_environment()),
                                              plan.mode == Mode::kHsdp ? plan.shard_size : 1);
  check_same_trajectory(*job.store, "ft/" + ft::kLaunchedRun + "/trajectory", trajectory_flags(plan, data.train->size()));
  // Each epoch's global batches, as a job of the full size cuts its epochs (global_batch()).
  BalancedBatches batches(
      {data.train->size(), plan.global_batch, plan.world_size, 0, /*shuffle=*/true, static_cast<uint64_t>(o.seed)});
  const int64_t first_epoch = plan.resume ? resume(plan, *model, *optimizer, device) : 0;
  const std::unique_ptr<FaultTolerantStrategy> strategy =
      make_fault_tolerant(plan, model, *optimizer, *job.elastic, first_epoch * batches.num_steps(),
                          batches.num_steps());
  return train_fault_tolerant(plan, data, *strategy, *job.elastic, batches, first_epoch);
}

// Intra-op threads: ranks share the cores of their node; dp gives each device its share
// itself. And the CPU allocator, tuned for training.
void set_threads(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.threads > 0) {
    at::set_num_threads(o.threads);
  } else if (has_ranks(plan.mode)) {
    at::set_num_threads(std::max(1, cores / plan.local_world_size));
  } else if (plan.mode == Mode::kDataParallel && plan.devices.front().is_cpu()) {
    at::set_num_threads(1);  // the CPU devices' workers have the cores (docs/usage.md, Performance on CPU devices)
  }
  tune_cpu_allocator();
}

// 2. Joins the job before the data is loaded, so that a rank that cannot join fails fast.
void join_job(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  if (!o.trace.empty()) {
    trace::start();
    trace::name_thread("main");
  }
  if (has_ranks(plan.mode) && !o.fault_tolerant) {
    // The nccl group takes cuda:LOCAL_RANK (nccl.h), where plan_training put this rank's
    // model; mpirun and srun give the local rank under other names.
    JobConfig config = resolve_job_config();
    if (!config.local_rank) config.local_rank = std::to_string(plan.local_rank);
    init_process_group(o.backend, "env://", plan.rank, plan.world_size, kDefaultTimeout, config);
  }
}

// The banner's words for the ranks of a job: how many, on what, sharded how.
std::string ranks_label(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  std::string label = ", " + std::to_string(plan.world_size) + " ranks on " + o.backend;
  if (o.zero) label += ", optimizer state sharded (ZeRO-1)";
  if (plan.mode == Mode::kHsdp) {
    label += ", sharded over groups of " + std::to_string(plan.shard_size) + ", replicated " +
             std::to_string(plan.world_size / plan.shard_size) + " times";
  }
  if (is_fully_sharded(plan.mode)) {
    label += o.reshard ? ", resharded after forward" : ", kept until backward";
    if (o.mp != "none") label += ", parameters in " + o.mp;
  }
  if (o.checkpoint_activations) label += ", activations recomputed";
  if (o.amp != "none") label += ", autocast to " + o.amp;
  return label;
}

// Rank 0's first lines: what trains, where, on what.
void print_banner(const TrainPlan& plan, const Data& data) {
  const TrainOptions& o = plan.options;
  if (plan.rank != 0) return;
  const bool dp = plan.mode == Mode::kDataParallel;
  // The optimizer when not plain SGD: "lr 0.001 (adamw, weight decay 0.01)".
  char optimizer[96] = "";
  if (plan.weight_decay != 0) {
    std::snprintf(optimizer, sizeof optimizer, " (%s, weight decay %g)", o.optimizer.c_str(), plan.weight_decay);
  } else if (o.optimizer != "sgd") {
    std::snprintf(optimizer, sizeof optimizer, " (%s)", o.optimizer.c_str());
  }
  std::printf("datapar train: %s, %s on %s%s, batch %ld (%ld per %s), lr %g%s, %ld train / %ld test samples (%s)\n",
              o.model.c_str(), o.mode.c_str(), plan.devices_label.c_str(),
              has_ranks(plan.mode) ? ranks_label(plan).c_str() : "", (long)plan.global_batch,
              (long)(dp ? (plan.global_batch + plan.parallelism - 1) / plan.parallelism : plan.rank_batch),
              plan.mode == Mode::kSingle ? "step" : (dp ? "device" : "rank"), plan.lr, optimizer,
              (long)data.train->size(),
              (long)data.test->size(), plan.data_dir.empty() ? "synthetic" : plan.data_dir.c_str());
  if (o.balance != "even" && plan.mode != Mode::kSingle) {
    std::printf("balance: %s\n", o.balance == "auto" ? "auto (shares follow the measured speeds)"
                                                    : ("fixed shares " + o.balance).c_str());
  }
  std::fflush(stdout);
}

// 4. The model, initialised from the seed: the same on every rank and in every mode.
int build_and_train(const TrainPlan& plan, const Data& data) {
  const TrainOptions& o = plan.options;
  torch::manual_seed(o.seed);
  auto train = [&](auto model) {
    return o.fault_tolerant ? train_model_fault_tolerant(plan, data, model) : train_model(plan, data, model);
  };
  if (o.model == "mlp") return train(std::make_shared<models::MlpImpl>());
  if (o.model == "lenet") {
    auto lenet = std::make_shared<models::LeNetImpl>();
    xavier_init(*lenet);
    return train(lenet);
  }
  auto resnet = std::make_shared<models::ResNet18Impl>();
  d2l_init(*resnet);
  return train(resnet);
}

// --checkpoint-async's writer; a dcp one exchanges over a group of its own (the training's
// collectives run on the main thread meanwhile). Under --fault-tolerant rank 0 of each
// membership writes torch files: no group.
std::shared_ptr<train::AsyncCheckpointWriter> make_checkpoint_writer(const TrainPlan& plan) {
  std::shared_ptr<ProcessGroup> group;
  if (plan.options.checkpoint_format == "dcp" && is_initialized()) {
    std::vector<int> ranks(static_cast<size_t>(get_world_size()));
    std::iota(ranks.begin(), ranks.end(), 0);
    group = new_group(ranks);
  }
  return std::make_shared<train::AsyncCheckpointWriter>(std::move(group));
}

int run_plan(TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  set_threads(plan);
  join_job(plan);
  if (o.checkpoint_async) plan.checkpoint_writer = make_checkpoint_writer(plan);
  const Data data = load_data(plan);  // FashionMnist names a missing or damaged file here
  print_banner(plan, data);
  const int code = build_and_train(plan, data);
  if (plan.checkpoint_writer) plan.checkpoint_writer->wait();  // the last checkpoint written, or its failure
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
