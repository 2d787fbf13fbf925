// See bench_fsdp.h.
#include "bench_fsdp.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapar/cpu_allocator.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/fsdp/hybrid_groups.h"
#include "datapar/ft/fault_tolerant_fsdp.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/process_group/metadata.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/optim/optimizer_state.h"
#include "bench_ft.h"
#include "bench_line.h"
#include "link_bytes.h"
#include "local_job.h"

namespace datapar::tools {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

// Parameters, their gradients and the optimizer's state, in bytes, on this rank.
struct Footprint {
  int64_t parameters = 0, gradients = 0, optimizer = 0;
  int64_t total() const { return parameters + gradients + optimizer; }
};

Footprint footprint(const std::vector<at::Tensor>& parameters, const torch::optim::Optimizer& optimizer) {
  Footprint f;
  for (const at::Tensor& p : parameters) {
    f.parameters += bytes_of(p);
    f.gradients += bytes_of(p.grad());
  }
  const auto state = optimizer_state_dict(optimizer).at("state").toGenericDict();
  for (const auto& per_param : state) {
    for (const auto& item : per_param.value().toGenericDict()) {
      if (item.value().isTensor() && item.value().toTensor().dim() > 0)
        f.optimizer += bytes_of(item.value().toTensor());
    }
  }
  return f;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<at::Tensor> params) {
  if (kind == "adam") return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(1e-3));
  return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.01));
}

// The largest rank's `value`.
double largest(ProcessGroup& group, double value) {
  at::Tensor t = metadata_tensor(group, std::vector<double>{value});
  group.all_reduce(t, ReduceOp::kMax)->synchronize();
  return host_doubles(t)[0];
}

// The sum of every rank's `value`.
double summed(ProcessGroup& group, double value) {
  at::Tensor t = metadata_tensor(group, std::vector<double>{value});
  group.all_reduce(t, ReduceOp::kSum)->synchronize();
  return host_doubles(t)[0];
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Where this rank runs: whether it reads its machine's link counters (the first local rank),
// and whether the job spans machines at all.
struct Placement {
  bool counts_links = false;
  bool machines = false;
};

// One way of training the model that the bench times, and what each round measured of it.
struct Variant {
  std::string name;
  std::function<void(int)> step;
  std::vector<double> times;  // the slowest rank's mean step time, per round
  std::vector<double> link;   // bytes the job's machines sent on their links per step, per round
};

// `steps` steps of `v`: the slowest rank's mean step time and the links' bytes per step
// (the bench's own barrier and figure, a few bytes, included); `line` shows them.
void time_steps(BenchLine& line, const std::string& phase, ProcessGroup& group, int steps, const Placement& where,
                Variant& v) {
  line.phase(phase, steps);
  const int64_t sent = where.counts_links ? link_tx_bytes() : 0;
  group.barrier()->wait();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    v.step(i);
    line.step(i + 1);
  }
  v.times.push_back(largest(group, std::chrono::duration<double>(Clock::now() - start).count() / steps));
  v.link.push_back(summed(group, where.counts_links ? static_cast<double>(link_tx_bytes() - sent) : 0.0) / steps);
}

// Warms every variant up, then times them in turn, round after round: drifts of a shared
// machine hit all alike.
void time_variants(const BenchFsdpOptions& o, ProcessGroup& group, int steps, const Placement& where,
                   const std::vector<Variant*>& variants) {
  BenchLine line(group);
  line.phase("warm-up", o.warmup);
  for (int i = 0; i < o.warmup; ++i) {
    for (Variant* v : variants) v->step(i);
    line.step(i + 1);
  }
  for (int round = 0; round < o.rounds; ++round) {
    const std::string of = " (round " + std::to_string(round + 1) + "/" + std::to_string(o.rounds) + ")";
    for (Variant* v : variants) time_steps(line, v->name + of, group, steps, where, *v);
  }
  line.clear();
}

// What run_model measured, as rank 0 prints it.
struct FsdpFigures {
  int world = 0, batch = 0, steps = 0, units = 0, prefetch = 0, shard_size = 0;
  double ddp = 0, fsdp = 0, tolerant = 0, hsdp = 0, tolerant_hsdp = 0;  // step times; 0: not timed
  double ddp_link = 0, fsdp_link = 0, hsdp_link = 0, tolerant_link = 0, tolerant_hsdp_link = 0;  // bytes per step
  bool machines = false;                    // the ranks span machines: the link figures mean something
  Footprint whole, shards;                  // ddp's and fsdp's bytes on this rank
  double most_shards = 0, most_tolerant = 0;  // the largest rank's bytes
  int64_t unit_bytes = 0;                   // the largest unit, gathered
};

