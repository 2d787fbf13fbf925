// See fsdp_unit.h.
//
// Note [Parameters over a flat buffer]
// The module's layers hold their parameters as tensors of their own (LinearImpl::weight),
// so FSDP cannot swap them for others. When a unit is made each of its trainable
// parameters becomes, through set_data(), a view of one flat buffer, full_ (in the compute
// dtype: bfloat16 under mixed precision); after that only full_'s storage changes: emptied
// (its bytes freed, the parameters' shapes untouched) when resharding, given new bytes and
// filled by an all-gather before the parameters are used. The all-gather writes through an
// alias without autograd (from_blob), so no version counter moves: the tensors autograd
// saved in forward (a Linear's weight) are valid again once the storage is refilled before
// their backward. Each parameter stays a leaf, so its gradient accumulates in its own .grad
// as without FSDP; when the unit's last gradient has arrived (a hook on each parameter's
// gradient accumulator) they are flattened, reduce-scattered into the shard's gradient and
// released, while backward goes on with the units before it.
#include "fsdp/fsdp_unit.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "fsdp/flat_buffers.h"
#include "fsdp/fsdp_run.h"
#include "parallel/ivalue_tensors.h"

namespace datapar::detail {
namespace {

c10::StorageImpl& storage_of(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

}  // namespace

// Tells the unit that one of its parameters has its gradient for this backward.
class FsdpUnit::ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::weak_ptr<FsdpUnit> unit) : unit_(std::move(unit)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto unit = unit_.lock()) unit->param_ready();
    return outputs;
  }

 private:
  std::weak_ptr<FsdpUnit> unit_;
};

