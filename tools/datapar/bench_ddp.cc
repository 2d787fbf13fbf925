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
#include "datapar/ft/membership/decider.h"
#include "datapar/ddp/powersgd_hook.h"
#include "datapar/ft/fault_tolerant_ddp.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/process_group/gloo.h"
#include "datapar/process_group/metadata.h"
#include "file_system.h"
#include "datapar/trace.h"
#include "bench_ft.h"
#include "bench_line.h"
#include "bench_model.h"
#include "bench_slow_link.h"
#include "train/comm_hook_flag.h"
#include "local_job.h"

namespace datapar::tools {
namespace {

// 1. The ceiling: the same steps on each rank's own model, with no synchronisation.
template <typename Module>
PhaseTimes time_local(const ModelBench<Module>& b) {
  Module local = b.fresh_model();
  const std::unique_ptr<torch::optim::Optimizer> optimizer = b.optimizer(local->parameters());
  auto forward = [&](const at::Tensor& x) { return local->forward(x); };
  StepParts parts;
  return time_steps(
      b.line, "ceiling (no synchronisation)", b.group, b.o.warmup, b.steps,
      [&](int i) { b.train_step(forward, *optimizer, parts, i); }, &parts);
}

struct DdpTimes {
  PhaseTimes times;
  double exposed_wait = 0;  // per step: the communication backward did not hide
};

// 2. DDP steps. Per step, how long backward waited for its buckets after its last
// gradient: the rank that finished backward first also waits for the others to catch up;
// the one that finished last waits for communication only, so the step's minimum over
// ranks is the communication backward did not hide.
template <typename Module, typename Ddp>
DdpTimes time_ddp(const ModelBench<Module>& b, Ddp& ddp, torch::optim::Optimizer& optimizer) {
  auto forward = [&](const at::Tensor& x) { return ddp.forward(x); };
  StepParts parts;
  std::vector<double> waits(b.o.warmup + b.steps);
  int64_t taken = 0;  // warmup steps first, then the timed ones
  DdpTimes out;
  out.times = time_steps(
      b.line, "ddp", b.group, b.o.warmup, b.steps,
      [&](int i) {
        const auto before = ddp.communication_stats().exposed_wait;
        b.train_step(forward, optimizer, parts, i);
        waits[taken++] = std::chrono::duration<double>(ddp.communication_stats().exposed_wait - before).count();
      },
      &parts);
  at::Tensor min_waits = metadata_tensor(b.group, waits);
  b.group.all_reduce(min_waits, ReduceOp::kMin)->synchronize();
  const std::vector<double> min_wait = host_doubles(min_waits);
  for (int i = b.o.warmup; i < b.o.warmup + b.steps; ++i) out.exposed_wait += min_wait[i] / b.steps;
  return out;
}

struct ZeroTimes {
  std::vector<double> steps[2], optimizer[2];  // [0]: parameters as bucket views, [1]: in their own memory
  std::vector<double> state_bytes;             // {largest rank's, sum over ranks}
};

// 3. ZeRO-1: the same DDP steps with the optimizer state sharded; its state per rank. With
// the parameters as bucket views (broadcast in place, the default) and in their own memory
// (broadcast through a flat copy), in alternating rounds.
template <typename Module>
ZeroTimes time_zero(const ModelBench<Module>& b, const DdpOptions& ddp_options) {
  constexpr int kZeroRounds = 4;
  ZeroTimes out;
  for (int round = 0; round < kZeroRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const int variant = (round + k) % 2;  // each goes first in every other round
      Module model = b.fresh_model();
      DistributedDataParallel ddp(model.ptr(), nullptr, ddp_options);
      ZeroOptions zero_options;
      zero_options.parameters_as_bucket_view = variant == 0;
      ZeroRedundancyOptimizer zero(ddp.parameters(), [&b](std::vector<at::Tensor> p) { return b.optimizer(std::move(p)); },
                                   nullptr, zero_options);
      StepParts parts;
      auto forward = [&](const at::Tensor& x) { return ddp.forward(x); };
      const PhaseTimes t = time_steps(
          b.line, "zero", b.group, b.o.warmup, b.steps, [&](int i) { b.train_step(forward, zero, parts, i); },
          &parts);
      out.steps[variant].push_back(t.step);
      out.optimizer[variant].push_back(t.optimizer);
      if (!out.state_bytes.empty()) continue;
      const double mine = static_cast<double>(zero.state_bytes());
      at::Tensor largest = metadata_tensor(b.group, std::vector<double>{mine});
      at::Tensor sum = metadata_tensor(b.group, std::vector<double>{mine});
      b.group.all_reduce(largest, ReduceOp::kMax)->synchronize();
      b.group.all_reduce(sum, ReduceOp::kSum)->synchronize();
      out.state_bytes = {host_doubles(largest)[0], host_doubles(sum)[0]};
    }
  }
  return out;
}

struct FtTimes {
  // Per round, the step (slowest rank's): plain DDP, fault-tolerant, fault-tolerant with the
  // optimizer state sharded (--zero).
  std::vector<double> ddp, ft, ft_zero;
  std::vector<double> zero_state_bytes;  // --zero: {largest rank's, sum over ranks}
};

// 3b. Fault tolerance (ft::FaultTolerantDdp): the same steps with the vote before each
// update, against plain DDP on a group of the same kind (the first epoch's), in
// alternating rounds, each on a model of its own; with --zero also with the optimizer
// state sharded, each shard kept by two ranks (ZeroRedundancyOptimizer, 2 copies).
template <typename Module>
FtTimes time_fault_tolerance(const ModelBench<Module>& b) {
  using Impl = typename Module::ContainedType;
  using Trainer = ft::FaultTolerantDdp<Impl>;
  constexpr int kRounds = 4;
  DATAPAR_CHECK(b.group.backend() == "gloo", "bench ddp --fault-tolerant: the backend is ", b.group.backend(),
                "; fault-tolerant groups are gloo's (--backend gloo).");
  FtBenchJob job(b.group, "bench");
  ft::ElasticGroup& elastic = *job.elastic;
  Module ft_model = b.fresh_model();
  const std::unique_ptr<torch::optim::Optimizer> ft_optimizer = b.optimizer(ft_model->parameters());
  const int slices = b.group.size();  // one per rank, as in a job that loses none
  Trainer trainer(ft_model.ptr(), *ft_optimizer, elastic, slices);
  std::unique_ptr<FtBenchJob> zero_job;
  Module zero_model = b.fresh_model();
  std::unique_ptr<ZeroRedundancyOptimizer> sharded;
  std::unique_ptr<Trainer> zero_trainer;
  if (b.o.zero) {
    zero_job = std::make_unique<FtBenchJob>(b.group, "bench-zero");
    ZeroOptions two_copies;
    two_copies.copies = 2;
    sharded = std::make_unique<ZeroRedundancyOptimizer>(
        zero_model->parameters(), [&b](std::vector<at::Tensor> p) { return b.optimizer(std::move(p)); }, two_copies);
    zero_trainer = std::make_unique<Trainer>(zero_model.ptr(), *sharded, *zero_job->elastic, slices);
  }
  auto step_of = [&](Trainer& t) {
    return [&b, &t](int i) {
      const Batch& batch = b.batches[i % b.batches.size()];
      const bool committed = t.train_step([&](Impl& m, const ft::Slice&) {
        at::cross_entropy_loss(m.forward(batch.x), batch.y).backward();
        return batch.x.size(0);
      });
      DATAPAR_CHECK(committed, "bench ddp --fault-tolerant: a step was not committed (did a rank fail?).");
    };
  };
  const std::function<void(int)> ft_step = step_of(trainer);
  ft_step(0);  // joins the first epoch: its group exists from here
  std::function<void(int)> ft_zero_step;
  if (zero_trainer) {
    ft_zero_step = step_of(*zero_trainer);
    ft_zero_step(0);
  }
  Module model = b.fresh_model();
  DdpOptions ddp_options;
  ddp_options.average_by_samples = true;  // as the fault-tolerant one
  DistributedDataParallel ddp(model.ptr(), elastic.group(), ddp_options);
  const std::unique_ptr<torch::optim::Optimizer> optimizer = b.optimizer(ddp.parameters());
  auto forward = [&](const at::Tensor& x) { return ddp.forward(x); };
  StepParts parts;
  FtTimes out;
  const int ways = zero_trainer ? 3 : 2;
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < ways; ++k) {
      const int way = (round + k) % ways;  // each goes first in turn
      if (way == 0) {
        out.ddp.push_back(
            time_steps(b.line, "ddp (against fault tolerance)", b.group, b.o.warmup, b.steps,
                       [&](int i) { b.train_step(forward, *optimizer, parts, i); })
                .step);
      } else if (way == 1) {
        out.ft.push_back(time_steps(b.line, "fault tolerance", b.group, b.o.warmup, b.steps, ft_step).step);
      } else {
        out.ft_zero.push_back(time_steps(b.line, "fault tolerance, zero", b.group, b.o.warmup, b.steps, ft_zero_step).step);
      }
    }
  }
  trainer.finish();
  if (zero_trainer) {
    zero_trainer->finish();
    const double mine = static_cast<double>(sharded->state_bytes());
    at::Tensor largest = metadata_tensor(b.group, std::vector<double>{mine});
    at::Tensor sum = metadata_tensor(b.group, std::vector<double>{mine});
    b.group.all_reduce(largest, ReduceOp::kMax)->synchronize();
    b.group.all_reduce(sum, ReduceOp::kSum)->synchronize();
    out.zero_state_bytes = {host_doubles(largest)[0], host_doubles(sum)[0]};
  }
  return out;
}