void print_hsdp(const FsdpFigures& f) {
  std::printf("hsdp (shard groups of %d, replicated %d times): step %.2f ms, hsdp/fsdp %.3f\n", f.shard_size,
              f.world / f.shard_size, f.hsdp * 1e3, f.hsdp / f.fsdp);
  if (!f.machines) {
    std::printf("bytes over the machines' links: none (every rank on this machine)\n");
    return;
  }
  std::printf("bytes over the machines' links per step: ddp %.0f, fsdp %.0f, hsdp %.0f: hsdp/fsdp %.3f (1/%d = %.3f)\n",
              f.ddp_link, f.fsdp_link, f.hsdp_link, f.hsdp_link / f.fsdp_link, f.shard_size, 1.0 / f.shard_size);
}

void print_tolerant_hsdp(const FsdpFigures& f) {
  std::printf("fault-tolerant hsdp (replica groups of %d): step %.2f ms, %.3f of fault-tolerant fsdp's\n",
              f.shard_size, f.tolerant_hsdp * 1e3, f.tolerant_hsdp / f.tolerant);
  if (!f.machines) return;
  std::printf("bytes over the machines' links per step: fault-tolerant fsdp %.0f, hsdp %.0f: %.3f\n",
              f.tolerant_link, f.tolerant_hsdp_link, f.tolerant_hsdp_link / f.tolerant_link);
}

void print_figures(const BenchFsdpOptions& o, const FsdpFigures& f) {
  const int world = f.world;
  std::printf(
      "datapar bench fsdp: %s, %d ranks, batch %d per rank, %s, %d thread%s, %d units%s, %d rounds of %d steps\n",
      o.model.c_str(), world, f.batch, o.optimizer.c_str(), o.threads, o.threads == 1 ? "" : "s", f.units,
      o.reshard ? "" : " (no reshard)", o.rounds, f.steps);
  std::printf("step (median, slowest rank): ddp %.2f ms, fsdp %.2f ms: fsdp/ddp %.3f\n", f.ddp * 1e3, f.fsdp * 1e3,
              f.fsdp / f.ddp);
  std::printf("per rank, parameters + gradients + optimizer state:\n");
  std::printf("  ddp     %8.2f MiB (%.2f + %.2f + %.2f)\n", mib(f.whole.total()), mib(f.whole.parameters),
              mib(f.whole.gradients), mib(f.whole.optimizer));
  std::printf("  zero-1  %8.2f MiB (computed: ddp's parameters and gradients, 1/%d of its optimizer state)\n",
              mib(f.whole.parameters + f.whole.gradients + f.whole.optimizer / world), world);
  std::printf("  fsdp    %8.2f MiB (%.2f + %.2f + %.2f; largest rank %.2f), %.3f of ddp's (1/%d = %.3f)\n",
              mib(f.shards.total()), mib(f.shards.parameters), mib(f.shards.gradients), mib(f.shards.optimizer),
              mib(static_cast<int64_t>(f.most_shards)), f.most_shards / static_cast<double>(f.whole.total()), world,
              1.0 / world);
  std::printf("  + gathered in a step: the largest unit %.2f MiB, the unit computing and %d prefetched at most\n",
              mib(f.unit_bytes), f.prefetch);
  if (f.tolerant > 0) {
    std::printf("fault-tolerant fsdp (ft::FaultTolerantFsdp): step %.2f ms, %.3f of fsdp's; per rank at most "
                "%.2f MiB (its shards and the previous rank's), %.3f of ddp's (2/%d = %.3f)\n",
                f.tolerant * 1e3, f.tolerant / f.fsdp, mib(static_cast<int64_t>(f.most_tolerant)),
                f.most_tolerant / static_cast<double>(f.whole.total()), world, std::min(1.0, 2.0 / world));
  }
  if (f.hsdp > 0) print_hsdp(f);
  if (f.tolerant_hsdp > 0) print_tolerant_hsdp(f);
  std::printf("samples/s: ddp %.0f fsdp %.0f\n", world * f.batch / f.ddp, world * f.batch / f.fsdp);
}

// The units of the bench's models: each layer with parameters, a residual block whole.
template <typename Impl>
void shard_bench_units(Impl& model, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options) {
  fully_shard_each<torch::nn::LinearImpl, torch::nn::Conv2dImpl, models::ResidualImpl>(model, group, options);
}

// A fault-tolerant variant of the bench (--fault-tolerant): its membership, trainer and
// timings. `replica_group_size` > 1: HSDP, fault tolerance between replica groups.
template <typename Impl>
struct TolerantVariant {
  FtBenchJob job;
  ft::FaultTolerantFsdp<Impl> trainer;
  Variant variant;

