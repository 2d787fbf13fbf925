// The phases of `datapar bench ddp` for slow links (issue 48): DDP with a communication hook
// (--comm-hook) and local SGD / DiLoCo (--sync-every), each against plain DDP in alternating
// rounds on models of their own.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_model.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/powersgd_hook.h"
#include "datapar/diloco/diloco.h"
#include "datapar/error.h"
#include "diloco/outer_exchange.h"
#include "link_bytes.h"
#include "train/comm_hook_flag.h"

namespace datapar::tools {

struct HookTimes {
  std::vector<double> ddp, hooked;  // per round, the step (slowest rank's)
  double ddp_bytes = 0, hooked_bytes = 0;  // gradient bytes each rank all-reduces per step
};

// 3c. --comm-hook: DDP steps whose gradients go through the hook against plain ones, in
// alternating rounds, each on a model of its own.
template <typename Module>
HookTimes time_comm_hook(const ModelBench<Module>& b) {
  constexpr int kRounds = 4;
  const std::shared_ptr<CommHook> hook = comm_hook_of(b.o.comm_hook);
  DATAPAR_CHECK(hook != nullptr, "bench ddp --comm-hook ", b.o.comm_hook, ": that is plain DDP, already timed.");
  const auto powersgd = std::dynamic_pointer_cast<PowerSgdHook>(hook);
  DATAPAR_CHECK(!powersgd || powersgd->options().start_iter <= b.o.warmup, "bench ddp --comm-hook ", b.o.comm_hook,
                ": PowerSGD starts after ", powersgd ? powersgd->options().start_iter : 0,
                " steps, and only ", b.o.warmup, " are not timed.\n---> HINT: give START (powersgd:RANK:START) at most "
                "--warmup.");
  Module plain_model = b.fresh_model(), hooked_model = b.fresh_model();
  DistributedDataParallel plain(plain_model.ptr()), hooked(hooked_model.ptr());
  hooked.register_comm_hook(hook);
  const std::unique_ptr<torch::optim::Optimizer> plain_optimizer = b.optimizer(plain.parameters());
  const std::unique_ptr<torch::optim::Optimizer> hooked_optimizer = b.optimizer(hooked.parameters());
  auto plain_forward = [&](const at::Tensor& x) { return plain.forward(x); };
  auto hooked_forward = [&](const at::Tensor& x) { return hooked.forward(x); };
  StepParts parts;
  HookTimes out;
  int64_t numel = 0;
  for (const at::Tensor& p : plain.parameters()) numel += p.numel();
  const int64_t element = static_cast<int64_t>(plain.parameters().front().element_size());
  out.ddp_bytes = static_cast<double>(numel * element);
  out.hooked_bytes = b.o.comm_hook == "bf16" || b.o.comm_hook == "fp16" ? out.ddp_bytes / element * 2 : out.ddp_bytes;
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      if ((round + k) % 2 == 0) {
        out.ddp.push_back(time_steps(b.line, "ddp (against the hook)", b.group, b.o.warmup, b.steps,
                                     [&](int i) { b.train_step(plain_forward, *plain_optimizer, parts, i); })
                              .step);
        continue;
      }
      const int64_t before = powersgd ? powersgd->numel_after() : 0, steps_before = powersgd ? powersgd->iterations() : 0;
      const std::string phase = "ddp with " + b.o.comm_hook;
      out.hooked.push_back(time_steps(b.line, phase.c_str(), b.group, b.o.warmup, b.steps,
                                      [&](int i) { b.train_step(hooked_forward, *hooked_optimizer, parts, i); })
                               .step);
      if (powersgd && round >= 1) {  // compressed throughout (the warmup of the first round started it)
        out.hooked_bytes = static_cast<double>((powersgd->numel_after() - before) * element) /
                           static_cast<double>(powersgd->iterations() - steps_before);
      }
    }
  }
  return out;
}

inline void report_comm_hook(const BenchDdpOptions& o, const HookTimes& h) {
  const double plain = median(h.ddp), hooked = median(h.hooked);
  std::printf("comm hook %s, medians of %zu rounds: step %.2f ms against plain DDP's %.2f ms (%.3f); gradient bytes "
              "each rank all-reduces per step: %.0f against %.0f (1/%.1f)\n",
              o.comm_hook.c_str(), h.hooked.size(), hooked * 1e3, plain * 1e3, hooked / plain, h.hooked_bytes,
              h.ddp_bytes, h.ddp_bytes / h.hooked_bytes);
}

