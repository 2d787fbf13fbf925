// parallel_apply and the autograd node that makes its backward parallel.
//
// Note [Parallel section]
// libtorch's autograd engine runs every CPU node on the thread that called backward(), so
// a DataParallel whose replicas were joined into the graph the usual way (Python's
// Broadcast/ReduceAdd) would run the replicas' backward one after another. Instead:
//   a. Forward: each replica runs on its device's thread against its own leaves: its own
//      parameters (see ReplicaSet) and fresh leaves standing in for its input tensors.
//   b. The replica outputs are handed to the caller as new tensors whose grad_fn is one
//      ParallelSectionBackward node, with edges to the master's parameters and to the
//      original (scattered) inputs.
//   c. Backward reaches that node once, with the gradients of every replica output. It runs
//      torch::autograd::grad for each replica on that replica's thread, concurrently: each
//      thread drives its own graph task, as any thread calling grad() does.
//   d. The replica gradients are summed per parameter (also spread over the threads) and
//      returned; the engine accumulates them into the master's .grad as for any node.
// Replica graphs are kept (retain_graph) until the engine releases the node, so
// backward(retain_graph=true) through a parallel section works as usual.
// CUDA: when the gradients arrive on cuda:K, the engine runs this node on its thread for
// cuda:K, which the replica on cuda:K needs for its own backward; that replica's backward
// therefore runs right here (a re-entrant backward), the others on their threads.
#include "datapar/parallel/parallel_apply.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "autograd/node_ptr.h"
#include "parallel/device_workers.h"
#include "parallel/ivalue_tensors.h"

namespace datapar::detail {
namespace {

using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What one replica's forward leaves for backward.
struct ReplicaGraph {
  std::vector<at::Tensor> outputs;       // replica outputs that require grad, graphs attached
  std::vector<uint32_t> slots;           // the node input each output feeds
  std::vector<at::Tensor> params;        // the replica's parameters that require grad
  std::vector<at::Tensor> input_leaves;  // stand-ins for the input tensors that require grad
  std::vector<size_t> input_results;     // the node output each leaf's gradient goes to
};

// Whether nobody but the caller can see t's memory: t is referenced once, and so is its
// storage, or t is a view (autograd returns mm results transposed, for one) of a base that
// only that view references.
bool sole_owner(const at::Tensor& t) {
  if (t.use_count() != 1) return false;
  const size_t storage_refs = t.storage().use_count();
  if (storage_refs == 1) return true;
  return t.is_view() && storage_refs == 2 && t._base().use_count() == 1;
}

// Note [Summing straight into .grad]
// The engine would add each summed gradient into the master's .grad with AccumulateGrad, on
// the one thread that runs backward: a serial pass over every parameter (2.7 MB for the
// benchmark MLP). Where that pass would do nothing but `grad += sum` (AccumulateGrad's own
// rule when .grad is defined, grad mode is off and nothing hooks the parameter), the device
// threads add the replica gradients into .grad themselves, each over its share of the
// parameters, and the engine is handed no gradient for it. Where .grad is not defined yet
// (libtorch 2.x's zero_grad() sets it to none by default), they store the sum as .grad, as
// AccumulateGrad would. A parameter with any hook keeps
// the engine's path, so every hook sees what it would see without datapar: tensor hooks
// (in the tensor's autograd meta up to 1.13, on its gradient accumulator from 2.0),
// pre- and post-hooks on the accumulator, retains_grad hooks, and 2.1's
// post-accumulate-grad hooks.
bool has_hooks(const at::Tensor& param) {
  if (!torch::autograd::impl::hooks(param).empty()) return true;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (torch::autograd::impl::post_acc_grad_hooks(param)) return true;
#endif
  const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(param);
  if (!accumulator) return false;
  if (!accumulator->pre_hooks().empty() || !accumulator->post_hooks().empty()) return true;
#if TORCH_VERSION_MAJOR >= 2
  if (!accumulator->tensor_pre_hooks().empty() || !accumulator->retains_grad_hooks().empty()) return true;
#endif
  return false;
}

// Who puts a parameter's summed gradient into its .grad.
enum class GradPath : char {
  kEngine,     // the engine's AccumulateGrad (result[j])
  kAddToGrad,  // the device threads: .grad += sum
  kSetGrad,    // the device threads: .grad = sum (no .grad yet, e.g. after 2.x's zero_grad())
};

GradPath grad_path(const at::Tensor& param) {
  if (has_hooks(param)) return GradPath::kEngine;
  const at::Tensor& grad = param.grad();
  if (!grad.defined()) {
    // AccumulateGrad would take the sum as .grad if it obeys the layout contract (the
    // parameter's strides), else a copy that does: for a contiguous parameter, contiguous.
    return param.layout() == at::kStrided && param.is_contiguous() ? GradPath::kSetGrad : GradPath::kEngine;
  }
  const bool addable = grad.layout() == at::kStrided && !grad.requires_grad() &&
                       grad.scalar_type() == param.scalar_type() && grad.device() == param.device() &&
                       grad.sizes() == param.sizes();
  return addable ? GradPath::kAddToGrad : GradPath::kEngine;
}

// Splits tensors into `parts` contiguous ranges of about equal total size; returns the end
// index of each range (the last is tensors.size()).
std::vector<size_t> split_by_size(const std::vector<at::Tensor>& tensors, size_t parts) {
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += t.numel();
  std::vector<size_t> ends;
  int64_t running = 0;
  for (size_t j = 0; j < tensors.size(); ++j) {
    running += tensors[j].numel();
    while (ends.size() + 1 < parts &&
           running * static_cast<int64_t>(parts) >= total * static_cast<int64_t>(ends.size() + 1)) {
      ends.push_back(j + 1);
    }
  }
  ends.resize(parts, tensors.size());
  return ends;
}

class ParallelSectionBackward : public torch::autograd::Node {
 public:
  ParallelSectionBackward(std::shared_ptr<DeviceWorkers> workers, std::vector<at::Tensor> params,
                          std::shared_ptr<ReplicaTimes> times)
      : workers_(std::move(workers)), params_(std::move(params)), times_(std::move(times)),
        generation_(times_ ? times_->generation.load() : 0) {}