  TolerantVariant(const std::string& name, ProcessGroup& group, int replica_group_size, const BenchFsdpOptions& o,
                  const FsdpOptions& options, const std::function<std::shared_ptr<Impl>()>& fresh,
                  const std::vector<std::pair<at::Tensor, at::Tensor>>& batches)
      : job(group, "bench-" + name, replica_group_size),
        trainer(
            fresh, [](Impl& m, const auto& g, const FsdpOptions& u) { shard_bench_units(m, g, u); },
            [&o](std::vector<at::Tensor> p) { return make_optimizer(o.optimizer, std::move(p)); }, *job.elastic,
            group.size(), options),
        variant{"fault-tolerant " + name, [this, &batches](int i) {
                  const auto& b = batches[i % batches.size()];
                  const bool committed = trainer.train_step([&](FullyShardedDataParallel<Impl>& f, const ft::Slice&) {
                    at::cross_entropy_loss(f.forward(b.first), b.second).backward();
                    return b.second.size(0);  // each rank its own batch: the slice is this rank's
                  });
                  DATAPAR_CHECK(committed, "bench fsdp --fault-tolerant: a step was not committed (a rank failed?).");
                }} {}
};

template <typename Module>
int run_model(const BenchFsdpOptions& o, int batch, int steps, ProcessGroup& group, const Placement& where,
              const HybridGroups* hybrid, const std::function<Module()>& make) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + group.rank());
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int i = 0; i < 4; ++i) {
    batches.emplace_back(at::randn({batch, 1, 28, 28}, gen, at::kFloat), at::randint(10, {batch}, gen, at::kLong));
  }
  auto fresh = [&] {
    torch::manual_seed(0);
    return make();
  };
  auto step = [&](auto& model, torch::optim::Optimizer& optimizer, int i) {
    const auto& [x, y] = batches[i % batches.size()];
    optimizer.zero_grad();
    at::cross_entropy_loss(model.forward(x), y).backward();
    optimizer.step();
  };
  Module plain = fresh();
  DistributedDataParallel ddp(plain.ptr());
  auto ddp_optimizer = make_optimizer(o.optimizer, ddp.parameters());
  Module sharded = fresh();
  FsdpOptions options;
  options.reshard_after_forward = o.reshard;
  shard_bench_units(*sharded, nullptr, options);
  FullyShardedDataParallel fsdp(sharded.ptr(), nullptr, options);
  auto fsdp_optimizer = make_optimizer(o.optimizer, fsdp.parameters());
  Variant ddp_variant{"ddp", [&](int i) { step(ddp, *ddp_optimizer, i); }};
  Variant fsdp_variant{"fsdp", [&](int i) { step(fsdp, *fsdp_optimizer, i); }};
  std::vector<Variant*> variants = {&ddp_variant, &fsdp_variant};
  // --hsdp: the same units sharded within each machine, replicated across them.
  using Impl = typename Module::ContainedType;
  std::unique_ptr<FullyShardedDataParallel<Impl>> hsdp;
  std::unique_ptr<torch::optim::Optimizer> hsdp_optimizer;
  Variant hsdp_variant{"hsdp", [&](int i) { step(*hsdp, *hsdp_optimizer, i); }};
  if (hybrid != nullptr) {
    FsdpOptions hybrid_options = options;
    hybrid_options.replicate_group = hybrid->replicate;
    Module replicated = fresh();
    shard_bench_units(*replicated, hybrid->shard, hybrid_options);
    hsdp = std::make_unique<FullyShardedDataParallel<Impl>>(replicated.ptr(), hybrid->shard, hybrid_options);
    hsdp_optimizer = make_optimizer(o.optimizer, hsdp->parameters());
    variants.push_back(&hsdp_variant);
  }
  // --fault-tolerant: the same model under ft::FaultTolerantFsdp (each rank's shard kept by
  // the next rank too; every rank's gradient gathered unit by unit, each keeping two shards),
  // and with --hsdp under fault tolerance between replica groups (the machines).
  const std::function<std::shared_ptr<Impl>()> fresh_impl = [&] { return fresh().ptr(); };
  std::unique_ptr<TolerantVariant<Impl>> tolerant, tolerant_hsdp;
  if (o.fault_tolerant) {
    tolerant = std::make_unique<TolerantVariant<Impl>>("fsdp", group, 1, o, options, fresh_impl, batches);
    variants.push_back(&tolerant->variant);
    if (hybrid != nullptr) {
      tolerant_hsdp = std::make_unique<TolerantVariant<Impl>>("hsdp", group, hybrid->shard->size(), o, options,
                                                              fresh_impl, batches);
      variants.push_back(&tolerant_hsdp->variant);
    }
  }
  time_variants(o, group, steps, where, variants);
  FsdpFigures f;
  f.world = group.size();
  f.batch = batch;
  f.steps = steps;
  f.units = static_cast<int>(fsdp.units());
  f.prefetch = options.prefetch;
  f.machines = where.machines;
  f.ddp = median(ddp_variant.times);
  f.fsdp = median(fsdp_variant.times);
  f.ddp_link = median(ddp_variant.link);
  f.fsdp_link = median(fsdp_variant.link);
  if (hsdp) {
    f.hsdp = median(hsdp_variant.times);
    f.hsdp_link = median(hsdp_variant.link);
    f.shard_size = hybrid->shard->size();
  }
  // Bytes after a step, gradients still held (zero_grad comes at the next step's start).
  f.whole = footprint(ddp.parameters(), *ddp_optimizer);
  f.shards = footprint(fsdp.parameters(), *fsdp_optimizer);
  f.most_shards = largest(group, static_cast<double>(f.shards.total()));
  f.unit_bytes = fsdp.largest_unit_numel() * static_cast<int64_t>(sizeof(float));
  if (tolerant) {  // its own shards and the previous rank's, the largest rank
    ft::FaultTolerantFsdp<Impl>& trainer = tolerant->trainer;
    const Footprint own = footprint(trainer.fsdp().parameters(), trainer.optimizer());
    f.most_tolerant = largest(group, static_cast<double>(own.total() + trainer.kept_bytes()));
    f.tolerant = median(tolerant->variant.times);
    f.tolerant_link = median(tolerant->variant.link);
    trainer.finish();
  }
  if (tolerant_hsdp) {
    f.tolerant_hsdp = median(tolerant_hsdp->variant.times);
    f.tolerant_hsdp_link = median(tolerant_hsdp->variant.link);
    tolerant_hsdp->trainer.finish();
  }
  if (group.rank() == 0) print_figures(o, f);
  return 0;
}

