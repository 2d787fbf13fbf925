// dcp::save in the background, as PyTorch's dcp.async_save: the step that saves pays for
// copying the state into host memory; the write, the fsyncs and .metadata follow on a thread
// of the saver's own while training goes on.
//
//   auto saver = dcp::AsyncSaver(datapar::new_group(all_ranks));  // every rank, once
//   for (...) {
//     saver.check();                                 // a failed save is reported here...
//     ... train ...
//     saver.save(state, "ck/step-" + std::to_string(step));  // every rank, returns after staging
//   }
//   saver.wait();                                    // ...or here, never lost
//
// The group is the saver's alone: its exchanges (dcp::save's three all_gathers) run on the
// writer's thread while the training's collectives run on theirs, and two threads must not
// share a group. One save is in flight at a time: a save() while the previous is still being
// written waits for it, and warns. A process killed during the write leaves no .metadata in
// that directory (load() refuses it) and the previous checkpoints as they were.
#pragma once

#include <memory>
#include <string>

#include "datapar/dcp/checkpoint.h"
#include "datapar/process_group/process_group.h"

namespace datapar::dcp {

class AsyncSaver {
 public:
  // `group`: the ranks that save together, used by this saver only (make it with new_group
  // over the same ranks); nullptr: this process saves alone.
  explicit AsyncSaver(std::shared_ptr<ProcessGroup> group = nullptr);
  ~AsyncSaver();  // waits for the save in flight; a failure nobody was told of is warned about
  AsyncSaver(AsyncSaver&&) noexcept;
  AsyncSaver& operator=(AsyncSaver&&) noexcept;

  // Agrees the save's plan with the other ranks (one exchange of small messages: a rank that
  // comes late holds the others here, as dcp::save would), copies what this rank writes
  // into host memory (its boxes, and the whole tensors the plan gives it: about 1/N of the
  // replicated ones; pinned for CUDA tensors; kept for the next save of the same shapes)
  // and returns; the write of dcp::save goes on in the background. Waits first for a save
  // still in flight (with a warning). Throws the failure (CheckpointError) of an earlier save
  // not yet reported, before staging anything, and what dcp::save throws before it writes
  // (a directory it cannot use, ranks whose states differ). Every rank of the group calls
  // it, with the same directories in the same order.
  void save(const State& state, const std::string& dir);
  // Throws the failure of a save that has ended and was not reported yet; never waits.
  void check();
  // Waits for the save in flight, then check().
  void wait();
  // Whether a save is being written.
  bool in_flight() const;
  // Seconds the last save() blocked its caller: waiting for the previous save, and staging.
  double last_blocked_seconds() const;
  // Host memory held for staging.
  int64_t staging_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace datapar::dcp
