// The reducer: DDP's gradient synchronisation.
//
// A post-hook on each parameter's gradient accumulator copies the fresh gradient, scaled,
// into its bucket's flat buffer; a bucket whose gradients are all in is handed to the
// communication hook at once (buckets strictly in index order, the same on every rank),
// so reduction overlaps with the rest of backward. A callback queued on the autograd
// engine runs when backward ends: it waits for every bucket and writes the averaged
// gradients into .grad. After the first synchronised iteration the buckets are rebuilt in
// the order rank 0's gradients actually arrived.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <vector>

#include "autograd/node_ptr.h"
#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/communication_stats.h"
#include "ddp/wait_timer.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"
#include "ddp/bucket_assignment.h"

namespace datapar::detail {

struct ReducerOptions {
  int64_t first_bucket_bytes = 1 << 20;
  int64_t bucket_bytes = 25 << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool average_by_samples = false;
};

class Reducer {
 public:
  // params: the parameters that take gradients, in registration order; names for errors.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
          ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // At the start of a forward run with grad mode on: whether its backward synchronises,
  // and its local sample count (counts add up over no_sync forwards until a sync one).
  // Rebuilds the buckets here when due (a broadcast from rank 0).
  void prepare_forward(bool sync, int64_t samples);

  // At the end of that forward. With find_unused_parameters, parameters that `outputs`
  // do not depend on are marked ready (with a zero gradient) now.
  void prepare_backward(const std::vector<at::Tensor>& outputs);

  void set_comm_hook(std::shared_ptr<CommHook> hook);

  // For a rank that has run out of inputs (join): issues the collectives of one
  // synchronised backward with zero gradients and no samples, matching the others'.
  void shadow_backward();

  // Parameter indices per bucket, in reduction order.
  std::vector<BucketIndices> bucket_indices() const;
  // Reads the GPU's timings of the passes so far (wait_timer.h): blocks until it ran them.
  CommunicationStats communication_stats() const;

 private:
  struct Bucket {
    BucketIndices params;
    std::vector<int64_t> offsets;
    at::Tensor flat;
    size_t pending = 0;
    std::shared_ptr<Work> work;
    GradBucket view;  // what the hook sees
  };
  class ReadyHook;

  void build_buckets(const std::vector<size_t>& order);
  void reset_pass();
  void mark_ready(size_t index);  // from the hook
  void ready(size_t index, bool has_gradient);
  // average_by_samples: the rank's share of the global batch (Note [Averaging by samples]).
  const at::Tensor& sample_share();
  void launch_ready_buckets();
  void issue_meta(double samples, const std::vector<bool>& used);
  void finalize();
  void wait_bucket(Bucket& bucket);
  void wait_buckets();  // every bucket, in order, each finished by the hook
  at::Tensor slice(size_t index) const;      // the parameter's part of its bucket, flat
  at::Tensor grad_view(size_t index) const;  // the same memory laid out as the parameter

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::shared_ptr<CommHook> hook_;

  std::vector<NodePtr> accumulators_;  // kept alive: they hold the hooks
  std::vector<uintptr_t> hook_keys_;

  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param -> bucket
  std::vector<size_t> slot_of_;    // param -> position within its bucket

  // The current pass.
  bool sync_ = true;
  bool expect_hooks_ = false;
  bool callback_queued_ = false;
  double samples_ = 0;  // local samples since the last synchronised backward
  std::vector<bool> ready_;
  std::vector<bool> used_;  // locally used in this pass (find_unused_parameters)
  size_t next_bucket_ = 0;
  at::Tensor meta_;  // [samples, used flags...], all-reduced
  std::shared_ptr<Work> meta_work_;
  at::Tensor share_;  // average_by_samples: this rank's samples / all ranks', 0-dim on the group's device
  std::vector<size_t> arrival_;  // gradient arrival order, recorded in the first synchronised pass
  int64_t synced_passes_ = 0;
  CommunicationStats stats_;  // of synchronised backward passes (not join()'s shadow passes)
  std::unique_ptr<WaitTimer> exposed_wait_;  // stats_.exposed_wait, timed where the wait happens
  bool rebuild_pending_ = false;
};

}  // namespace datapar::detail