FsdpUnit::FsdpUnit(std::string name, std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                   FsdpOptions options)
    : name_(std::move(name)), params_(std::move(params)), group_(std::move(group)), options_(options) {
  if (!group_) group_ = default_group();
  DATAPAR_CHECK(!params_.empty(), "FullyShardedDataParallel: unit '", name_, "' has no trainable parameters to shard.");
  DATAPAR_CHECK(options_.prefetch >= 0, "FullyShardedDataParallel: FsdpOptions::prefetch is ", options_.prefetch,
                "; it counts units gathered ahead, 0 or more.");
  const at::Tensor& first = params_[0];
  for (const at::Tensor& p : params_) {
    if (const FsdpUnit* other = unit_holding(p)) {
      DATAPAR_CHECK(false, "FullyShardedDataParallel: the parameters of '", name_, "' are held by FSDP unit '",
                    other->name(), "' already. A module is sharded once: fully_shard each module once, inner ",
                    "modules before the ones around them, and wrap the model in one FullyShardedDataParallel.");
    }
    DATAPAR_CHECK(p.scalar_type() == first.scalar_type() && p.device() == first.device(),
                  "FullyShardedDataParallel: the trainable parameters of unit '", name_, "' mix ", first.scalar_type(),
                  " on ", first.device(), " with ", p.scalar_type(), " on ", p.device(),
                  "; a unit shards parameters of one dtype on one device. Convert the module (module->to(...)) before "
                  "sharding it.");
    DATAPAR_CHECK(at::isFloatingType(p.scalar_type()), "FullyShardedDataParallel: a trainable parameter of unit '",
                  name_, "' is ", p.scalar_type(), "; only floating-point parameters are trained.");
    numel_ += p.numel();
  }
  for (const auto& dtype : {options_.param_dtype, options_.reduce_dtype}) {
    DATAPAR_CHECK(!dtype || at::isFloatingType(*dtype), "FullyShardedDataParallel: mixed precision takes floating ",
                  "dtypes (at::kBFloat16, at::kHalf, at::kFloat), not ", *dtype, ".");
  }
  const int64_t n = group_->size();
  if (const auto& smaller = options_.reshard_after_forward_group) {
    DATAPAR_CHECK(options_.reshard_after_forward && smaller != group_ && smaller->size() < n &&
                      n % smaller->size() == 0,
                  "FullyShardedDataParallel: FsdpOptions::reshard_after_forward_group has ", smaller->size(),
                  " ranks and unit '", name_, "' shards over ", n,
                  "; give a smaller group whose size divides the unit's (the ranks of one machine), with "
                  "reshard_after_forward on.");
  }
  padded_ = (numel_ + n - 1) / n * n;
  const at::TensorOptions own = first.options().requires_grad(false);
  // Every rank starts from rank 0's values.
  at::Tensor values = at::zeros({padded_}, own);
  {
    const at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (const at::Tensor& p : params_) {
      values.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
      offset += p.numel();
    }
  }
  group_->broadcast(values, 0)->wait();
  const int64_t shard = padded_ / n;
  at::Tensor mine = values.narrow(0, group_->rank() * shard, shard).clone();
  // HSDP: the first shard group's (its rank 0 is the job's).
  if (options_.replicate_group) options_.replicate_group->broadcast(mine, 0)->wait();
  shard_ = mine.requires_grad_(true);
  full_ = at::empty({padded_}, own.dtype(options_.param_dtype.value_or(first.scalar_type())));
  {
    const at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (at::Tensor& p : params_) {
      p.mutable_grad() = at::Tensor();
      p.set_data(full_.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
  add_flat_buffer(&storage_of(full_), this);
  reshard();
}

FsdpUnit::~FsdpUnit() {
  remove_flat_buffer(&storage_of(full_));
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Collectives still in flight write into our buffers: let them end first.
  for (const auto& work : {gather_work_, reduce_work_, replicate_work_}) {
    if (!work) continue;
    try {
      work->wait();
    } catch (const std::exception&) {
    }
  }
}

void FsdpUnit::install_hooks() {
  for (const at::Tensor& p : params_) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(p));
    DATAPAR_INTERNAL_ASSERT(accumulators_.back() != nullptr, "no gradient accumulator in unit ", name_);
    hook_keys_.push_back(accumulators_.back()->add_post_hook(std::make_unique<ReadyHook>(weak_from_this())));
  }
}

void FsdpUnit::cast_buffers(const std::vector<at::Tensor>& buffers) {
  if (!options_.buffer_dtype) return;
  DATAPAR_CHECK(at::isFloatingType(*options_.buffer_dtype), "FullyShardedDataParallel: FsdpOptions::buffer_dtype is ",
                *options_.buffer_dtype, "; buffers are kept in a floating dtype.");
  const at::NoGradGuard no_grad;
  for (const at::Tensor& buffer : buffers) {
    if (!buffer.defined() || !at::isFloatingType(buffer.scalar_type())) continue;  // a count stays a count
    buffer_dtypes_.emplace(buffer.unsafeGetTensorImpl(), buffer.scalar_type());
    at::Tensor(buffer).set_data(buffer.to(*options_.buffer_dtype));
  }
}

std::optional<at::ScalarType> FsdpUnit::original_dtype(const at::Tensor& buffer) const {
  const auto it = buffer_dtypes_.find(buffer.unsafeGetTensorImpl());
  if (it == buffer_dtypes_.end()) return std::nullopt;
  return it->second;
}

bool FsdpUnit::gathered() const { return storage_of(full_).nbytes() > 0; }

void FsdpUnit::start_gather() {
  if (gather_work_ || gathered()) return;
  c10::StorageImpl& storage = storage_of(full_);
  const size_t bytes = static_cast<size_t>(padded_) * full_.element_size();
  storage.set_data_ptr_noswap(storage.allocator()->allocate(bytes));
  storage.set_nbytes(bytes);
  // Through an alias without autograd: no version counter moves (Note [Parameters over a
  // flat buffer]).
  const at::Tensor whole = at::from_blob(storage.data_ptr().get(), {padded_}, full_.options());
  if (post_forward_part_.defined()) {  // for backward, within the smaller group
    const std::shared_ptr<ProcessGroup>& smaller = options_.reshard_after_forward_group;
    gather_parts_ = whole.chunk(smaller->size());
    gather_source_ = std::move(post_forward_part_);
    post_forward_part_ = at::Tensor();
    gather_work_ = smaller->all_gather(gather_parts_, gather_source_);
    return;
  }
  gather_parts_ = whole.chunk(group_->size());
  gather_source_ = shard_.detach().to(full_.scalar_type());
  gather_work_ = group_->all_gather(gather_parts_, gather_source_);
}

void FsdpUnit::wait_gathered() {
  start_gather();
  if (!gather_work_) return;
  gather_work_->wait();
  gather_work_.reset();
  gather_parts_.clear();
  gather_source_ = at::Tensor();
}

void FsdpUnit::reshard() {
  if (gather_work_) wait_gathered();  // never free what a collective still writes
  c10::StorageImpl& storage = storage_of(full_);
  storage.set_data_ptr_noswap(storage.allocator()->allocate(0));
  storage.set_nbytes(0);
}

void FsdpUnit::pre_forward() {
  DATAPAR_CHECK(run_ != nullptr, "FullyShardedDataParallel: unit '", name_,
                "' ran without a root. Wrap the whole model after making its units "
                "(datapar::FullyShardedDataParallel fsdp(model, group)) and call fsdp.forward().");
  run_->entered_forward(*this);
  wait_gathered();
}

void FsdpUnit::post_forward(const c10::IValue& returned) {
  std::vector<at::Tensor> outputs;
  collect_tensors(returned, outputs);
  const bool training =
      at::GradMode::is_enabled() &&
      std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  // A recomputation inside backward (activation checkpointing) is followed at once by the
  // backward of what it computed: keep the parameters.
  const bool recomputing = run_->in_backward();
  if (!training) {
    if (!recomputing) reshard();
    return;
  }
  used_in_forward_ = true;
  if (options_.reshard_after_forward && !recomputing) {
    if (const auto& smaller = options_.reshard_after_forward_group) {
      const int64_t part = padded_ / smaller->size();
      post_forward_part_ = full_.detach().narrow(0, smaller->rank() * part, part).clone();
    }
    reshard();
  }
  const std::weak_ptr<FsdpUnit> self = weak_from_this();
  for (at::Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    out.register_hook([self](const at::Tensor& grad) {
      if (auto unit = self.lock()) unit->pre_backward();
      return grad;
    });
  }
}

// A gradient of one of the unit's outputs arrived: its backward is next and needs the
// parameters.
void FsdpUnit::pre_backward() {
  if (in_backward_ || run_ == nullptr) return;
  in_backward_ = true;
  run_->entered_backward(*this);
  wait_gathered();
}

void FsdpUnit::param_ready() {
  if (run_ == nullptr) return;
  run_->backward_touched();
  if (++ready_ != params_.size()) return;
  // The unit's backward is over: its gradients go, overlapping the backward still to run.
  reduce_gradients();
  reshard();
}

void FsdpUnit::reduce_gradients() {
  if (reduced_) return;
  reduced_ = true;
  if (!run_->sync()) return;  // no_sync: the gradients accumulate in the parameters' .grad
  const at::ScalarType dtype = options_.reduce_dtype.value_or(full_.scalar_type());
  reduce_input_ = at::zeros({padded_}, full_.options().dtype(dtype));
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) reduce_input_.narrow(0, offset, p.numel()).copy_(p.grad().reshape({-1}));
    p.mutable_grad() = at::Tensor();
    offset += p.numel();
  }
  reduce_op_ = ReduceOp::kAvg;  // over the shard group, then over the replicas: over the job
  if (const std::optional<double> share = run_->sample_share()) {
    reduce_input_.mul_(*share);  // Note [Averaging by samples] in reducer.cc; the share is the job's
    reduce_op_ = ReduceOp::kSum;
  }
  reduce_output_ = at::empty({shard_.numel()}, reduce_input_.options());
  reduce_work_ = group_->reduce_scatter(reduce_output_, reduce_input_.chunk(group_->size()), reduce_op_);
  run_->reduce_issued(*this);
}