  std::string name() const override { return "datapar::ParallelSectionBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    graphs_.clear();
    released_ = true;
  }

  variable_list apply(variable_list&& grads) override;

  std::vector<ReplicaGraph> graphs_;

 private:
  size_t replica_on_this_thread(const variable_list& grads) const;

  std::shared_ptr<DeviceWorkers> workers_;
  std::vector<at::Tensor> params_;  // the master's parameters that get gradients
  std::shared_ptr<ReplicaTimes> times_;  // null unless DataParallel balances by measurement
  uint64_t generation_;                  // the step times_ was reset for
  bool released_ = false;
};

// The engine runs a node on the thread of the first CUDA device among its incoming gradients
// (InputBuffer::device(): the first that is not the CPU), whatever the order of the CPU
// ones: with unlike devices (cuda:0,cpu:0) a CPU replica's gradient may come first.
size_t ParallelSectionBackward::replica_on_this_thread(const variable_list& grads) const {
  for (const at::Tensor& g : grads) {
    if (!g.defined() || !g.is_cuda()) continue;
    for (size_t i = 0; i < graphs_.size(); ++i) {
      if (workers_->devices()[i].torch_device() == g.device()) return i;
    }
    return DeviceWorkers::kNone;
  }
  return DeviceWorkers::kNone;
}

variable_list ParallelSectionBackward::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!released_,
              "DataParallel: trying to backward through a parallel section a second time, but its "
              "graph was freed by the first backward. Pass retain_graph=true to the first backward.");
  const size_t n = graphs_.size();
  const size_t num_params = params_.size();

  std::vector<GradPath> paths;  // per parameter, when the device threads may sum (set below)