struct CommTimes {
  double step = 0;  // all-reducing every bucket once
  size_t buckets = 0;
  int64_t bytes = 0;
};

// 4. The same bytes in the same buckets, all-reduced with nothing else running.
template <typename Module, typename Ddp>
CommTimes time_communication_alone(const ModelBench<Module>& b, const Ddp& ddp) {
  std::vector<at::Tensor> flats;
  CommTimes out;
  const auto params = ddp.parameters();
  for (const auto& bucket : ddp.bucket_indices()) {
    int64_t numel = 0;
    for (size_t i : bucket) numel += params[i].numel();
    flats.push_back(at::zeros({numel}, b.group.options(at::kFloat)));
    out.bytes += numel * 4;
  }
  out.buckets = flats.size();
  out.step = time_steps(b.line, "all-reduce alone", b.group, b.o.warmup, b.steps, [&](int) {
    std::vector<std::shared_ptr<Work>> works;
    for (at::Tensor& f : flats) works.push_back(b.group.all_reduce(f));
    for (auto& w : works) w->wait();
  }).step;
  return out;
}

struct TraceTimes {
  std::vector<double> off, on;      // DDP steps, per round
  int64_t events = 0;               // in the first round with the timeline on (warmup step included)
  double event_seconds = 0;         // one event, alone
  static constexpr int kRounds = 6;
};