void FsdpUnit::reduce_across_replicas() {
  if (!reduce_work_ || !options_.replicate_group) return;
  reduce_work_->wait();
  reduce_work_.reset();
  reduce_input_ = at::Tensor();  // the flat gradient: only the shard's part goes on
  replicate_work_ = options_.replicate_group->all_reduce(reduce_output_, reduce_op_);
}

void FsdpUnit::finish_reduce() {
  reduce_across_replicas();
  std::shared_ptr<Work>& last = replicate_work_ ? replicate_work_ : reduce_work_;
  if (!last) return;
  last->wait();
  last.reset();
  at::Tensor grad = reduce_output_.to(shard_.scalar_type());
  if (shard_.grad().defined()) {
    shard_.mutable_grad().add_(grad);  // accumulation, as .grad does
  } else {
    shard_.mutable_grad() = std::move(grad);
  }
  reduce_input_ = reduce_output_ = at::Tensor();
}

void FsdpUnit::finish_backward() {
  finish_reduce();
  reshard();
  post_forward_part_ = at::Tensor();  // a unit whose backward did not run
  used_in_forward_ = in_backward_ = reduced_ = false;
  ready_ = 0;
}

void FsdpUnit::abandon_iteration() {
  for (std::shared_ptr<Work>* work : {&reduce_work_, &replicate_work_}) {
    if (!*work) continue;  // left by a backward that failed: its error was reported there
    try {
      (*work)->wait();
    } catch (const std::exception&) {
    }
    work->reset();
  }
  reduce_input_ = reduce_output_ = at::Tensor();
  reshard();
  post_forward_part_ = at::Tensor();
  used_in_forward_ = in_backward_ = reduced_ = false;
  ready_ = 0;
}

at::Tensor FsdpUnit::full_values() const {
  const at::Tensor whole = at::empty({padded_}, shard_.options().requires_grad(false));
  std::vector<at::Tensor> parts = whole.chunk(group_->size());
  group_->all_gather(parts, shard_.detach())->wait();
  return whole.narrow(0, 0, numel_);
}

void FsdpUnit::load_full_values(const at::Tensor& values) {
  DATAPAR_CHECK(values.numel() == numel_, "FullyShardedDataParallel: unit '", name_, "' has ", numel_,
                " parameter values; ", values.numel(), " were given.");
  const at::NoGradGuard no_grad;
  const int64_t begin = group_->rank() * shard_.numel();
  const int64_t real = std::max<int64_t>(0, std::min<int64_t>(shard_.numel(), numel_ - begin));
  at::Tensor shard = shard_.detach();
  shard.zero_();
  if (real > 0) shard.narrow(0, 0, real).copy_(values.reshape({-1}).narrow(0, begin, real));
}

}  // namespace datapar::detail
