// datapar train's flags and their checks (plan_training, see train.h).
//
// Every check here runs before data is read or a process group formed: a typo in a flag
// must not cost a rendezvous timeout or a minute of loading. The messages follow the house
// form "subject: problem" plus a hint line saying what to do.

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "cli_numbers.h"
#include "commands.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/train/plot.h"
#include "file_system.h"
#include "train.h"
#include "train/comm_hook_flag.h"
#include "train/optimizer_flags.h"

namespace datapar::tools {

namespace {

// Upper bounds of the thread-count flags: far above any machine's cores, low enough that a
// typo (--workers 100000) is an error instead of a process that exhausts its threads.
constexpr int kMaxLoaderWorkers = 256;
constexpr int kMaxIntraOpThreads = 1024;

// --balance W0,W1,...: finite shares >= 0, some > 0; empty for even and auto.
std::vector<double> balance_weights(const std::string& balance) {
  if (balance == "even" || balance == "auto") return {};
  const char* hint = "\n---> HINT: use even (equal shares), auto (shares by measured speed) or one share per device "
                     "or rank, e.g. 3,1.";
  std::vector<double> weights;
  double total = 0;
  size_t begin = 0;
  while (begin <= balance.size()) {
    const size_t end = std::min(balance.find(',', begin), balance.size());
    const std::string item = balance.substr(begin, end - begin);
    char* rest = nullptr;
    const double w = item.empty() ? NAN : std::strtod(item.c_str(), &rest);
    DATAPAR_CHECK(!item.empty() && *rest == '\0' && std::isfinite(w) && w >= 0, "--balance: \"", balance,
                  "\" is not a balance (\"", item, "\" is not a share >= 0).", hint);
    weights.push_back(w);
    total += w;
    begin = end + 1;
  }
  DATAPAR_CHECK(total > 0, "--balance ", balance, ": every share is 0.", hint);
  DATAPAR_CHECK(std::isfinite(total), "--balance ", balance, ": the shares add up past the largest number there is; ",
                "only their ratios count, so give smaller ones (e.g. 1,1).", hint);
  return weights;
}

// ddp: which device each local rank uses. --devices lists one per local rank; by default
// local rank k takes cuda:k, or on a machine without CUDA the CPU (labelled cpu:k: each
// rank is its own process, so the index only names the rank's share of the cores).
std::vector<Device> ddp_local_devices(const TrainOptions& o, int local_world_size, const DeviceInventory& inventory) {
  if (!o.devices.empty()) {
    std::vector<Device> devices = parse_devices(o.devices, inventory);
    DATAPAR_CHECK(static_cast<int>(devices.size()) >= local_world_size, "--devices ", o.devices, ": ",
                  devices.size(), " device(s) for ", local_world_size,
                  " local ranks.\n---> HINT: list one device per local rank, or leave out --devices.");
    return devices;
  }
  std::vector<Device> devices;
  for (int k = 0; k < local_world_size; ++k) {
    devices.push_back(inventory.cuda_count > 0 ? Device::cuda(k % inventory.cuda_count) : Device::cpu(k));
  }
  return devices;
}

// ddp: the backend for a rank on `device`: the one given, else nccl on CUDA and
// default_backend() on CPUs; refused where backend and device cannot work together.
std::string ddp_backend(const std::string& given, const Device& device, int local_rank, int cuda_count) {
  const std::string backend = !given.empty() ? given : device.is_cuda() ? "nccl" : default_backend();
  if (backend == "nccl") {
    DATAPAR_CHECK(device.is_cuda(), "--backend nccl: this rank trains on ", device,
                  ", but nccl moves CUDA tensors only.\n---> HINT: use --backend gloo on CPUs.");
    // The nccl group takes cuda:LOCAL_RANK, or the one GPU a process sees (nccl.h), so the
    // model must be there too.
    const int group_device = cuda_count == 1 ? 0 : local_rank;
    DATAPAR_CHECK(device.index == group_device, "--devices: local rank ", local_rank, " would train on ", device,
                  ", but its nccl group uses cuda:", group_device,
                  ".\n---> HINT: leave out --devices (rank k takes cuda:k) and pick GPUs with CUDA_VISIBLE_DEVICES.");
  } else if (backend != "gloo") {
    // gloo stages CUDA tensors through pinned host memory (new_gloo_process_group); mpi does not.
    DATAPAR_CHECK(!device.is_cuda(), "--backend ", backend, ": this rank trains on ", device, ", but ", backend,
                  " moves CPU tensors only.\n---> HINT: use --backend nccl (the default on CUDA devices) or "
                  "--backend gloo (CUDA tensors staged through host memory).");
  }
  return backend;
}

Mode parse_mode(const std::string& mode) {
  if (mode == "single") return Mode::kSingle;
  if (mode == "dp") return Mode::kDataParallel;
  if (mode == "ddp") return Mode::kDdp;
  if (mode == "fsdp") return Mode::kFsdp;
  if (mode == "hsdp") return Mode::kHsdp;
  throw InvalidArgumentError(detail::str_cat("--mode: \"", mode, "\" is not a mode.\n---> HINT: use single (one device), ",
                                             "dp (DataParallel), ddp, fsdp or hsdp (one rank per process)."));
}

// --cuda-graph: what a captured step can hold (train/cuda_graph_step.h).
void check_cuda_graph_flags(const TrainOptions& o, Mode mode) {
  DATAPAR_CHECK(mode == Mode::kSingle || mode == Mode::kDdp, "--cuda-graph captures the step of --mode single or ddp; ",
                "--mode ", o.mode, " is not that.\n---> HINT: use --mode ddp (one GPU per rank), or leave out --cuda-graph.");
  DATAPAR_CHECK(o.optimizer == "sgd", "--cuda-graph --optimizer ", o.optimizer, ": libtorch's ", o.optimizer,
                " counts its steps on the host and computes the bias correction from that count; a replayed step would ",
                "repeat the captured step's.\n---> HINT: use --optimizer sgd (with --momentum) under --cuda-graph.");
  DATAPAR_CHECK(o.amp != "fp16", "--cuda-graph --amp fp16: the gradient scaler reads on the host whether a step ",
                "overflowed, which a graph cannot capture.\n---> HINT: use --amp bf16 (it needs no scaler) or none.");
  DATAPAR_CHECK(!o.zero && !o.fault_tolerant && o.sync_every == 0 && o.balance == "even" && o.comm_hook != "powersgd" &&
                    o.comm_hook.rfind("powersgd:", 0) != 0,
                "--cuda-graph does not combine with --zero, --fault-tolerant, --sync-every, --balance or --comm-hook "
                "powersgd (each decides something on the host every step).\n---> HINT: leave them out, or leave out "
                "--cuda-graph.");
}

// The flags alone and together, before anything else is looked at.
void check_flags(const TrainOptions& o, Mode mode) {
  DATAPAR_CHECK(o.backend.empty() || one_of(o.backend, {"gloo", "nccl", "mpi"}), "--backend: \"", o.backend,
                "\" is not a backend.\n---> HINT: use gloo (CPU), nccl (CUDA) or mpi.");
  DATAPAR_CHECK(one_of(o.replicas, {"shared", "copy"}), "--replicas: \"", o.replicas,
                "\" is not a replica kind.\n---> HINT: use shared (the default) or copy.");
  DATAPAR_CHECK(o.evaluate || o.epochs >= 1, "--epochs ", o.epochs, ": train for at least 1 epoch.");
  check_optimizer_flags(o);
  DATAPAR_CHECK(!o.zero || mode == Mode::kDdp, "--zero shards the optimizer over the ranks of a ddp job; --mode ", o.mode,
                is_fully_sharded(mode)
                    ? " shards it already, with the parameters and gradients."
                    : " has one optimizer.\n---> HINT: add --mode ddp (under datapar launch), or leave out --zero.");
  if (o.cuda_graph) check_cuda_graph_flags(o, mode);
  if (o.fault_tolerant) {
    DATAPAR_CHECK(has_ranks(mode) && (o.backend.empty() || o.backend == "gloo"),
                  "--fault-tolerant trains ddp, fsdp or hsdp over gloo; --mode ", o.mode,
                  (o.backend.empty() ? "" : " --backend " + o.backend),
                  " is not that.\n---> HINT: use --mode ddp (or fsdp, hsdp) --backend gloo.");
    DATAPAR_CHECK(o.balance == "even" && !o.evaluate && o.trace.empty() && o.checkpoint_format == "torch" &&
                      o.mp == "none",
                  "--fault-tolerant does not combine with --balance, --evaluate, --trace, --mp or "
                  "--checkpoint-format dcp yet.");
  }
  DATAPAR_CHECK(one_of(o.mp, {"none", "bf16", "fp16"}), "--mp: \"", o.mp,
                "\" is not a precision.\n---> HINT: use none, bf16 or fp16.");
  DATAPAR_CHECK(is_fully_sharded(mode) || (o.mp == "none" && o.reshard), "--mp and --no-reshard are fully sharded ",
                "training's; --mode ", o.mode,
                " keeps whole parameters.\n---> HINT: add --mode fsdp, or leave them out.");
  DATAPAR_CHECK(!o.checkpoint_activations || o.model == "resnet18", "--checkpoint-activations recomputes resnet18's ",
                "residual blocks; --model ", o.model, " has none.\n---> HINT: use --model resnet18, or leave it out.");
  // DataParallel copies the module to each device with clone(), which a checkpointed block
  // (a wrapper of autograd's) cannot do: it failed inside clone() without naming the flag.
  DATAPAR_CHECK(!o.checkpoint_activations || mode != Mode::kDataParallel, "--checkpoint-activations: --mode dp copies the model ",
                "to each device, and checkpointed blocks cannot be copied.\n---> HINT: use --mode single, ddp or fsdp ",
                "with it, or leave it out.");
  DATAPAR_CHECK(!is_fully_sharded(mode) || o.balance == "even", "--balance ", o.balance, ": ", o.mode,
                " splits each batch evenly.\n---> HINT: leave out --balance, or use --mode ddp.");
  check_communication_flags(o, mode);
  DATAPAR_CHECK(mode == Mode::kHsdp || o.shard_size == 0, "--shard-size is hybrid sharding's; --mode ", o.mode,
                " has no shard groups.\n---> HINT: add --mode hsdp, or leave it out.");
  DATAPAR_CHECK(o.batch_size >= 1, "--batch-size ", o.batch_size, ": the batch must hold at least 1 sample.");
  DATAPAR_CHECK(o.limit >= 0, "--limit ", o.limit, ": use 0 (all samples) or a positive count.");
  DATAPAR_CHECK(o.workers >= 0 && o.workers <= kMaxLoaderWorkers, "--workers ", o.workers, ": use 0 .. ",
                kMaxLoaderWorkers, " data loader threads per process.");
  DATAPAR_CHECK(o.threads >= 0 && o.threads <= kMaxIntraOpThreads, "--threads ", o.threads, ": use 0 (default) .. ",
                kMaxIntraOpThreads, " intra-op threads per process.");
  DATAPAR_CHECK(!(o.resume || o.evaluate || o.start_over) || !o.checkpoint_dir.empty(),
                o.resume ? "--resume" : o.evaluate ? "--evaluate" : "--start-over",
                " needs --checkpoint-dir: the directory that holds the checkpoints.");
  DATAPAR_CHECK(!o.checkpoint_async || !o.checkpoint_dir.empty(),
                "--checkpoint-async needs --checkpoint-dir: the directory the checkpoints are written to.");
}

// --data and --checkpoint-dir: found (or made) now, not after the rendezvous.
void resolve_paths(TrainPlan& plan, const TrainOptions& o, const Environment& env) {
  // Data: "synthetic", or a directory that must exist now, not after the rendezvous.
  if (o.data != "synthetic") {
    plan.data_dir = o.data.empty() ? default_data_dir(env) : o.data;
    DATAPAR_CHECK(detail::is_directory(plan.data_dir), "--data ", plan.data_dir,
                  ": no such directory.\n---> HINT: give a directory with the Fashion-MNIST IDX files "
                  "(train-images-idx3-ubyte[.gz], ...), or --data synthetic.");
  }

  // The checkpoint directory is made now, so that a bad path fails before any training.
  if (!o.checkpoint_dir.empty()) {
    const std::string problem = detail::make_directories(o.checkpoint_dir);
    DATAPAR_CHECK(detail::is_directory(o.checkpoint_dir), "--checkpoint-dir ", o.checkpoint_dir,
                  ": cannot make this directory", problem.empty() ? std::string() : " (" + problem + ")",
                  ".\n---> HINT: give a writable directory path; it is created if missing.");
  }
}

// The devices this process trains on, and the job's size.
void resolve_devices(TrainPlan& plan, const TrainOptions& o, const Environment& env, const DeviceInventory& inventory) {
  const Mode mode = plan.mode;
  // Devices and job size.
  if (mode == Mode::kSingle) {
    plan.devices = parse_devices(o.devices.empty() ? "cpu:0" : o.devices, inventory);
    DATAPAR_CHECK(plan.devices.size() == 1, "--devices ", o.devices, ": single mode runs on one device, got ",
                  plan.devices.size(), ".\n---> HINT: use --mode dp for several devices in one process.");
    plan.devices_label = to_string(plan.devices);
  } else if (mode == Mode::kDataParallel) {
    plan.devices = o.devices.empty() ? cuda_devices() : parse_devices(o.devices, inventory);
    if (plan.devices.empty()) plan.devices = cpu_devices(std::max(1, std::min(inventory.cpu_cores, kMaxCpuDevices)));
    plan.parallelism = static_cast<int64_t>(plan.devices.size());
    plan.devices_label = to_string(plan.devices);
  } else {
    const std::optional<ProcessIdentity> id = identity_from_environment(env);
    DATAPAR_CHECK(id.has_value(),
                  "--mode ", o.mode, ": this process is not part of a job (RANK and WORLD_SIZE are not set).\n"
                  "---> HINT: start it with a launcher: datapar launch --nproc-per-node N -- datapar train "
                  "--mode ", o.mode, " ... (or torchrun, mpirun, srun).");
    plan.rank = id->rank;
    plan.world_size = id->world_size;
    plan.local_rank = id->local_rank >= 0 ? id->local_rank : id->rank;
    plan.local_world_size = id->local_world_size >= 1 ? id->local_world_size : id->world_size;
    const std::vector<Device> local = ddp_local_devices(o, plan.local_world_size, inventory);
    DATAPAR_CHECK(plan.local_rank < static_cast<int>(local.size()), "--devices ", o.devices, ": no device for local rank ",
                  plan.local_rank, ".");
    plan.devices = {local[plan.local_rank]};
    std::vector<Device> job;  // every rank's device, assuming each node looks like this one
    for (int r = 0; r < plan.world_size; ++r) job.push_back(local[r % plan.local_world_size]);
    plan.devices_label = to_string(job);
    plan.parallelism = plan.world_size;
    plan.options.backend = ddp_backend(o.backend, plan.devices.front(), plan.local_rank, inventory.cuda_count);
    plan.shard_size = o.shard_size > 0 ? o.shard_size : plan.local_world_size;
    DATAPAR_CHECK(mode != Mode::kHsdp || (plan.shard_size >= 1 && plan.world_size % plan.shard_size == 0),
                  "--shard-size ", plan.shard_size, " does not divide the job's ", plan.world_size,
                  " ranks into shard groups.\n---> HINT: use the ranks of one machine (the default) or a divisor of ",
                  plan.world_size, ".");
    DATAPAR_CHECK(!o.fault_tolerant || (plan.options.backend == "gloo" && plan.devices.front().is_cpu()),
                  "--fault-tolerant trains on the CPU over gloo; this rank would take ", plan.options.backend, " on ",
                  plan.devices.front().str(), ".\n---> HINT: add --backend gloo --devices cpu.");
  }
#if TORCH_VERSION_MAJOR < 2
  DATAPAR_CHECK(o.amp != "fp16" || std::none_of(plan.devices.begin(), plan.devices.end(),
                                                [](const Device& d) { return d.is_cpu(); }),
                "--amp fp16: libtorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
                "'s autocast computes in bfloat16 only on the CPU (2.x does both).\n---> HINT: use --amp bf16 on the "
                "CPU.");
  DATAPAR_CHECK(o.mp != "fp16" || !plan.devices.front().is_cpu(), "--mp fp16: libtorch ", TORCH_VERSION_MAJOR, ".",
                TORCH_VERSION_MINOR, " has no float16 matrix products on the CPU (2.x has).\n---> HINT: use --mp bf16 "
                "on the CPU.");
#endif
}

// --balance: the shares of each batch.
void resolve_shares(TrainPlan& plan, const TrainOptions& o) {
  const Mode mode = plan.mode;
  // Shares of each batch.
  const bool ranks = has_ranks(mode);  // one per process
  plan.balance_weights = balance_weights(o.balance);
  DATAPAR_CHECK(o.balance == "even" || mode != Mode::kSingle, "--balance ", o.balance, " shares each batch between "
                "devices or ranks; --mode single has one device.\n---> HINT: add --mode dp or --mode ddp, or leave out "
                "--balance.");
  DATAPAR_CHECK(plan.balance_weights.empty() || static_cast<int64_t>(plan.balance_weights.size()) == plan.parallelism,
                "--balance ", o.balance, ": ", plan.balance_weights.size(), " shares for ", plan.parallelism,
                ranks ? " ranks" : " devices", ".\n---> HINT: give one share per ", ranks ? "rank" : "device",
                ", or use even or auto.");
}

void check_report_files(const TrainPlan& plan, const TrainOptions& o) {
  // Report files go into directories that exist: found now, not after the first epoch.
  // Only rank 0 writes them (its machine's file system).
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--plot", o.plot}, {"--metrics", o.metrics}, {"--trace", o.trace}}) {
    if (path.empty() || plan.rank != 0) continue;
    const std::string parent = detail::parent_directory(path);
    DATAPAR_CHECK(parent.empty() || detail::is_directory(parent), flag, " ", path, ": the directory ", parent,
                  " does not exist.\n---> HINT: create it first, or write the file elsewhere.");
  }
  // gnuplot draws --plot after every epoch: its absence is found now, not after the first.
  DATAPAR_CHECK(o.plot.empty() || plan.rank != 0 || !train::find_gnuplot().empty(), "--plot ", o.plot,
                ": gnuplot is not installed (not on PATH).\n---> HINT: apt-get install gnuplot-nox, or leave out --plot.");
}

// The global batch, each process's share of it, and the learning rate.
void resolve_batch(TrainPlan& plan, const TrainOptions& o) {
  const bool ranks = has_ranks(plan.mode);
  // Linear scaling (d2l, Goyal et al.): N workers, N times the batch and the learning rate.
  plan.global_batch = o.scale_lr ? o.batch_size * plan.parallelism : o.batch_size;
  const double lr = learning_rate(o);
  plan.lr = o.scale_lr ? lr * static_cast<double>(plan.parallelism) : lr;
  plan.weight_decay = weight_decay(o);
  const char* what = ranks ? " ranks" : " devices";
  DATAPAR_CHECK(plan.global_batch >= plan.parallelism, "--batch-size ", plan.global_batch, " is smaller than the ",
                plan.parallelism, what, ": each needs at least one sample per step.\n---> HINT: raise --batch-size to ",
                plan.parallelism, " or more, or use fewer", what, ".");
  if (ranks && o.balance != "even") {
    // BalancedBatches splits each global batch itself; evaluation reads even shares.
    plan.rank_batch = (plan.global_batch + plan.world_size - 1) / plan.world_size;
  } else if (ranks) {
    DATAPAR_CHECK(plan.global_batch % plan.world_size == 0, "--batch-size ", plan.global_batch,
                  " does not split evenly over ", plan.world_size,
                  " ranks (every rank must take the same number of steps).\n---> HINT: use a multiple of ",
                  plan.world_size, ".");
    plan.rank_batch = plan.global_batch / plan.world_size;
  } else {
    plan.rank_batch = plan.global_batch;  // dp splits each batch itself
  }
}

// Whether this run resumes, and whether its launcher and its flags agree on fault tolerance.
void resolve_resume(TrainPlan& plan, const TrainOptions& o, const Environment& env) {
  const Mode mode = plan.mode;
  // A restarted rank (datapar launch --max-restarts) continues where the job stopped.
  const std::optional<std::string> restarts = env("DATAPAR_RESTART_COUNT");
  // Not under --fault-tolerant: a restarted rank joins the running job and takes its state.
  plan.resume = o.resume || (!o.fault_tolerant && !o.checkpoint_dir.empty() && restarts &&
                             std::atoi(restarts->c_str()) > 0);
  const bool launcher_tolerant = resolve_job_config(env).fault_tolerance.has_value();
  DATAPAR_CHECK(!o.fault_tolerant || launcher_tolerant,
                "--fault-tolerant needs a launcher that serves the job's store and decides its membership.\n---> "
                "HINT: start it with datapar launch --fault-tolerant --nproc-per-node N -- datapar train ...");
  // The launcher serves the store on MASTER_PORT and waits for members: a program that is
  // not one would fail to serve it (rank 0) or wait for a rank 0 that never comes (issue 46).
  DATAPAR_CHECK(o.fault_tolerant || !launcher_tolerant || !has_ranks(mode),
                "datapar launch --fault-tolerant runs this program, but it was not given --fault-tolerant: its ranks "
                "would not join the launcher's membership.\n---> HINT: give both --fault-tolerant (datapar launch "
                "--fault-tolerant ... -- datapar train --fault-tolerant ...), or neither.");
}

}  // namespace

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kSingle: return "single";
    case Mode::kDataParallel: return "dp";
    case Mode::kDdp: return "ddp";
    case Mode::kFsdp: return "fsdp";
    case Mode::kHsdp: return "hsdp";
  }
  return "?";
}