// 5. The timeline's cost: DDP steps with it off and on in turn, so that drift (heat, other
// load) hits both alike. The last even round's timeline is saved to --trace.
template <typename Module, typename DdpStep>
TraceTimes time_trace(const ModelBench<Module>& b, const DdpStep& ddp_step) {
  TraceTimes out;
  const int rank = b.group.rank();
  for (int round = 0; round < TraceTimes::kRounds; ++round) {
    // Off first in even rounds, on first in odd ones: neither gains from going second.
    if (round % 2 == 0) out.off.push_back(time_steps(b.line, "timeline off", b.group, 1, b.steps, ddp_step).step);
    trace::start();
    trace::name_thread("main");
    out.on.push_back(time_steps(b.line, "timeline on", b.group, 1, b.steps, ddp_step).step);
    if (round % 2 == 1) {
      (void)trace::stop_to_json(rank);
      out.off.push_back(time_steps(b.line, "timeline off", b.group, 1, b.steps, ddp_step).step);
      continue;
    }
    if (round == 0) {
      const std::string events = trace::stop_to_json(rank);
      for (size_t at = 0; (at = events.find("\"ts\":", at)) != std::string::npos; ++at) ++out.events;
    } else if (round + 2 < TraceTimes::kRounds) {
      (void)trace::stop_to_json(rank);
    } else {
      trace::save(b.o.trace);
    }
  }
  // What one event costs, alone: a bound on the cost per step that noise cannot blur.
  constexpr int kEvents = 200000;
  trace::start();
  const auto start = Clock::now();
  for (int i = 0; i < kEvents; ++i) const trace::Span span("cost", "bench");
  out.event_seconds = seconds_since(start) / kEvents;
  (void)trace::stop_to_json(rank);
  return out;
}

