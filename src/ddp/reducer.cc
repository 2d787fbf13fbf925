// See reducer.h.
//
// Note [Rebuilding the buckets]
// Buckets are first filled in reverse parameter order, the usual order of gradients in
// backward. The real order shows only in the first synchronised backward: the reducer
// records the order in which gradients arrive (mark_ready), completes it with the
// parameters that never reported, and at the next forward rebuilds the buckets in that
// order, so that the first bucket to fill is the first to be all-reduced and communication
// starts as early as backward allows. Arrival orders can differ between ranks (threads race
// in autograd), and buckets must be identical everywhere, since they are matched by
// position: every rank takes rank 0's order, broadcast in prepare_forward. It happens
// once; join()'s shadow passes use the reverse order, as they see no gradients.
//
// Note [Averaging by samples]
// PyTorch divides the summed gradients by the world size, which is the gradient of the
// global batch only when every rank had the same number of samples. With
// average_by_samples each rank scales its gradients by its share n_r / N of the global
// batch (N = sum n_r) before the all-reduce (ready()): sum_r (n_r / N) g_r, exactly the
// gradient of the whole global batch, however uneven the split (the last batch of an epoch,
// unlike devices, ranks that joined). The counts travel in a small metadata all-reduce
// issued as backward starts, ahead of the buckets; the first gradient waits for it (on the
// device, for nccl). Scaling by the share before, not by n_r before and 1/N after, keeps
// what goes on the wire the size of a gradient, as PyTorch's 1/world_size does: summed in a
// 16-bit compression hook, n_r g_r overflows float16 for a global batch of thousands. The
// host never reads N: the share is computed where N is (on the GPU for nccl), so a step
// waits for no device. A pass where no rank had a sample has N = 0 and every n_r = 0: the
// share is taken as 0 (N counted as at least 1), and the gradient is zero, the sum over no
// sample, not NaN.
//
// Note [Bucket views follow the parameters' strides]
// A parameter's part of its bucket is laid out as the parameter is in memory (its strides,
// when it is dense), as PyTorch's reducer does: a channels_last convolution's gradient
// goes into the bucket as a plain memory copy, the gradient written back keeps the
// parameter's layout, and with gradient_as_bucket_view the gradient is the bucket itself,
// channels_last too. A parameter with gaps or overlaps in memory gets contiguous strides.
//
// Note [No host sync in a step]
// Without find_unused_parameters, a synchronised step reads nothing back on the host: the
// counts go up by a non-blocking copy (metadata.h), the share is a device tensor, and the
// buckets are waited for on the stream (Work::wait). With find_unused_parameters the host
// must read which parameters some rank used, to know which gradients to write; that is
// the one read, as in PyTorch. Tests count the reads (metadata_host_reads).
#include "ddp/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdio>
#include <optional>
#include <unordered_set>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/trace.h"
#include "autograd/end_of_backward.h"
#include "cuda/stream_capture.h"
#include "trace/recorder.h"

