// See checkpoint.h.
//
// Note [Backward inside backward]
// A checkpointed segment's node recomputes the segment and runs a backward through the
// recomputation from within its own apply(): a second backward pass, nested in the first.
// Whatever a hook asks to run "when backward ends" (libtorch's Engine::queue_callback, e.g.
// DDP's finalize, which waits for every bucket) would join the nested pass and run when it
// ends, while the outer pass has gradients still to come. So the node holds such callbacks
// while its backward runs (BackwardInsideBackward, end_of_backward.h) and hands them to the
// outer pass when it returns, and datapar queues them through at_end_of_backward().
#include "datapar/autograd/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>

#include "datapar/error.h"
#include "autograd/end_of_backward.h"
#include "autograd/node_ptr.h"

namespace datapar {
namespace {

using torch::autograd::variable_list;

// The states of the generators a segment draws from: the CPU's and those of the CUDA
// devices its inputs are on.
class RngStates {
 public:
  RngStates() = default;
  explicit RngStates(const std::vector<at::Tensor>& inputs) {
    std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
    for (const at::Tensor& t : inputs) {
      if (t.defined() && t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    for (const c10::Device& device : devices) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      const std::lock_guard<std::mutex> lock(generator.mutex());
      states_.emplace_back(device, generator.get_state());
    }
  }

  // The states of the same generators now.
  RngStates now() const {
    RngStates current;
    for (const auto& [device, state] : states_) current.states_.emplace_back(device, state_of(device));
    return current;
  }

  void restore() const {
    for (const auto& [device, state] : states_) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      const std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }

 private:
  static at::Tensor state_of(const c10::Device& device) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    const std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }

  std::vector<std::pair<c10::Device, at::Tensor>> states_;
};

// What the forward returned, to hold the recomputation to it.
struct Returned {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  bool defined;
};

std::string describe(const std::vector<Returned>& outputs) {
  std::string text;
  for (const Returned& r : outputs) {
    if (!text.empty()) text += ", ";
    text += r.defined ? c10::str(r.dtype, c10::IntArrayRef(r.sizes)) : "undefined";
  }
  return text;
}

std::vector<Returned> returned(const std::vector<at::Tensor>& outputs) {
  std::vector<Returned> r;
  for (const at::Tensor& t : outputs) {
    r.push_back(t.defined() ? Returned{t.sizes().vec(), t.scalar_type(), true} : Returned{{}, at::kFloat, false});
  }
  return r;
}

bool same(const std::vector<Returned>& a, const std::vector<Returned>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined != b[i].defined || (a[i].defined && (a[i].sizes != b[i].sizes || a[i].dtype != b[i].dtype))) {
      return false;
    }
  }
  return true;
}

class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(Segment segment, std::vector<at::Tensor> inputs, RngStates rng, bool preserve_rng,
                     std::vector<Returned> outputs)
      : segment_(std::move(segment)),
        inputs_(std::move(inputs)),
        rng_(std::move(rng)),
        preserve_rng_(preserve_rng),
        outputs_(std::move(outputs)) {
    for (const at::Tensor& t : inputs_) versions_.push_back(t.defined() ? t._version() : 0);
  }

  std::string name() const override { return "datapar::CheckpointBackward"; }

  // Per output, the index of its gradient in apply()'s grads; -1: it has none.
  void set_slots(std::vector<int64_t> slots) { slots_ = std::move(slots); }

  void release_variables() override {
    inputs_.clear();
    released_ = true;
  }

  variable_list apply(variable_list&& grads) override {
    DATAPAR_CHECK(!released_, "checkpoint: a second backward through a checkpointed segment; its inputs were "
                  "released after the first (retain_graph=true is not supported through a checkpoint).");
    std::vector<at::Tensor> detached;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const at::Tensor& input = inputs_[i];
      DATAPAR_CHECK(!input.defined() || input._version() == versions_[i], "checkpoint: input ", i,
                    " of a checkpointed segment was modified in place after the segment's forward, so its "
                    "recomputation in backward would see other values. Modify a clone instead.");
      if (!input.defined()) {
        detached.emplace_back();
        continue;
      }
      detached.push_back(input.detach());
      detached.back().requires_grad_(input.requires_grad());
    }
    std::vector<at::Tensor> recomputed;
    {
      const RngStates current = preserve_rng_ ? rng_.now() : RngStates();
      if (preserve_rng_) rng_.restore();
      const at::AutoGradMode grad_mode(true);
      try {
        recomputed = segment_(detached);
      } catch (...) {
        current.restore();
        throw;
      }
      current.restore();
    }
    const std::vector<Returned> again = returned(recomputed);
    DATAPAR_CHECK(same(again, outputs_), "checkpoint: the segment's recomputation in backward returned (",
                  describe(again), ") but its forward returned (", describe(outputs_),
                  "). A checkpointed segment must compute the same thing both times (no shapes that depend on "
                  "state it changes, no random sizes).");
    variable_list roots;
    variable_list root_grads;
    for (size_t k = 0; k < recomputed.size(); ++k) {
      if (slots_[k] < 0) continue;
      const at::Tensor& grad = grads[static_cast<size_t>(slots_[k])];
      if (grad.defined() && recomputed[k].requires_grad()) {
        roots.push_back(recomputed[k]);
        root_grads.push_back(grad);
      }
    }
    if (!roots.empty()) {
      const detail::BackwardInsideBackward nested;  // Note [Backward inside backward]
      torch::autograd::backward(roots, root_grads, /*retain_graph=*/false, /*create_graph=*/false);
    }
    variable_list input_grads;
    for (const at::Tensor& d : detached) {
      input_grads.push_back(d.defined() && d.requires_grad() ? d.grad() : at::Tensor());
    }
    return input_grads;
  }

 private:
  Segment segment_;
  std::vector<at::Tensor> inputs_;
  std::vector<uint32_t> versions_;  // of inputs_ at the forward
  RngStates rng_;
  bool preserve_rng_;
  std::vector<Returned> outputs_;
  std::vector<int64_t> slots_;  // set_slots()
  bool released_ = false;
};

}  // namespace

std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  DATAPAR_CHECK(static_cast<bool>(segment), "checkpoint: the segment is an empty function.");
  if (!at::GradMode::is_enabled()) return segment(inputs);
  RngStates rng = options.preserve_rng_state ? RngStates(inputs) : RngStates();
  std::vector<at::Tensor> outputs;
  {
    const at::NoGradGuard no_grad;
    outputs = segment(inputs);
  }
  std::vector<Returned> shapes = returned(outputs);
  const bool differentiable = std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) {
    return t.defined() && torch::autograd::isDifferentiableType(t.scalar_type());
  });
  if (!differentiable) return outputs;
  std::vector<int64_t> slots;
  auto node = detail::make_node<CheckpointBackward>(segment, inputs, std::move(rng), options.preserve_rng_state,
                                                    std::move(shapes));
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (at::Tensor& out : outputs) {
    if (!out.defined() || !torch::autograd::isDifferentiableType(out.scalar_type())) {
      slots.push_back(-1);
      continue;
    }
    out = out.variable_data();  // an alias of its own: an input or a view returned keeps its history
    torch::autograd::set_history(out, node);
    slots.push_back(out.output_nr());
  }
  node->set_slots(std::move(slots));
  return outputs;
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& segment, const at::Tensor& input,
                      const CheckpointOptions& options) {
  DATAPAR_CHECK(static_cast<bool>(segment), "checkpoint: the segment is an empty function.");
  return checkpoint([segment](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{segment(in[0])}; },
                    {input}, options)[0];
}

}  // namespace datapar