// 6. Rank 0's report.
template <typename Module>
void report(const ModelBench<Module>& b, const PhaseTimes& local, const DdpTimes& ddp, const CommTimes& comm,
            const ZeroTimes& zero, const FtTimes& ft, const HookTimes& hook, const DiLoCoTimes& diloco,
            const TraceTimes& trace) {
  const BenchDdpOptions& o = b.o;
  const int world = b.group.size(), batch = b.batch, steps = b.steps;
  const double t_local = local.step, t_ddp = ddp.times.step;
  // Measured inside the DDP step, so the step-to-step noise of compute does not enter it.
  const double hidden = world > 1 ? std::min(1.0, std::max(0.0, 1.0 - ddp.exposed_wait / comm.step)) : 0.0;
  b.line.clear();
  std::printf("datapar bench ddp: model %s, backend %s, %d process(es) x %d thread(s), batch %d per rank, %d steps%s\n",
              o.model.c_str(), b.group.backend().c_str(), world, at::get_num_threads(), batch, steps,
              o.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "");
  std::printf("local step (no synchronisation): %.2f ms, %.0f samples/s over all ranks (the ceiling)\n",
              t_local * 1e3, world * batch / t_local);
  std::printf("ddp step: %.2f ms (%.2f of the ceiling)\n", t_ddp * 1e3, t_local / t_ddp);
  std::printf("all-reduce of the gradients alone: %.2f ms (%zu buckets, %.2f MB)\n", comm.step * 1e3, comm.buckets,
              comm.bytes / 1e6);
  std::printf("all-reduce time hidden behind backward: %.0f%% (backward waited %.2f ms per step for its buckets "
              "after its last gradient, on the rank that finished backward last)\n",
              hidden * 100, ddp.exposed_wait * 1e3);
  for (const auto& [name, t] : {std::make_pair("local", local), std::make_pair("ddp", ddp.times)}) {
    std::printf("%s step parts (medians): forward %.2f ms, backward %.2f ms, optimizer %.2f ms; CPU per step: "
                "training thread %.2f ms, other threads %.2f ms\n",
                name, t.forward * 1e3, t.backward * 1e3, t.optimizer * 1e3, t.cpu_main * 1e3, t.cpu_other * 1e3);
  }
  if (!trace.on.empty()) {
    const double off = median(trace.off), on = median(trace.on);
    const double per_step = static_cast<double>(trace.events) / (steps + 1);
    std::printf("timeline (--trace): ddp step %.2f ms off, %.2f ms on (medians of %d alternating rounds): %+.1f%%; "
                "%.1f events per step at %.0f ns each (rank 0, alone): %.3f%% of the step; written to %s\n",
                off * 1e3, on * 1e3, TraceTimes::kRounds, (on / off - 1) * 100, per_step, trace.event_seconds * 1e9,
                per_step * trace.event_seconds / off * 100, o.trace.c_str());
  }
  if (o.zero) {
    const double step = median(zero.steps[0]), step_own = median(zero.steps[1]);
    const double opt = median(zero.optimizer[0]), opt_own = median(zero.optimizer[1]);
    std::printf("zero (ZeroRedundancyOptimizer, %s): step %.2f ms (%.2f of plain ddp's %.2f ms); optimizer state "
                "per rank %.2f MB at most, %.2f MB over all ranks (the unsharded state; 1/%d of it: %.2f MB)\n",
                o.optimizer.c_str(), step * 1e3, t_ddp / step, t_ddp * 1e3, zero.state_bytes[0] / 1e6,
                zero.state_bytes[1] / 1e6, world, zero.state_bytes[1] / world / 1e6);
    std::printf("zero broadcast in place (parameters as bucket views) against through a flat copy (parameters in "
                "their own memory), medians of %zu alternating rounds: step %.3f / %.3f ms = %.3f; optimizer step "
                "(shard update and broadcasts) %.3f / %.3f ms = %.3f\n",
                zero.steps[0].size(), step * 1e3, step_own * 1e3, step / step_own, opt * 1e3, opt_own * 1e3,
                opt / opt_own);
  }
  if (o.fault_tolerant) {
    const double plain = median(ft.ddp), tolerant = median(ft.ft);
    std::printf("fault tolerance (ft::FaultTolerantDdp: a vote before each update), medians of %zu alternating "
                "rounds: step %.3f ms against plain DDP's %.3f ms on a group of the same kind = %.3f (cost %.1f%%)\n",
                ft.ft.size(), tolerant * 1e3, plain * 1e3, tolerant / plain, (tolerant / plain - 1) * 100);
    if (!ft.ft_zero.empty()) {
      const double sharded = median(ft.ft_zero);
      std::printf("fault tolerance with --zero (ZeroRedundancyOptimizer, 2 copies: each shard of the %s state kept "
                  "by two ranks), medians of %zu rounds: step %.3f ms = %.3f of plain DDP's, %.3f of the fault-tolerant "
                  "DDP's; optimizer state per rank %.2f MB at most, %.2f MB over all ranks (the whole state: %.2f "
                  "MB once)\n",
                  o.optimizer.c_str(), ft.ft_zero.size(), sharded * 1e3, sharded / plain, sharded / tolerant,
                  ft.zero_state_bytes[0] / 1e6, ft.zero_state_bytes[1] / 1e6,
                  ft.zero_state_bytes[1] / std::min(world, 2) / 1e6);
    }
  }
  if (!o.comm_hook.empty()) report_comm_hook(o, hook);
  if (o.sync_every > 0) report_diloco(o, diloco);
  std::printf("samples/s: %.0f\n", world * batch / t_ddp);
}

