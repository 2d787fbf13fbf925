// Work to run once the backward pass in progress ends (DDP's finalize), and the
// recomputations that run a backward inside it (activation checkpointing), which must not
// end it early (Note [Backward inside backward] in checkpoint.cc).
#pragma once

#include <functional>

namespace datapar::detail {

// Runs `callback` when the backward pass this thread runs ends: the outermost one, even
// when called from within a recomputation's backward. REQUIRES: called from a node or hook
// of a running backward pass.
void at_end_of_backward(std::function<void()> callback);

// While alive on a thread, at_end_of_backward() holds its callbacks; the destructor hands
// them to the backward pass around (when it is the outermost scope). Make one around a
// backward run inside a node's apply().
class BackwardInsideBackward {
 public:
  BackwardInsideBackward();
  ~BackwardInsideBackward();
  BackwardInsideBackward(const BackwardInsideBackward&) = delete;
  BackwardInsideBackward& operator=(const BackwardInsideBackward&) = delete;

 private:
  int exceptions_;  // in flight when made: more at the end means the backward failed
};

}  // namespace datapar::detail
