// See fully_sharded_data_parallel.h.
//
// Note [Parameters over a flat buffer]
// The module's layers hold their parameters as tensors of their own (LinearImpl::weight),
// so FSDP cannot swap them for others. At construction each trainable parameter becomes,
// through set_data(), a view of one flat buffer, full_; after that only full_'s storage
// changes: emptied (its bytes freed, the parameters' shapes untouched) when resharding,
// given new bytes and filled by an all-gather before the parameters are used. The
// all-gather writes through an alias without autograd (from_blob), so no version counter
// moves: the tensors autograd saved in forward (a Linear's weight) are valid again once
// the storage is refilled before their backward. Each parameter stays a leaf, so its
// gradient accumulates in its own .grad as without FSDP; at the end of backward they are
// flattened, reduce-scattered (averaged) into the shard's .grad and released.
#include "datapar/fsdp/fully_sharded_data_parallel.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <utility>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "autograd/end_of_backward.h"
#include "parallel/ivalue_tensors.h"

namespace datapar::detail {
namespace {

c10::StorageImpl& storage_of(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

}  // namespace

FsdpCore::FsdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
                   FsdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  if (!group_) group_ = default_group();
  for (const at::Tensor& p : module_->parameters()) {
    if (p.requires_grad()) params_.push_back(p);
  }
  DATAPAR_CHECK(!params_.empty(), "FullyShardedDataParallel: the module has no trainable parameters to shard.");
  const at::TensorOptions options_of = params_[0].options();
  for (const at::Tensor& p : params_) {
    DATAPAR_CHECK(p.scalar_type() == params_[0].scalar_type() && p.device() == params_[0].device(),
                  "FullyShardedDataParallel: the module's trainable parameters mix ", params_[0].scalar_type(), " on ",
                  params_[0].device(), " with ", p.scalar_type(), " on ", p.device(),
                  "; this version shards modules of one dtype on one device. Convert the module (module->to(...)).");
    DATAPAR_CHECK(at::isFloatingType(p.scalar_type()), "FullyShardedDataParallel: a trainable parameter is ",
                  p.scalar_type(), "; only floating-point parameters are trained.");
    numel_ += p.numel();
  }
  const int64_t n = group_->size();
  padded_ = (numel_ + n - 1) / n * n;
  // Every rank starts from rank 0's parameters.
  full_ = at::zeros({padded_}, options_of);
  {
    const at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (const at::Tensor& p : params_) {
      full_.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
      offset += p.numel();
    }
  }
  group_->broadcast(full_, 0)->wait();
  const int64_t shard = padded_ / n;
  shard_ = full_.narrow(0, group_->rank() * shard, shard).clone().requires_grad_(true);
  {
    const at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (at::Tensor& p : params_) {
      p.set_data(full_.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
  reshard();
}

FsdpCore::~FsdpCore() = default;

bool FsdpCore::gathered() const { return storage_of(full_).nbytes() > 0; }

void FsdpCore::gather() {
  if (gathered()) return;
  c10::StorageImpl& storage = storage_of(full_);
  const size_t bytes = static_cast<size_t>(padded_) * full_.element_size();
  storage.set_data_ptr_noswap(storage.allocator()->allocate(bytes));
  storage.set_nbytes(bytes);
  // Through an alias without autograd: no version counter moves (Note [Parameters over a
  // flat buffer]).
  const at::Tensor whole = at::from_blob(storage.data_ptr().get(), {padded_}, full_.options());
  std::vector<at::Tensor> parts = whole.chunk(group_->size());
  group_->all_gather(parts, shard_.detach())->wait();
}

void FsdpCore::reshard() {
  c10::StorageImpl& storage = storage_of(full_);
  storage.set_data_ptr_noswap(storage.allocator()->allocate(0));
  storage.set_nbytes(0);
}

void FsdpCore::pre_forward() {
  gather();
  gathered_for_backward_ = false;
}

void FsdpCore::post_forward(const c10::IValue& returned) {
  std::vector<at::Tensor> outputs;
  collect_tensors(returned, outputs);
  const bool training = at::GradMode::is_enabled() &&
                        std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) {
                          return t.defined() && t.requires_grad();
                        });
  if (options_.reshard_after_forward || !training) reshard();
  if (!training) return;
  for (at::Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    out.register_hook([this](const at::Tensor& grad) {
      pre_backward();
      return grad;
    });
  }
}

// An output's gradient arrived: the module's backward is next and needs its parameters.
void FsdpCore::pre_backward() {
  if (gathered_for_backward_) return;
  gathered_for_backward_ = true;
  gather();
  at_end_of_backward([this] { post_backward(); });
}

void FsdpCore::post_backward() {
  // The parameters' gradients, flat and padded (zeros for a parameter without one), then
  // averaged over the ranks into this rank's part.
  at::Tensor flat = at::zeros({padded_}, full_.options());
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape({-1}));
    p.mutable_grad() = at::Tensor();
    offset += p.numel();
  }
  at::Tensor shard_grad = at::empty({shard_.numel()}, shard_.options().requires_grad(false));
  group_->reduce_scatter(shard_grad, flat.chunk(group_->size()), ReduceOp::kAvg)->wait();
  if (shard_.grad().defined()) {
    shard_.mutable_grad().add_(shard_grad);  // accumulation, as .grad does
  } else {
    shard_.mutable_grad() = shard_grad;
  }
  reshard();
}

}  // namespace datapar::detail