// The phases in this order on every rank (each a collective), then the report.
template <typename Module>
int run_model(const BenchDdpOptions& o, int batch, int steps, ProcessGroup& group, std::function<Module()> make) {
  const ModelBench<Module> bench(o, batch, steps, group, std::move(make));
  const PhaseTimes local = time_local(bench);
  Module model = bench.fresh_model();
  DdpOptions ddp_options;
  ddp_options.gradient_as_bucket_view = o.gradient_as_bucket_view;
  DistributedDataParallel ddp(model.ptr(), nullptr, ddp_options);
  const std::unique_ptr<torch::optim::Optimizer> optimizer = bench.optimizer(ddp.parameters());
  const DdpTimes ddp_times = time_ddp(bench, ddp, *optimizer);
  ZeroTimes zero;  // (not a ?: with ZeroTimes{}: GCC 12 in C++17 crashes on that, check_noexcept_r)
  if (o.zero) zero = time_zero(bench, ddp_options);
  FtTimes ft;
  if (o.fault_tolerant) ft = time_fault_tolerance(bench);
  HookTimes hook;
  if (!o.comm_hook.empty()) hook = time_comm_hook(bench);
  DiLoCoTimes diloco;
  if (o.sync_every > 0) diloco = time_diloco(bench);
  const CommTimes comm = time_communication_alone(bench, ddp);
  TraceTimes trace;
  if (!o.trace.empty()) {
    auto forward = [&](const at::Tensor& x) { return ddp.forward(x); };
    StepParts parts;
    trace = time_trace(bench, [&](int i) { bench.train_step(forward, *optimizer, parts, i); });
  }
  if (group.rank() == 0) report(bench, local, ddp_times, comm, zero, ft, hook, diloco, trace);
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