std::string default_data_dir(const Environment& env) {
  const std::string given = env("DATAPAR_FASHION_MNIST_DIR").value_or("");
  return given.empty() ? DATAPAR_SHIPPED_FASHION_MNIST_DIR : given;
}

TrainPlan plan_training(const TrainOptions& o, const Environment& env, const DeviceInventory& inventory) {
  TrainPlan plan;
  plan.options = o;
  DATAPAR_CHECK(one_of(o.model, {"mlp", "lenet", "resnet18"}), "--model: \"", o.model,
                "\" is not a model datapar train knows.\n---> HINT: use mlp, lenet or resnet18.");
  plan.mode = parse_mode(o.mode);
  check_flags(o, plan.mode);
  resolve_paths(plan, o, env);
  resolve_devices(plan, o, env, inventory);
  DATAPAR_CHECK(!o.cuda_graph || plan.devices.front().torch_device().is_cuda(), "--cuda-graph: the run trains on ",
                plan.devices.front().torch_device(), "; CUDA graphs are a GPU's.\n---> HINT: train on CUDA devices "
                "(--devices cuda:0, or --backend nccl under datapar launch), or leave out --cuda-graph.");
  resolve_shares(plan, o);
  check_report_files(plan, o);
  resolve_batch(plan, o);
  resolve_resume(plan, o, env);
  return plan;
}

}  // namespace datapar::tools
