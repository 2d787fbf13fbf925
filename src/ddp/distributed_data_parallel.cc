// See distributed_data_parallel.h.
//
// Note [Join]
// Collectives are matched by order, so a rank that runs out of inputs before the others
// cannot simply stop: their next all-reduce would wait for it forever. Inside join(), every
// forward first all-reduces three flags (still training, a forward with gradients, a
// synchronised backward to follow). A rank whose training function returned keeps answering that roll call with zeros
// and shadows what the others do: it broadcasts buffers as they do, prepares the same
// forward, and runs the collectives of one synchronised backward with zero gradients and no
// samples (Reducer::shadow_backward), so the buckets line up. When every rank's flag is 0 the
// loop ends. The ranks' models then differ only if some trained longer (buffers, and
// parameters under optimizers that step without gradients): the one that trained longest
// (the highest such rank on a tie) broadcasts its parameters and buffers to all. With
// average_by_samples the shadow passes contribute no samples, so the gradient stays that of
// the samples actually seen (Note [Averaging by samples] in reducer.cc).
#include "datapar/ddp/distributed_data_parallel.h"

#include <ATen/ATen.h>

#include <atomic>

#include "datapar/distributed.h"
#include "datapar/process_group/metadata.h"
#include "ddp/model_check.h"
#include "ddp/reducer.h"
#include "parallel/ivalue_tensors.h"

namespace datapar::detail {

class DdpCore::Impl {
 public:
  std::vector<at::Tensor> params;   // every parameter (detached views), then
  std::vector<at::Tensor> buffers;  // every buffer (detached views)
  std::unique_ptr<Reducer> reducer;
  bool joining = false;

  std::vector<at::Tensor> params_and_buffers() const {
    std::vector<at::Tensor> all = params;
    all.insert(all.end(), buffers.begin(), buffers.end());
    return all;
  }
  int64_t iterations = 0;  // synchronised forwards inside join()
};

DdpCore::DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options), impl_(std::make_unique<Impl>()) {
  DATAPAR_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null.");
  if (!group_) group_ = default_group();
  DATAPAR_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
                "DistributedDataParallel: bucket_cap_mb and first_bucket_cap_mb must be positive.");

  std::vector<std::pair<std::string, at::Tensor>> described;
  std::vector<at::Tensor> trained;
  std::vector<std::string> trained_names;
  for (const auto& item : module_->named_parameters()) {
    described.emplace_back(item.key(), item.value());
    impl_->params.push_back(item.value().detach());
    if (item.value().requires_grad()) {
      trained.push_back(item.value());
      trained_names.push_back(item.key());
    }
  }
  for (const auto& item : module_->named_buffers()) {
    described.emplace_back("buffer " + item.key(), item.value());
    impl_->buffers.push_back(item.value().detach());
  }
  check_same_model(*group_, described);

  // Everyone starts from rank 0's values.
  if (group_->size() > 1) group_->broadcast_coalesced(impl_->params_and_buffers(), 0)->wait();

  ReducerOptions reducer_options;
  reducer_options.first_bucket_bytes = static_cast<int64_t>(options_.first_bucket_cap_mb * 1024 * 1024);
  reducer_options.bucket_bytes = static_cast<int64_t>(options_.bucket_cap_mb * 1024 * 1024);
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer_options.average_by_samples = options_.average_by_samples;
  impl_->reducer = std::make_unique<Reducer>(trained, trained_names, group_, reducer_options);
}

DdpCore::~DdpCore() = default;

void DdpCore::pre_forward(int64_t samples) {
  const bool grad = at::GradMode::is_enabled();
  if (impl_->joining) {
    // Tell the ranks that have joined what this iteration does, so they can shadow it.
    at::Tensor flags = metadata_tensor(*group_, std::vector<int64_t>{1, grad, grad && sync_});
    group_->all_reduce(flags)->wait();
    if (grad && sync_) ++impl_->iterations;
  }
  // As PyTorch: buffers follow rank 0 in training forwards only, so that a forward without
  // grad (evaluation) may run on one rank alone.
  if (grad) broadcast_buffers();
  if (grad) impl_->reducer->prepare_forward(sync_, samples_override_ >= 0 ? samples_override_ : samples);
  samples_override_ = -1;
}

void DdpCore::broadcast_buffers() {
  if (options_.broadcast_buffers && group_->size() > 1 && !impl_->buffers.empty()) {
    group_->broadcast_coalesced(impl_->buffers, 0)->wait();
  }
}

void DdpCore::post_forward(const c10::IValue& outputs) {
  std::vector<at::Tensor> tensors;
  if (options_.find_unused_parameters) collect_tensors(outputs, tensors);
  impl_->reducer->prepare_backward(tensors);
}

void DdpCore::set_comm_hook(std::shared_ptr<CommHook> hook) { impl_->reducer->set_comm_hook(std::move(hook)); }

std::vector<std::vector<size_t>> DdpCore::bucket_indices() const { return impl_->reducer->bucket_indices(); }

CommunicationStats DdpCore::communication_stats() const { return impl_->reducer->communication_stats(); }

void DdpCore::join(const std::function<void()>& train) {
  DATAPAR_CHECK(!impl_->joining, "DistributedDataParallel::join: already inside join().");
  impl_->joining = true;
  impl_->iterations = 0;
  try {
    train();
  } catch (...) {
    impl_->joining = false;
    throw;
  }
  // Out of inputs: shadow the others' iterations until every rank is here (Note [Join]).
  for (;;) {
    at::Tensor flags = metadata_zeros(*group_, 3, at::kLong);
    group_->all_reduce(flags)->synchronize();  // read on the host
    const std::vector<int64_t> f = host_int64s(flags);
    if (f[0] == 0) break;
    if (f[1] > 0) broadcast_buffers();
    if (f[1] > 0) impl_->reducer->prepare_forward(/*sync=*/true, /*samples=*/0);
    if (f[2] > 0) impl_->reducer->shadow_backward();
  }
  impl_->joining = false;
  // The rank that trained longest (the highest such rank on a tie) holds the model to keep.
  at::Tensor key = metadata_tensor(*group_, std::vector<int64_t>{impl_->iterations * group_->size() + group_->rank()});
  group_->all_reduce(key, ReduceOp::kMax)->synchronize();
  const int source = static_cast<int>(host_int64s(key).front() % group_->size());
  group_->broadcast_coalesced(impl_->params_and_buffers(), source)->wait();
}

}  // namespace datapar::detail