struct DiLoCoTimes {
  std::vector<double> ddp, diloco;  // per round, the step (slowest rank's)
  // Bytes each rank sends per step, worked out (a ring all-reduce: 2 (n - 1) / n of the values;
  // the quantised exchange: Note [A quantised average]): DDP's; DiLoCo's over a round and in
  // its largest step.
  double ddp_bytes = 0, mean_bytes = 0, peak_bytes = 0;
  double link_ddp = 0, link_diloco = 0;  // measured on the links (bench/ddp_link.sh), per step; 0 on loopback
};

// The optimizer of a DiLoCo step: the inner one's step, then DiLoCo's.
struct InnerThenOuter {
  torch::optim::Optimizer& inner;
  DiLoCo& diloco;
  void zero_grad() { inner.zero_grad(); }
  void step() {
    inner.step();
    diloco.step();
  }
};

// 3d. --sync-every: local SGD / DiLoCo against DDP, in alternating rounds. Each DiLoCo phase
// is a whole number of rounds (its warmup one round), so its time and bytes per step are
// those of a run.
template <typename Module>
DiLoCoTimes time_diloco(const ModelBench<Module>& b) {
  constexpr int kRounds = 4;
  const int h = static_cast<int>(b.o.sync_every);
  const int steps = (std::max(b.steps, h) + h - 1) / h * h;
  DiLoCoOptions options;
  options.sync_every = h;
  options.fragments = b.o.fragments;
  options.outer_dtype = b.o.outer_dtype;
  options.outer = b.o.outer_optimizer;
  Module plain_model = b.fresh_model(), local_model = b.fresh_model();
  DistributedDataParallel plain(plain_model.ptr());
  DiLoCo diloco(local_model->parameters(), default_group(), options);
  const std::unique_ptr<torch::optim::Optimizer> plain_optimizer = b.optimizer(plain.parameters());
  const std::unique_ptr<torch::optim::Optimizer> inner = b.optimizer(local_model->parameters());
  InnerThenOuter local_optimizer{*inner, diloco};
  auto plain_forward = [&](const at::Tensor& x) { return plain.forward(x); };
  auto local_forward = [&](const at::Tensor& x) { return local_model->forward(x); };
  DiLoCoTimes out;
  int64_t numel = 0;
  for (const at::Tensor& p : plain.parameters()) numel += p.numel();
  const int n = b.group.size();
  out.ddp_bytes = static_cast<double>(detail::outer_average_bytes(numel, n, "float32"));
  for (int64_t k = 0; k < options.fragments; ++k) {
    const int64_t part = numel * (k + 1) / options.fragments - numel * k / options.fragments;
    const double bytes = static_cast<double>(detail::outer_average_bytes(part, n, options.outer_dtype));
    out.mean_bytes += bytes / h;
    out.peak_bytes = std::max(out.peak_bytes, bytes);
  }
  StepParts parts;
  const auto timed = [&](const char* phase, int warmup, int count, auto&& step, double& link) {
    const int64_t sent = link_tx_bytes();
    const double t = time_steps(b.line, phase, b.group, warmup, count, step).step;
    link = static_cast<double>(link_tx_bytes() - sent) / (warmup + count);
    return t;
  };
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      if ((round + k) % 2 == 0) {
        out.ddp.push_back(timed("ddp (against local SGD / DiLoCo)", b.o.warmup, b.steps,
                                [&](int i) { b.train_step(plain_forward, *plain_optimizer, parts, i); }, out.link_ddp));
      } else {
        out.diloco.push_back(timed("local SGD / DiLoCo", h, steps,
                                   [&](int i) { b.train_step(local_forward, local_optimizer, parts, i); },
                                   out.link_diloco));
      }
    }
  }
  return out;
}

inline void report_diloco(const BenchDdpOptions& o, const DiLoCoTimes& d) {
  const double plain = median(d.ddp), local = median(d.diloco);
  std::printf("%s every %lld steps (%lld fragment(s), %s exchange), medians of %zu rounds: step %.2f ms against "
              "DDP's %.2f ms (%.3f); bytes each rank sends per step: %.0f over a round, %.0f in its largest step, "
              "against DDP's %.0f (1/%.1f and 1/%.1f)",
              o.outer_optimizer == "replace" ? "local SGD" : "DiLoCo", static_cast<long long>(o.sync_every),
              static_cast<long long>(o.fragments), o.outer_dtype.c_str(), d.diloco.size(), local * 1e3, plain * 1e3,
              local / plain, d.mean_bytes, d.peak_bytes, d.ddp_bytes, d.ddp_bytes / d.mean_bytes,
              d.ddp_bytes / d.peak_bytes);
  if (d.link_ddp > 0) std::printf("; measured on the link: %.0f against %.0f", d.link_diloco, d.link_ddp);
  std::printf("\n");
}

}  // namespace datapar::tools