namespace datapar::detail {

using detail::str_cat;

// Tells the reducer that parameter `index` has its gradient for this pass.
class Reducer::ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(Reducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->mark_ready(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;
  size_t index_;
};

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
                 ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      hook_(all_reduce_hook()) {
  DATAPAR_CHECK(!params_.empty(), "DistributedDataParallel: the module has no parameter that requires a gradient.");
  exposed_wait_ = wait_timer_for(params_.front().device());
  build_buckets(reverse_order(params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[i]));
    DATAPAR_INTERNAL_ASSERT(accumulators_.back() != nullptr, "no gradient accumulator for ", names_[i]);
    hook_keys_.push_back(accumulators_.back()->add_post_hook(std::make_unique<ReadyHook>(this, i)));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Collectives still in flight write into our buffers: let them end first.
  for (Bucket& bucket : buckets_) {
    if (!bucket.work) continue;
    try {
      bucket.work->wait();
    } catch (const std::exception&) {
    }
  }
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  DATAPAR_CHECK(hook != nullptr, "DistributedDataParallel: the communication hook is null.");
  DATAPAR_CHECK(!expect_hooks_, "DistributedDataParallel: set the communication hook between iterations, "
                                "not between forward and backward.");
  hook_ = std::move(hook);
}

std::vector<BucketIndices> Reducer::bucket_indices() const {
  std::vector<BucketIndices> out;
  for (const Bucket& bucket : buckets_) out.push_back(bucket.params);
  return out;
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  for (BucketIndices& members : assign_buckets(params_, order, options_.first_bucket_bytes, options_.bucket_bytes)) {
    Bucket bucket;
    int64_t numel = 0;
    for (size_t slot = 0; slot < members.size(); ++slot) {
      bucket_of_[members[slot]] = buckets_.size();
      slot_of_[members[slot]] = slot;
      bucket.offsets.push_back(numel);
      numel += params_[members[slot]].numel();
    }
    const at::Tensor& first = params_[members.front()];
    bucket.flat = at::zeros({numel}, first.options().requires_grad(false));
    bucket.params = std::move(members);
    bucket.view.index = buckets_.size();
    bucket.view.buffer = bucket.flat;
    bucket.view.offsets = bucket.offsets;
    for (size_t i : bucket.params) bucket.view.parameters.push_back(params_[i]);
    bucket.view.parameter_indices.assign(bucket.params.begin(), bucket.params.end());
    buckets_.push_back(std::move(bucket));
  }
  buckets_.back().view.is_last = true;
  if (options_.gradient_as_bucket_view) {
    // Gradients become views of the buckets, saving a copy each way.
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor view = grad_view(i);
      at::Tensor& grad = params_[i].mutable_grad();
      if (grad.defined()) view.copy_(grad);
      grad = view;
    }
  }
}

at::Tensor Reducer::grad_view(size_t index) const {
  // An alias made with set_, not a view: libtorch's Optimizer::zero_grad() calls detach_()
  // on every gradient, which autograd refuses for views.
  const at::Tensor s = slice(index);
  const at::Tensor& param = params_[index];
  const at::IntArrayRef strides = param.is_non_overlapping_and_dense() ? param.strides() : at::IntArrayRef();
  return at::empty({0}, s.options()).set_(s.storage(), s.storage_offset(), param.sizes(), strides);  // {}: contiguous
}

at::Tensor Reducer::slice(size_t index) const {
  const Bucket& bucket = buckets_[bucket_of_[index]];
  return bucket.flat.narrow(0, bucket.offsets[slot_of_[index]], params_[index].numel());
}

void Reducer::prepare_forward(bool sync, int64_t samples) {
  if (stream_capturing(params_.front().device())) {  // Note [A collective in a CUDA graph]
    DATAPAR_CHECK(!rebuild_pending_, "DistributedDataParallel: the buckets are rebuilt at the second synchronised ",
                  "forward (a host read), which a CUDA graph cannot capture.\n---> HINT: run at least 2 steps before ",
                  "the capture (CudaGraphStepOptions::warmup_steps).");
    DATAPAR_CHECK(!options_.find_unused_parameters && !options_.average_by_samples,
                  "DistributedDataParallel: ", options_.find_unused_parameters ? "find_unused_parameters" : "average_by_samples",
                  " reads what the ranks exchange on the host every step, which a CUDA graph cannot capture.\n---> "
                  "HINT: turn it off under a CUDA graph (with every rank's batch of one size, averaging by world size is "
                  "the same), or train without the graph.");
  }
  if (rebuild_pending_) {
    // Everyone takes rank 0's arrival order, so all ranks keep identical buckets (Note
    // [Rebuilding the buckets]).
    const trace::Span span("rebuild buckets", "ddp");
    at::Tensor order = metadata_tensor(*group_, std::vector<int64_t>(arrival_.begin(), arrival_.end()));
    group_->broadcast(order, 0)->synchronize();  // read on the host
    std::vector<size_t> rebuilt;
    for (int64_t i : host_int64s(order)) rebuilt.push_back(static_cast<size_t>(i));
    build_buckets(rebuilt);
    rebuild_pending_ = false;
  }
  reset_pass();
  sync_ = sync;
  samples_ += static_cast<double>(samples);
}

void Reducer::reset_pass() {
  expect_hooks_ = false;
  callback_queued_ = false;
  ready_.assign(params_.size(), false);
  used_.assign(params_.size(), true);
  next_bucket_ = 0;
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.work.reset();
  }
  meta_work_.reset();
  share_.reset();
}

