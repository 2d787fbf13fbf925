#include "autograd/end_of_backward.h"

#include <torch/csrc/autograd/engine.h>

#include <exception>
#include <utility>
#include <vector>

namespace datapar::detail {
namespace {

struct Held {
  int depth = 0;  // BackwardInsideBackward scopes alive on this thread
  std::vector<std::function<void()>> callbacks;
};

thread_local Held held;

}  // namespace

void at_end_of_backward(std::function<void()> callback) {
  if (held.depth > 0) {
    held.callbacks.push_back(std::move(callback));
    return;
  }
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

BackwardInsideBackward::BackwardInsideBackward() : exceptions_(std::uncaught_exceptions()) { ++held.depth; }

BackwardInsideBackward::~BackwardInsideBackward() {
  if (--held.depth > 0) return;
  std::vector<std::function<void()>> callbacks = std::move(held.callbacks);
  held.callbacks.clear();
  if (std::uncaught_exceptions() > exceptions_) return;  // the backward fails: nothing to finish
  // Back in the outer backward's node: queued now, they run when it ends.
  for (auto& callback : callbacks) torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

}  // namespace datapar::detail
