// datapar bench ddp. See bench_ddp.h.
//
// Data are Fashion-MNIST shaped (1x28x28, 10 classes) synthetic batches made up front, so
// the numbers are about training and synchronisation, not loading. A step is forward,
// cross-entropy, backward, optimizer step (SGD, or Adam). Every phase starts at a barrier and its time is the
// slowest rank's. Hidden share: 1 - (DDP step - local step) / all-reduce time alone.
// Each training phase also reports where a step's time goes (median forward, backward and
// optimizer step) and its CPU time: the training thread's, and the other threads' (the
// backend's communication), which on a machine whose cores are all training compete
// with the training for the same cores (docs/benchmarks.md, DDP section).
#include "bench_ddp.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "datapar/cpu_allocator.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/process_group/metadata.h"
#include "file_system.h"
#include "datapar/trace.h"
#include "local_job.h"

namespace datapar::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Batch {
  at::Tensor x, y;
};

// Where the steps of one phase spent their time, per step: the slowest rank's values.
struct PhaseTimes {
  double step = 0;                              // wall time
  double forward = 0, backward = 0, optimizer = 0;  // medians; backward includes DDP's synchronisation
  double cpu_main = 0, cpu_other = 0;           // CPU time: this thread, the process's other threads
};

// Per-step durations of a training step's parts, filled in by the step.
struct StepParts {
  std::vector<double> forward, backward, optimizer;
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Waits for the work queued on the group's device: on a GPU, kernels and collectives run
// after the host has moved on, so a host clock read is only a time once they are done.
// (Copying one value to the host waits for the current stream, which DDP's collectives
// join through Work::wait.) On a GPU the step parts (forward, backward, optimizer) time
// what the host queued, not what the device ran; the step times are exact.
void synchronize(const ProcessGroup& group) {
  if (!group.device().is_cpu()) (void)host_doubles(metadata_zeros(group, 1, at::kDouble));
}

double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Runs `step` `steps` times after `warmup`; every value is the slowest rank's.
template <typename Step>
PhaseTimes time_steps(ProcessGroup& group, int warmup, int steps, Step&& step, StepParts* parts = nullptr) {
  for (int i = 0; i < warmup; ++i) step(i);
  if (parts) *parts = StepParts{};
  group.barrier()->wait();
  synchronize(group);
  const double thread_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  const double process_start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step(i);
  synchronize(group);
  const double elapsed = seconds_since(start);
  const double thread_cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread_start;
  const double process_cpu = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_start;
  at::Tensor t = metadata_tensor(group, std::vector<double>{elapsed / steps, parts ? median(parts->forward) : 0.0,
                                                            parts ? median(parts->backward) : 0.0,
                                                            parts ? median(parts->optimizer) : 0.0, thread_cpu / steps,
                                                            (process_cpu - thread_cpu) / steps});
  group.all_reduce(t, ReduceOp::kMax)->synchronize();
  const std::vector<double> v = host_doubles(t);
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

template <typename Module>
int run_model(const BenchDdpOptions& o, int batch, int steps, ProcessGroup& group,
              const std::function<Module()>& make) {
  const int rank = group.rank(), world = group.size();
  const c10::Device device = group.device();  // nccl: cuda:LOCAL_RANK
  std::vector<Batch> batches;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
  for (int i = 0; i < 4; ++i) {
    batches.push_back({at::randn({batch, 1, 28, 28}, gen, at::kFloat).to(device),
                       at::randint(10, {batch}, gen, at::kLong).to(device)});
  }
  StepParts local_parts, ddp_parts;
  // The optimizer of every phase: SGD (lr 0.01) or Adam (lr 1e-3).
  auto make_optimizer = [&](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    if (o.optimizer == "adam") return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(1e-3));
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.01));
  };
  // `sgd`: a torch::optim::Optimizer or a ZeroRedundancyOptimizer.
  auto train_step = [&](auto& forward, auto& sgd, StepParts& parts, int i) {
    const Batch& b = batches[i % batches.size()];
    trace::set_step(i);
    sgd.zero_grad();
    auto start = Clock::now();
    at::Tensor out;
    {
      const trace::Span span("forward", "step");
      out = forward(b.x);
    }
    parts.forward.push_back(seconds_since(start));
    start = Clock::now();
    {
      const trace::Span span("backward", "step");
      at::cross_entropy_loss(out, b.y).backward();
    }
    parts.backward.push_back(seconds_since(start));
    start = Clock::now();
    {
      const trace::Span span("optimizer step", "step");
      sgd.step();
    }
    parts.optimizer.push_back(seconds_since(start));
  };

  torch::manual_seed(0);
  Module local = make();
  local->to(device);
  const std::unique_ptr<torch::optim::Optimizer> local_optimizer = make_optimizer(local->parameters());
  torch::optim::Optimizer& local_sgd = *local_optimizer;
  auto local_forward = [&](const at::Tensor& x) { return local->forward(x); };
  const PhaseTimes local_times = time_steps(
      group, o.warmup, steps, [&](int i) { train_step(local_forward, local_sgd, local_parts, i); }, &local_parts);

  torch::manual_seed(0);
  Module model = make();
  model->to(device);
  DdpOptions ddp_options;
  ddp_options.gradient_as_bucket_view = o.gradient_as_bucket_view;
  DistributedDataParallel ddp(model.ptr(), nullptr, ddp_options);
  const std::unique_ptr<torch::optim::Optimizer> ddp_optimizer = make_optimizer(ddp.parameters());
  torch::optim::Optimizer& sgd = *ddp_optimizer;
  auto ddp_forward = [&](const at::Tensor& x) { return ddp.forward(x); };
  // Per step, how long backward waited for its buckets after its last gradient. The rank
  // that finished backward first also waits for the other ranks to catch up; the one that
  // finished last waits for communication only: the step's minimum over ranks is the
  // communication backward did not hide.
  std::vector<double> waits(o.warmup + steps);
  int64_t taken = 0;  // warmup steps first, then the timed ones
  const PhaseTimes ddp_times = time_steps(
      group, o.warmup, steps,
      [&](int i) {
        const auto before = ddp.communication_stats().exposed_wait;
        train_step(ddp_forward, sgd, ddp_parts, i);
        waits[taken++] = std::chrono::duration<double>(ddp.communication_stats().exposed_wait - before).count();
      },
      &ddp_parts);
  at::Tensor min_waits = metadata_tensor(group, waits);
  group.all_reduce(min_waits, ReduceOp::kMin)->synchronize();
  const std::vector<double> min_wait = host_doubles(min_waits);
  double t_exposed = 0;
  for (int i = o.warmup; i < o.warmup + steps; ++i) t_exposed += min_wait[i] / steps;

  // ZeRO-1: the same DDP steps with the optimizer state sharded; its state per rank. With
  // the parameters as bucket views (broadcast in place, the default) and in their own memory
  // (broadcast through a flat copy), in alternating rounds: the medians of each.
  constexpr int kZeroRounds = 4;
  std::vector<double> zero_steps[2], zero_optimizer[2];  // [0]: bucket views, [1]: own memory
  std::vector<double> zero_bytes;  // {largest rank's, sum over ranks}
  for (int round = 0; o.zero && round < kZeroRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const int variant = (round + k) % 2;  // each goes first in every other round
      torch::manual_seed(0);
      Module zero_model = make();
      zero_model->to(device);
      DistributedDataParallel zero_ddp(zero_model.ptr(), nullptr, ddp_options);
      ZeroOptions zero_options;
      zero_options.parameters_as_bucket_view = variant == 0;
      ZeroRedundancyOptimizer zero(zero_ddp.parameters(), make_optimizer, nullptr, zero_options);
      StepParts zero_parts;
      auto zero_forward = [&](const at::Tensor& x) { return zero_ddp.forward(x); };
      const PhaseTimes t = time_steps(
          group, o.warmup, steps, [&](int i) { train_step(zero_forward, zero, zero_parts, i); }, &zero_parts);
      zero_steps[variant].push_back(t.step);
      zero_optimizer[variant].push_back(t.optimizer);
      if (!zero_bytes.empty()) continue;
      const double mine = static_cast<double>(zero.state_bytes());
      at::Tensor largest = metadata_tensor(group, std::vector<double>{mine}), sum = metadata_tensor(group, std::vector<double>{mine});
      group.all_reduce(largest, ReduceOp::kMax)->synchronize();
      group.all_reduce(sum, ReduceOp::kSum)->synchronize();
      zero_bytes = {host_doubles(largest)[0], host_doubles(sum)[0]};
    }
  }

  // The same bytes in the same buckets, all-reduced with nothing else running.
  std::vector<at::Tensor> flats;
  int64_t bytes = 0;
  const auto params = ddp.parameters();
  for (const auto& bucket : ddp.bucket_indices()) {
    int64_t numel = 0;
    for (size_t i : bucket) numel += params[i].numel();
    flats.push_back(at::zeros({numel}, group.options(at::kFloat)));
    bytes += numel * 4;
  }
  const double t_comm = time_steps(group, o.warmup, steps, [&](int) {
    std::vector<std::shared_ptr<Work>> works;
    for (at::Tensor& f : flats) works.push_back(group.all_reduce(f));
    for (auto& w : works) w->wait();
  }).step;
  const double t_local = local_times.step, t_ddp = ddp_times.step;

  // The timeline's cost: DDP steps with it off and on in turn, so that drift (heat, other
  // load) hits both alike; the medians of the rounds. The last even round's timeline is saved.
  constexpr int kTraceRounds = 6;
  std::vector<double> trace_off, trace_on;
  int64_t trace_events = 0;  // in the first round with the timeline on (warmup step included)
  double trace_event_seconds = 0;
  if (!o.trace.empty()) {
    auto ddp_step = [&](int i) { train_step(ddp_forward, sgd, ddp_parts, i); };
    for (int round = 0; round < kTraceRounds; ++round) {
      // Off first in even rounds, on first in odd ones: neither gains from going second.
      if (round % 2 == 0) trace_off.push_back(time_steps(group, 1, steps, ddp_step).step);
      trace::start();
      trace::name_thread("main");
      trace_on.push_back(time_steps(group, 1, steps, ddp_step).step);
      if (round % 2 == 1) {
        (void)trace::stop_to_json(rank);
        trace_off.push_back(time_steps(group, 1, steps, ddp_step).step);
        continue;
      }
      if (round == 0) {
        const std::string events = trace::stop_to_json(rank);
        for (size_t at = 0; (at = events.find("\"ts\":", at)) != std::string::npos; ++at) ++trace_events;
      } else if (round + 2 < kTraceRounds) {
        (void)trace::stop_to_json(rank);
      } else {
        trace::save(o.trace);
      }
    }
    // What one event costs, alone: a bound on the cost per step that noise cannot blur.
    constexpr int kEvents = 200000;
    trace::start();
    const auto start = Clock::now();
    for (int i = 0; i < kEvents; ++i) const trace::Span span("cost", "bench");
    trace_event_seconds = seconds_since(start) / kEvents;
    (void)trace::stop_to_json(rank);
  }

  if (rank == 0) {
    // Measured inside the DDP step, so the step-to-step noise of compute does not enter it.
    const double hidden = world > 1 ? std::min(1.0, std::max(0.0, 1.0 - t_exposed / t_comm)) : 0.0;
    std::printf("datapar bench ddp: model %s, backend %s, %d process(es) x %d thread(s), batch %d per rank, %d steps%s\n",
                o.model.c_str(), group.backend().c_str(), world, at::get_num_threads(), batch, steps,
                o.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "");
    std::printf("local step (no synchronisation): %.2f ms, %.0f samples/s over all ranks (the ceiling)\n",
                t_local * 1e3, world * batch / t_local);
    std::printf("ddp step: %.2f ms (%.2f of the ceiling)\n", t_ddp * 1e3, t_local / t_ddp);
    std::printf("all-reduce of the gradients alone: %.2f ms (%zu buckets, %.2f MB)\n", t_comm * 1e3, flats.size(),
                bytes / 1e6);
    std::printf("all-reduce time hidden behind backward: %.0f%% (backward waited %.2f ms per step for its buckets "
                "after its last gradient, on the rank that finished backward last)\n",
                hidden * 100, t_exposed * 1e3);
    for (const auto& [name, t] : {std::make_pair("local", local_times), std::make_pair("ddp", ddp_times)}) {
      std::printf("%s step parts (medians): forward %.2f ms, backward %.2f ms, optimizer %.2f ms; CPU per step: "
                  "training thread %.2f ms, other threads %.2f ms\n",
                  name, t.forward * 1e3, t.backward * 1e3, t.optimizer * 1e3, t.cpu_main * 1e3, t.cpu_other * 1e3);
    }
    if (!trace_on.empty()) {
      const double off = median(trace_off), on = median(trace_on);
      const double per_step = static_cast<double>(trace_events) / (steps + 1);
      std::printf("timeline (--trace): ddp step %.2f ms off, %.2f ms on (medians of %d alternating rounds): %+.1f%%; "
                  "%.1f events per step at %.0f ns each (rank 0, alone): %.3f%% of the step; written to %s\n",
                  off * 1e3, on * 1e3, kTraceRounds, (on / off - 1) * 100, per_step, trace_event_seconds * 1e9,
                  per_step * trace_event_seconds / off * 100, o.trace.c_str());
    }
    if (o.zero) {
      const double step = median(zero_steps[0]), step_own = median(zero_steps[1]);
      const double opt = median(zero_optimizer[0]), opt_own = median(zero_optimizer[1]);
      std::printf("zero (ZeroRedundancyOptimizer, %s): step %.2f ms (%.2f of plain ddp's %.2f ms); optimizer state "
                  "per rank %.2f MB at most, %.2f MB over all ranks (the unsharded state; 1/%d of it: %.2f MB)\n",
                  o.optimizer.c_str(), step * 1e3, t_ddp / step, t_ddp * 1e3, zero_bytes[0] / 1e6,
                  zero_bytes[1] / 1e6, world, zero_bytes[1] / world / 1e6);
      std::printf("zero broadcast in place (parameters as bucket views) against through a flat copy (parameters in "
                  "their own memory), medians of %d alternating rounds: step %.3f / %.3f ms = %.3f; optimizer step "
                  "(shard update and broadcasts) %.3f / %.3f ms = %.3f\n",
                  kZeroRounds, step * 1e3, step_own * 1e3, step / step_own, opt * 1e3, opt_own * 1e3, opt / opt_own);
    }
    std::printf("samples/s: %.0f\n", world * batch / t_ddp);
  }
  return 0;
}