void Reducer::prepare_backward(const std::vector<at::Tensor>& outputs) {
  if (!sync_) return;  // no_sync: gradients accumulate locally, the hooks stay quiet
  expect_hooks_ = true;
  if (options_.find_unused_parameters) {
    // Walk the graph from the outputs; accumulators it never reaches get no gradient.
    std::unordered_set<torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> stack;
    for (const at::Tensor& out : outputs) {
      if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn().get());
    }
    while (!stack.empty()) {
      torch::autograd::Node* node = stack.back();
      stack.pop_back();
      if (!seen.insert(node).second) continue;
      for (const torch::autograd::Edge& edge : node->next_edges()) {
        if (edge.function) stack.push_back(edge.function.get());
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) used_[i] = seen.count(accumulators_[i].get()) > 0;
  }
  if (options_.average_by_samples || options_.find_unused_parameters) issue_meta(samples_, used_);
  if (options_.find_unused_parameters) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!used_[i]) ready(i, /*has_gradient=*/false);
    }
  }
}

void Reducer::issue_meta(double samples, const std::vector<bool>& used) {
  std::vector<double> values{samples};
  for (bool u : used) values.push_back(u ? 1.0 : 0.0);
  meta_ = metadata_tensor(*group_, values);
  const trace::detail::CollectiveLabel label("ddp metadata", 0, static_cast<int64_t>(meta_.nbytes()));
  meta_work_ = group_->all_reduce(meta_, ReduceOp::kSum);
}

void Reducer::mark_ready(size_t index) {
  if (!expect_hooks_) return;
  if (!callback_queued_) {
    detail::at_end_of_backward([this] { finalize(); });  // the outermost backward's end
    callback_queued_ = true;
  }
  DATAPAR_CHECK(!ready_[index], "DistributedDataParallel: parameter ", names_[index],
                " got a gradient twice in one backward pass. Run backward once per forward (retain_graph "
                "is not supported), and checkpoint each parameter's use in at most one segment.");
  if (arrival_.size() < params_.size() && synced_passes_ == 0) arrival_.push_back(index);
  ready(index, /*has_gradient=*/true);
}

const at::Tensor& Reducer::sample_share() {
  if (!share_.defined()) {
    meta_work_->wait();
    share_ = meta_.select(0, 0).clamp_min(1).reciprocal().mul_(samples_);
  }
  return share_;
}

void Reducer::ready(size_t index, bool has_gradient) {
  ready_[index] = true;
  at::Tensor out = slice(index);
  const at::Tensor& grad = params_[index].grad();
  if (!has_gradient || !grad.defined()) {
    out.zero_();
  } else {
    // Note [Averaging by samples]; a 0-dim tensor on the group's device scales tensors on
    // any device (gloo's CPU count, a CUDA model).
    const at::Scalar by_world = 1.0 / group_->size();
    const bool by_samples = options_.average_by_samples;
    if (grad.data_ptr() == out.data_ptr()) {  // the gradient is the bucket view already
      by_samples ? out.mul_(sample_share()) : out.mul_(by_world);
    } else {
      // Into the bucket laid out as the parameter (Note [Bucket views follow the parameters'
      // strides]): a memory-order copy when the gradient has the parameter's layout.
      at::Tensor view = grad_view(index);
      by_samples ? at::mul_out(view, grad, sample_share()) : at::mul_out(view, grad, by_world);
      if (options_.gradient_as_bucket_view) params_[index].mutable_grad() = view;
    }
  }
  Bucket& bucket = buckets_[bucket_of_[index]];
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Strictly in index order, so every rank issues the same collectives in the same order.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_++];
    const trace::detail::CollectiveLabel label("bucket", static_cast<int64_t>(bucket.view.index),
                                               static_cast<int64_t>(bucket.flat.nbytes()));
    bucket.work = hook_->run(*group_, bucket.view);
  }
}