  // d. (below) sums replica gradients per parameter, each thread taking a contiguous range
  // of about equal size, in replica order (deterministic).
  auto sum_range = [&](std::vector<variable_list>& grads_of, variable_list& result, size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j) {
      const GradPath path = paths.empty() ? GradPath::kEngine : paths[j];
      if (path == GradPath::kAddToGrad) {  // Note [Summing straight into .grad]
        at::Tensor grad = params_[j].grad();
        for (size_t i = 0; i < n; ++i) {
          if (!grads_of[i].empty() && grads_of[i][j].defined()) grad.add_(grads_of[i][j]);
        }
        continue;  // result[j] stays undefined: nothing left for AccumulateGrad to do
      }
      at::Tensor sum;
      bool owned = false;  // may we add into `sum` in place?
      for (size_t i = 0; i < n; ++i) {
        if (grads_of[i].empty() || !grads_of[i][j].defined()) continue;
        at::Tensor g = std::move(grads_of[i][j]);
        if (g.device() != params_[j].device()) g = g.to(params_[j].device());
        if (!sum.defined()) {
          // Adding in place saves allocating a gradient-sized buffer per parameter and
          // step, but only into memory nobody else can see: autograd may hand back a view
          // of an incoming gradient (a parameter used through view()).
          sum = std::move(g);
          owned = sole_owner(sum);
        } else if (!owned) {
          sum = sum + g;
          owned = true;
        } else {
          sum.add_(g);
        }
      }
      if (path == GradPath::kSetGrad) {
        // result[j] stays undefined. What AccumulateGrad would store: the sum itself when
        // nobody else can see it and it is laid out like the parameter, else a copy. Detached,
        // as AccumulateGrad does: a view (an mm result autograd hands over transposed) would
        // make the optimizer's zero_grad() fail on detach_().
        if (sum.defined()) {
          params_[j].mutable_grad() = owned && sum.is_contiguous() ? sum.detach() : sum.clone(at::MemoryFormat::Contiguous);
        }
        continue;
      }
      result[j] = std::move(sum);
    }
  };
  // Replicas on CUDA devices (a CPU master beside a GPU: cpu:0,cuda:0) hand back gradients
  // that must be moved before they are added: the engine's path below does.
  const auto& devices = workers_->devices();
  const bool all_cpu = std::all_of(params_.begin(), params_.end(), [](const at::Tensor& p) { return p.is_cpu(); }) &&
                       std::none_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_cuda(); });
  // CPU threads sum their share right after a barrier instead of in a second round of
  // tasks: one hand-off fewer per step (Note [Spin before sleeping] in device_workers.cc).
  const bool fused = all_cpu && n > 1 && num_params > 0 && workers_->runs_concurrently();
  if (fused && !at::GradMode::is_enabled()) {
    paths.resize(num_params);
    for (size_t j = 0; j < num_params; ++j) paths[j] = grad_path(params_[j]);
  }
  const std::vector<size_t> ends = fused ? split_by_size(params_, n) : std::vector<size_t>{};

  // c. Each replica's backward on its own thread.  grads_of[i]: params then input leaves.
  std::vector<variable_list> grads_of(n);
  variable_list result(num_outputs());
  std::atomic<size_t> arrived{0};
  // Timed only for the step times_ now describes (not a backward through an older section).
  ReplicaTimes* const times = times_ && times_->generation.load() == generation_ ? times_.get() : nullptr;
  workers_->run(
      n,
      [&](size_t i) {
        {
          // Counted however the backward ends, so that no thread waits forever below.
          struct Arrive {
            std::atomic<size_t>& count;
            ~Arrive() { count.fetch_add(1, std::memory_order_acq_rel); }
          } arrive{arrived};
          const ReplicaGraph& g = graphs_[i];
          variable_list outputs;
          variable_list output_grads;
          for (size_t k = 0; k < g.outputs.size(); ++k) {
            if (grads[g.slots[k]].defined()) {
              outputs.push_back(g.outputs[k]);
              output_grads.push_back(grads[g.slots[k]]);
            }
          }
          variable_list targets = g.params;
          targets.insert(targets.end(), g.input_leaves.begin(), g.input_leaves.end());
          const auto start = Clock::now();
          if (!outputs.empty() && !targets.empty()) {
            grads_of[i] = torch::autograd::grad(outputs, targets, output_grads, /*retain_graph=*/true,
                                                /*create_graph=*/false, /*allow_unused=*/true);
          }
          if (times) {
            wait_for_device(workers_->devices()[i]);
            times->backward[i] = seconds_since(start);
          }
        }
        if (!fused) return;
        while (arrived.load(std::memory_order_acquire) < n) std::this_thread::yield();
        sum_range(grads_of, result, i == 0 ? 0 : ends[i - 1], ends[i]);
      },
      "DataParallel backward: replica", replica_on_this_thread(grads));

  for (size_t i = 0; i < n; ++i) {
    if (grads_of[i].empty()) continue;
    for (size_t k = 0; k < graphs_[i].input_results.size(); ++k) {
      result[graphs_[i].input_results[k]] = grads_of[i][num_params + k];
    }
  }
  if (!fused && num_params > 0) sum_range(grads_of, result, 0, num_params);
  return result;
}

}  // namespace