int run_rank(const BenchFsdpOptions& o, const std::string& init, int rank, int world) {
  at::set_num_threads(o.threads);
  tune_cpu_allocator();
  init_process_group(job_backend(o.backend), init, rank, world, kDefaultTimeout);
  ProcessGroup& group = *default_group();
  const std::optional<ProcessIdentity> id = resolve_job_config().identity();
  const int local_rank = id && id->local_rank >= 0 ? id->local_rank : rank;
  const int local_world = id && id->local_world_size >= 1 ? id->local_world_size : world;
  const Placement where{local_rank == 0, local_world < world};
  std::optional<HybridGroups> hybrid;
  if (o.hsdp) hybrid = hybrid_groups(o.shard_size > 0 ? o.shard_size : local_world);
  const HybridGroups* groups = hybrid ? &*hybrid : nullptr;
  int code = 1;
  if (o.model == "mlp") {
    code = run_model<models::Mlp>(o, o.batch ? o.batch : 64, o.steps ? o.steps : 100, group, where, groups,
                                  [] { return models::Mlp(); });
  } else if (o.model == "mlp-large") {  // 36.8M parameters: 147 MiB in float32
    code = run_model<models::Mlp>(o, o.batch ? o.batch : 64, o.steps ? o.steps : 5, group, where, groups, [] {
      return models::Mlp(std::vector<int64_t>{784, 4096, 4096, 4096, 10});
    });
  } else if (o.model == "lenet") {
    code = run_model<models::LeNet>(o, o.batch ? o.batch : 128, o.steps ? o.steps : 30, group, where, groups,
                                    [] { return models::LeNet(); });
  } else {
    code = run_model<models::ResNet18>(o, o.batch ? o.batch : 32, o.steps ? o.steps : 5, group, where, groups,
                                       [] { return models::ResNet18(); });
  }
  hybrid.reset();
  destroy_process_group();
  return code;
}

}  // namespace

int bench_fsdp(const BenchFsdpOptions& options) {
  DATAPAR_CHECK(
      options.model == "mlp" || options.model == "mlp-large" || options.model == "lenet" || options.model == "resnet18",
      "--model: \"", options.model, "\" is not one of mlp, mlp-large, lenet, resnet18.");
  DATAPAR_CHECK(options.batch >= 0 && options.steps >= 0 && options.warmup >= 0 && options.rounds >= 1 &&
                    options.threads >= 1 && options.threads <= 1024,
                "--batch, --steps and --warmup must not be negative, --rounds at least 1; --threads takes 1 .. 1024.");
  DATAPAR_CHECK(options.optimizer == "sgd" || options.optimizer == "adam", "--optimizer: \"", options.optimizer,
                "\" is not one of sgd, adam.");
  return run_ranks(
      options.nproc, "datapar bench fsdp",
      [&](const std::string& init, int rank, int world) { return run_rank(options, init, rank, world); },
      options.backend);
}

}  // namespace datapar::tools