void Reducer::wait_bucket(Bucket& bucket) {
  // A bucket that stalls is reported by the group's stall inspector, which covers every
  // collective (Note [Stall inspection] in src/process_group/stall_inspector.cc).
  bucket.work->wait();
}

void Reducer::wait_buckets() {
  for (Bucket& bucket : buckets_) {
    wait_bucket(bucket);
    hook_->finish(bucket.view);
    bucket.work.reset();
  }
}

CommunicationStats Reducer::communication_stats() const {
  CommunicationStats stats = stats_;
  stats.exposed_wait = exposed_wait_->total();
  return stats;
}

void Reducer::finalize() {
  expect_hooks_ = false;
  if (next_bucket_ < buckets_.size()) {
    std::string missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) missing += (missing.empty() ? "" : ", ") + names_[i];
    }
    throw Error(str_cat("DistributedDataParallel: parameter(s) ", missing,
                        " got no gradient in this backward pass, so their bucket could not be reduced and the "
                        "ranks are out of step. If some parameters are not used in every forward, construct DDP "
                        "with DdpOptions::find_unused_parameters = true."));
  }
  // From here on backward only waits: the communication it could not hide.
  exposed_wait_->start();
  std::optional<trace::Span> waiting;
  waiting.emplace("wait for buckets", "ddp");
  std::vector<bool> used_anywhere(params_.size(), true);
  if (options_.find_unused_parameters) {  // the one host read (Note [No host sync in a step])
    meta_work_->synchronize();
    const std::vector<double> data = host_doubles(meta_);
    for (size_t i = 0; i < params_.size(); ++i) used_anywhere[i] = data[i + 1] > 0;
  } else if (meta_work_) {
    meta_work_->wait();  // its failure surfaces here; on nccl a wait on the stream
  }
  wait_buckets();
  exposed_wait_->stop();
  waiting.reset();
  ++stats_.synchronised_passes;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!used_anywhere[i]) continue;  // unused on every rank: .grad stays as it was, as in PyTorch
    const at::Tensor reduced = grad_view(i);
    at::Tensor& grad = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!grad.defined() || grad.data_ptr() != reduced.data_ptr()) grad = reduced;
    } else if (grad.defined()) {
      grad.copy_(reduced);
    } else {
      grad = reduced.clone();  // keeps the parameter's layout (at::MemoryFormat::Preserve)
    }
  }
  samples_ = 0;
  if (synced_passes_++ == 0) {
    // Complete the order with the parameters that never reported (unused), in bucket order.
    std::vector<bool> listed(params_.size(), false);
    for (size_t i : arrival_) listed[i] = true;
    for (size_t i : reverse_order(params_.size())) {
      if (!listed[i]) arrival_.push_back(i);
    }
    rebuild_pending_ = true;
  }
}

void Reducer::shadow_backward() {
  // The collectives of one synchronised backward, in the same order, contributing nothing.
  reset_pass();
  if (options_.average_by_samples || options_.find_unused_parameters) {
    issue_meta(0.0, std::vector<bool>(params_.size(), false));
  }
  for (Bucket& bucket : buckets_) {
    bucket.flat.zero_();
    bucket.pending = 0;
  }
  launch_ready_buckets();
  if (meta_work_) meta_work_->wait();
  wait_buckets();
  if (synced_passes_++ == 0) {
    arrival_ = reverse_order(params_.size());
    rebuild_pending_ = true;
  }
}

}  // namespace datapar::detail