void check_parallel_apply_devices(const ReplicaSet& replicas, size_t num_inputs, const std::vector<Device>& devices) {
  DATAPAR_CHECK(devices.size() >= num_inputs, "parallel_apply: ", num_inputs, " inputs but only ",
                devices.size(), " devices; give one device per input.");
  for (size_t i = 0; i < num_inputs && i < replicas.size(); ++i) {
    DATAPAR_CHECK(devices[i] == replicas.devices()[i], "parallel_apply: input ", i, " is meant for ", devices[i],
                  " but replica ", i, " lives on ", replicas.devices()[i],
                  ". Pass the devices the replicas were made for (", to_string(replicas.devices()), ").");
  }
}

std::vector<c10::IValue> parallel_apply(ReplicaSet& replicas, const ReplicaForward& forward,
                                        const std::vector<c10::IValue>& inputs,
                                        const std::shared_ptr<ReplicaTimes>& times) {
  const size_t n = inputs.size();
  DATAPAR_CHECK(n >= 1 && n <= replicas.size(), "parallel_apply: ", n, " inputs for ", replicas.size(),
                " replicas; give between 1 and ", replicas.size(), " inputs.");
  replicas.refresh_shared();  // the copies: on each replica's thread, below

  const std::vector<at::Tensor>& master_params = replicas.master_parameters();
  std::vector<size_t> trained;  // indices of the master parameters that require grad
  for (size_t j = 0; j < master_params.size(); ++j) {
    if (master_params[j].requires_grad()) trained.push_back(j);
  }
  const bool grad_mode = at::GradMode::is_enabled();

  // a. Leaves for the inputs that require grad, so each replica's graph ends at its own.
  std::vector<ReplicaGraph> graphs(n);
  std::vector<at::Tensor> originals;  // the input tensors those leaves stand in for
  std::vector<c10::IValue> replica_inputs(n);
  for (size_t i = 0; i < n; ++i) {
    if (!grad_mode) {
      replica_inputs[i] = inputs[i];
      continue;
    }
    replica_inputs[i] = map_tensors(inputs[i], [&](const at::Tensor& t) {
      if (!t.defined() || !t.requires_grad()) return t;
      at::Tensor leaf = t.detach().requires_grad_(true);
      graphs[i].input_leaves.push_back(leaf);
      graphs[i].input_results.push_back(trained.size() + originals.size());
      originals.push_back(t);
      return leaf;
    });
  }

  if (times) {
    times->generation.fetch_add(1);
    times->forward.assign(n, -1.0);
    times->backward.assign(n, -1.0);
  }
  std::vector<c10::IValue> outputs(n);
  replicas.workers().run(
      n,
      [&](size_t i) {
        const auto start = Clock::now();
        replicas.refresh_copies(i);
        outputs[i] = forward(i, replica_inputs[i]);
        if (times) {
          wait_for_device(replicas.devices()[i]);
          times->forward[i] = seconds_since(start);
        }
      },
      "parallel_apply: replica");
  if (!grad_mode || (trained.empty() && originals.empty())) return outputs;

  // b. One node for the whole section.
  std::vector<at::Tensor> trained_params;
  for (size_t j : trained) trained_params.push_back(master_params[j]);
  std::vector<at::Tensor> edge_tensors = trained_params;
  edge_tensors.insert(edge_tensors.end(), originals.begin(), originals.end());
  const auto node = make_node<ParallelSectionBackward>(replicas.workers_ptr(), std::move(trained_params), times);
  node->set_next_edges(torch::autograd::collect_next_edges(edge_tensors));

  for (size_t i = 0; i < n; ++i) {
    for (size_t j : trained) graphs[i].params.push_back(replicas.replica_parameters(i)[j]);
    outputs[i] = map_tensors(outputs[i], [&](const at::Tensor& out) {
      if (!out.defined() || !out.requires_grad()) return out;
      at::Tensor handed = out.variable_data();  // same storage and version counter, no history
      torch::autograd::set_history(handed, node);
      graphs[i].outputs.push_back(out);
      graphs[i].slots.push_back(handed.output_nr());
      return handed;
    });
  }
  node->graphs_ = std::move(graphs);
  return outputs;
}

}  // namespace datapar::detail