int run_rank(const BenchDdpOptions& o, const std::string& init, int rank, int world) {
  at::set_num_threads(o.threads);
  tune_cpu_allocator();
  init_process_group(job_backend(o.backend), init, rank, world, kDefaultTimeout);
  ProcessGroup& group = *default_group();
  int code = 1;
  if (o.model == "mlp") {
    code = run_model<models::Mlp>(o, o.batch ? o.batch : 64, o.steps ? o.steps : 200, group,
                                  [] { return models::Mlp(); });
  } else if (o.model == "lenet") {
    code = run_model<models::LeNet>(o, o.batch ? o.batch : 128, o.steps ? o.steps : 50, group,
                                    [] { return models::LeNet(); });
  } else if (o.model == "resnet18") {
    code = run_model<models::ResNet18>(o, o.batch ? o.batch : 32, o.steps ? o.steps : 10, group,
                                       [] { return models::ResNet18(); });
  }
  destroy_process_group();
  return code;
}

}  // namespace

int bench_ddp(const BenchDdpOptions& given) {
  BenchDdpOptions options = given;
  DATAPAR_CHECK(options.model == "mlp" || options.model == "lenet" || options.model == "resnet18", "--model: \"",
                options.model, "\" is not one of mlp, lenet, resnet18.");
  DATAPAR_CHECK(options.batch >= 0 && options.steps >= 0 && options.threads >= 1 && options.threads <= 1024,
                "--batch and --steps must not be negative; --threads takes 1 .. 1024.");
  DATAPAR_CHECK(options.warmup >= 0, "--warmup ", options.warmup, ": must not be negative.");
  DATAPAR_CHECK(options.optimizer == "sgd" || options.optimizer == "adam", "--optimizer: \"", options.optimizer,
                "\" is not one of sgd, adam.");
  const std::string trace_dir = detail::parent_directory(options.trace);
  DATAPAR_CHECK(trace_dir.empty() || detail::is_directory(trace_dir), "--trace ", options.trace,
                ": the directory ", trace_dir, " does not exist.\n---> HINT: create it first, or write the "
                "file elsewhere.");
  return run_ranks(
      options.nproc, "datapar bench ddp",
      [&](const std::string& init, int rank, int world) { return run_rank(options, init, rank, world); },
      options.backend);
}

}  // namespace datapar::tools
