// One unit of fully sharded data parallelism: a set of parameters that are gathered, used,
// freed and have their gradients reduce-scattered together (a wrapped submodule's, or the
// root's own). The iteration around the units (order, prefetch, end of backward) is
// FsdpRun's.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/node_ptr.h"
#include "datapar/fsdp/fsdp_options.h"
#include "datapar/process_group/process_group.h"

namespace datapar::detail {

class FsdpRun;

class FsdpUnit : public std::enable_shared_from_this<FsdpUnit> {
 public:
  // Shards `params` (collective: they take rank 0's values on every rank). `name` is for
  // errors. REQUIRES: params non-empty, trainable, of one floating dtype and device.
  FsdpUnit(std::string name, std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group, FsdpOptions options);
  ~FsdpUnit();
  FsdpUnit(const FsdpUnit&) = delete;
  FsdpUnit& operator=(const FsdpUnit&) = delete;

  // Keeps the floating-point ones of `buffers` in FsdpOptions::buffer_dtype, if set.
  void cast_buffers(const std::vector<at::Tensor>& buffers);
  // A buffer's dtype before cast_buffers, if it cast it.
  std::optional<at::ScalarType> original_dtype(const at::Tensor& buffer) const;

  // Makes the unit's parameter hooks (after construction: they hold a weak pointer to it).
  void install_hooks();

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // Gathered from the root's forward to the unit's backward, as the root's own unit: for a
  // unit whose forward nothing brackets (a named member sharded in place).
  void keep_through_forward() {
    options_.reshard_after_forward = false;
    options_.reshard_after_forward_group = nullptr;
  }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  const FsdpOptions& options() const { return options_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  // This rank's part of the parameters, flat and padded: what the optimizer steps.
  const at::Tensor& shard() const { return shard_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_; }

  // Set by the root (nullptr when it goes): the iteration the unit takes part in.
  void attach(FsdpRun* run) { run_ = run; }
  bool attached() const { return run_ != nullptr; }

  // The module's side.
  void pre_forward();
  void post_forward(const c10::IValue& outputs);

  // The run's side.
  void start_gather();   // issues the all-gather, unless gathered or issued
  void wait_gathered();  // the parameters hold their values after it
  void reshard();        // frees the gathered parameters
  bool gathered() const;
  bool in_backward() const { return in_backward_; }
  bool needs_backward() const { return used_in_forward_ && !reduced_; }
  // Issues the reduce-scatter of the parameters' gradients (zeros where none arrived).
  // Outside sync (no_sync), the gradients stay in the parameters' .grad instead.
  void reduce_gradients();
  // HSDP: waits for the reduce-scatter and issues the all-reduce of its result across the
  // replicas (FsdpOptions::replicate_group). Nothing without replicas, or when not issued.
  void reduce_across_replicas();
  // Waits for the reduction (across the replicas too, issuing that first if need be), adds
  // the result to the shard's gradient and frees its buffers.
  void finish_reduce();
  // finish_reduce(), frees the parameters and ends the unit's iteration.
  void finish_backward();
  // Forgets an iteration that had no backward (an evaluation forward with grad on).
  void abandon_iteration();

  // The unsharded values (unpadded, the shard's dtype) on every rank: collective.
  at::Tensor full_values() const;
  // Takes this rank's part of `values` (numel() elements, any dtype) as the shard.
  void load_full_values(const at::Tensor& values);

 private:
  class ReadyHook;
  void pre_backward();
  void param_ready();

  std::string name_;
  std::vector<at::Tensor> params_;  // views of full_ (Note [Parameters over a flat buffer])
  std::shared_ptr<ProcessGroup> group_;
  FsdpOptions options_;
  FsdpRun* run_ = nullptr;
  at::Tensor full_;   // flat, padded, in the compute dtype; its storage is empty when resharded
  at::Tensor shard_;  // this rank's part, in the parameters' own dtype: a leaf
  // Between forward and backward under FsdpOptions::reshard_after_forward_group: this
  // rank's part of full_ in that group's layout, which backward gathers from.
  at::Tensor post_forward_part_;
  int64_t numel_ = 0;
  int64_t padded_ = 0;

  // In flight: the all-gather and what it reads and writes.
  std::shared_ptr<Work> gather_work_;
  at::Tensor gather_source_;
  std::vector<at::Tensor> gather_parts_;
  // In flight: the reduce-scatter, then (HSDP) the all-reduce across replicas, and their
  // buffers.
  std::shared_ptr<Work> reduce_work_;
  std::shared_ptr<Work> replicate_work_;
  ReduceOp reduce_op_ = ReduceOp::kAvg;
  at::Tensor reduce_input_;
  at::Tensor reduce_output_;

  std::unordered_map<const void*, at::ScalarType> buffer_dtypes_;  // of the buffers cast

  std::vector<NodePtr> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  // This iteration.
  bool used_in_forward_ = false;  // its forward ran with autograd recording
  bool in_backward_ = false;      // gathered for backward
  bool reduced_ = false;          // gradients handed to the reduce-scatter (or kept, outside sync)
  size_t ready_ = 0;              // parameters whose gradient arrived
};

}  // namespace datapar::detail
