// DataParallel: PyTorch's nn.DataParallel for libtorch modules, on CUDA devices or CPU cores.
//
// Each forward splits the inputs along `dim` over the devices (scatter), runs one replica
// per chunk side by side (parallel_apply), and concatenates the outputs on the output
// device (gather). Backward runs the replicas' backward side by side too and leaves the
// summed gradients in the wrapped module's .grad, so an optimizer over module parameters
// (or over dp.parameters(), the same tensors) trains it as if it ran on one device.
//
//   auto model = std::make_shared<Net>();
//   datapar::DataParallel dp(model, datapar::parse_devices("cpu:0,cpu:1"));
//   torch::optim::SGD sgd(dp.parameters(), 0.1);
//   auto loss = torch::nll_loss(dp.forward(x), y);  // x: [B, ...] split B ways
//   loss.backward();
//   sgd.step();
//
// Semantics to know:
// - With one device the module is called directly, as in PyTorch.
// - BatchNorm: batch statistics are computed per replica, over that replica's chunk;
//   running statistics are updated from the first replica's chunk only (the others update
//   copies that are discarded). Use SyncBatchNorm under DDP for statistics over the batch.
// - Names: parameters(), named_parameters() and state_dict() are the wrapped module's,
//   without a "module." prefix, so a state dict moves between the wrapper and the bare
//   module in both directions.
// - Replicas are built once, at construction; the module's structure must not change later.
//   The module must be clonable (see replicate.h) and live on device_ids[0].
// - Balancing (auto_balance): each training step's forward and backward are timed per device
//   (the output device's gather too), and the split follows the devices' measured speed
//   (load_balancer.h). Any split gives the same gradient; only who computes which rows changes.
//   A device whose fixed cost per step (its replica's refresh, every layer's overhead) is
//   longer than the step without it gets no rows and runs nothing, through a second set of
//   replicas for the devices taking part; the first device, the module's own, always takes
//   part. last_chunk_sizes() then has a 0 for each device left out.
// - Not thread-safe: one forward/backward at a time per DataParallel.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "datapar/devices.h"
#include "datapar/error.h"
#include "datapar/parallel/chunk_sizes.h"
#include "datapar/parallel/load_balancer.h"
#include "datapar/parallel/parallel_apply.h"
#include "datapar/parallel/replicate.h"
#include "datapar/parallel/scatter_gather.h"
#include "datapar/state_dict.h"

namespace datapar {

struct DataParallelOptions {
  // Devices to run on; empty: every visible CUDA device, or else one CPU device per core.
  std::vector<Device> devices;
  // Where outputs are gathered; default: devices[0].
  std::optional<Device> output_device;
  // The dimension inputs are split along and outputs concatenated along.
  int64_t dim = 0;
  // Relative share of each device (one weight per device); empty: torch.chunk's equal
  // split. E.g. {0.5, 1, 1, 1} gives the first device, which also gathers, half a share.
  std::vector<double> device_weights;
  // Whether replicas on the module's own device share its parameters (the default: no
  // copies) or hold copies, as replicas on other GPUs must (replicate.h).
  ReplicaStorage replicas = ReplicaStorage::kShared;
  // Split by measurement (`datapar train --balance auto`): time each device's forward and
  // backward over the training steps (and the output device's gather, which is its extra
  // work) and give the devices the shares under which all finish together; keep measuring
  // and re-split when speeds drift, with hysteresis.
  // device_weights, if given, is where it starts. Steps without a backward are not measured.
  // A device not worth its fixed cost per step is left out (load_balancer.h).
  bool auto_balance = false;
  LoadBalancerOptions balance;
};

namespace detail {
// Every visible CUDA device, or one CPU device per core when there is no CUDA device.
std::vector<Device> default_data_parallel_devices();
void check_data_parallel_options(const DataParallelOptions& options);
// options.balance, with the first device (the module's, which always runs) taking part.
LoadBalancerOptions data_parallel_balance(const DataParallelOptions& options);
// Feeds the last step to the balancer if its backward ran (every replica's times are in),
// and marks it recorded. `rows`: last_chunk_sizes(), whose k-th non-zero entry is the rows
// chunk k ran. The output device's gather counts as its work.
void record_balanced_step(LoadBalancer& balancer, ReplicaTimes& times, const std::vector<int64_t>& rows,
                          double gather_seconds, const std::vector<Device>& devices, const Device& output_device);
// The devices that take part in a step under the balancer's shares: those with a share,
// and the first (the module's own) always.
std::vector<size_t> devices_taking_part(const std::vector<double>& weights);
// Seconds from `start` until the device has run what this thread queued on it.
double seconds_until_done(std::chrono::steady_clock::time_point start, const Device& device);
}  // namespace detail

template <typename ModuleImpl>
class DataParallel {
 public:
  DataParallel(std::shared_ptr<ModuleImpl> module, DataParallelOptions options)
      : module_(std::move(module)), options_(std::move(options)) {
    DATAPAR_CHECK(module_ != nullptr, "DataParallel: the module is null.");
    if (options_.devices.empty()) options_.devices = detail::default_data_parallel_devices();
    if (!options_.output_device) options_.output_device = options_.devices.front();
    detail::check_data_parallel_options(options_);
    if (options_.devices.size() > 1) {
      all_.replicas = std::make_shared<detail::ReplicaSet>(module_, options_.devices, options_.replicas);
      all_.typed = typed(*all_.replicas);
      for (size_t i = 0; i < options_.devices.size(); ++i) all_.devices.push_back(i);
      if (options_.auto_balance) {
        balancer_ = std::make_unique<LoadBalancer>(options_.devices.size(), detail::data_parallel_balance(options_),
                                                   options_.device_weights);
        times_ = std::make_shared<detail::ReplicaTimes>();
      }
    }
  }

  DataParallel(std::shared_ptr<ModuleImpl> module, std::vector<Device> device_ids = {},
               std::optional<Device> output_device = std::nullopt, int64_t dim = 0)
      : DataParallel(std::move(module), DataParallelOptions{std::move(device_ids), output_device, dim, {}, {}, false, {}}) {}

  DataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module, DataParallelOptions options)
      : DataParallel(module.ptr(), std::move(options)) {}

  DataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module, std::vector<Device> device_ids = {},
               std::optional<Device> output_device = std::nullopt, int64_t dim = 0)
      : DataParallel(module.ptr(), std::move(device_ids), output_device, dim) {}

  // Runs the module data-parallel on (args...). Tensor arguments are split along dim;
  // other arguments (numbers, strings, nested lists/tuples/dicts of tensors) are split or
  // copied as scatter() does. Returns what the module's forward returns, gathered.
  // Throws datapar::Error naming the device if a replica fails.
  template <typename... Args>
  auto forward(Args&&... args) {
    using Output = std::decay_t<decltype(module_->forward(std::forward<Args>(args)...))>;
    if (!all_.replicas) {
      last_chunk_sizes_ = {batch_size(pack(args...), options_.dim)};
      return module_->forward(on_device(std::forward<Args>(args))...);
    }
    if (balancer_) {
      detail::record_balanced_step(*balancer_, *times_, last_chunk_sizes_, gather_seconds_, options_.devices,
                                   *options_.output_device);
    }
    const c10::IValue packed = pack(args...);
    const Part& part = part_for_this_step();
    std::vector<int64_t> sizes = split_sizes(packed, part);
    const std::vector<c10::IValue> chunks = scatter(packed, part.replicas->devices(), options_.dim, sizes);
    if (part.devices.size() < options_.devices.size()) {  // in device order, 0 for those left out
      last_chunk_sizes_.assign(options_.devices.size(), 0);
      for (size_t k = 0; k < sizes.size(); ++k) last_chunk_sizes_[part.devices[k]] = sizes[k];
    } else {
      last_chunk_sizes_ = std::move(sizes);
    }
    std::vector<c10::IValue> outputs = detail::parallel_apply(
        *part.replicas,
        [&part](size_t i, const c10::IValue& input) {
          return call_replica<std::decay_t<Args>...>(*part.typed[i], input, std::index_sequence_for<Args...>{});
        },
        chunks, times_);
    const auto gather_start = std::chrono::steady_clock::now();
    c10::IValue gathered = gather(outputs, *options_.output_device, options_.dim);
    if (balancer_) gather_seconds_ = detail::seconds_until_done(gather_start, *options_.output_device);
    return std::move(gathered).template to<Output>();
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The replicas, one per device (empty with one device, where the module runs itself). While
  // the balancer leaves devices out, steps run on replicas made for the others instead.
  const std::vector<std::shared_ptr<ModuleImpl>>& replicas() const { return all_.typed; }

  // Rows each device got in the last forward, in device order (fewer entries than devices
  // when the batch had fewer rows than there are devices; 0 for a device the balancer left
  // out).
  const std::vector<int64_t>& last_chunk_sizes() const { return last_chunk_sizes_; }

  const std::shared_ptr<ModuleImpl>& module() const { return module_; }
  const std::vector<Device>& devices() const { return options_.devices; }
  const Device& output_device() const { return *options_.output_device; }
  const DataParallelOptions& options() const { return options_; }

  // The wrapped module's tensors and names (no "module." prefix).
  std::vector<at::Tensor> parameters(bool recurse = true) const { return module_->parameters(recurse); }
  torch::OrderedDict<std::string, at::Tensor> named_parameters(bool recurse = true) const {
    return module_->named_parameters(recurse);
  }
  std::vector<at::Tensor> buffers(bool recurse = true) const { return module_->buffers(recurse); }
  torch::OrderedDict<std::string, at::Tensor> named_buffers(bool recurse = true) const {
    return module_->named_buffers(recurse);
  }
  StateDict state_dict() const { return datapar::state_dict(*module_); }
  void load_state_dict(const StateDict& state, bool strict = true) {
    datapar::load_state_dict(*module_, state, strict);
  }

  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  bool is_training() const { return module_->is_training(); }
  void zero_grad(bool set_to_none = true) { module_->zero_grad(set_to_none); }

  // The balancer that sets the split (auto_balance), or null: its weights() are the shares
  // the next forward uses, seconds_per_row() what it measured, rebalances() how often it
  // changed them.
  const LoadBalancer* balancer() const { return balancer_.get(); }

  // Parameter tensors copied into replicas so far (0 with shared replicas on CPU devices).
  int64_t parameter_copies() const {
    return (all_.replicas ? all_.replicas->parameter_copies() : 0) +
           (part_.replicas ? part_.replicas->parameter_copies() : 0) + retired_copies_;
  }

 private:
  template <typename... Args>
  static c10::IValue pack(const Args&... args) {
    return c10::ivalue::Tuple::create(std::vector<c10::IValue>{c10::IValue(args)...});
  }

  template <typename T>
  decltype(auto) on_device(T&& value) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      const c10::Device device = options_.devices.front().torch_device();
      return value.device() == device ? value : value.to(device);
    } else {
      return std::forward<T>(value);
    }
  }

  // The devices a step runs on and their replicas: every device, or those the balancer left
  // in (replicas made for them when that set changes: on a GPU other than the module's, a
  // second copy of the model beside the one in all_, which replicas() returns).
  struct Part {
    std::vector<size_t> devices;  // indices into options_.devices
    std::shared_ptr<detail::ReplicaSet> replicas;
    std::vector<std::shared_ptr<ModuleImpl>> typed;  // replicas, as ModuleImpl
  };

  const Part& part_for_this_step() {
    if (!balancer_) return all_;
    std::vector<size_t> devices = detail::devices_taking_part(balancer_->weights());
    if (devices.size() == options_.devices.size()) return all_;  // part_ kept for the next time
    if (part_.devices != devices) {
      if (part_.replicas) retired_copies_ += part_.replicas->parameter_copies();
      std::vector<Device> on;
      for (size_t i : devices) on.push_back(options_.devices[i]);
      part_ = Part{std::move(devices), std::make_shared<detail::ReplicaSet>(module_, on, options_.replicas), {}};
      part_.typed = typed(*part_.replicas);
    }
    return part_;
  }

  static std::vector<std::shared_ptr<ModuleImpl>> typed(const detail::ReplicaSet& set) {
    std::vector<std::shared_ptr<ModuleImpl>> replicas;
    for (size_t i = 0; i < set.size(); ++i) {
      replicas.push_back(std::dynamic_pointer_cast<ModuleImpl>(set.replica(i)));
      DATAPAR_INTERNAL_ASSERT(replicas.back() != nullptr, "replica ", i, " has the wrong type");
    }
    return replicas;
  }

  // Chunk sizes for the devices of `part`, in order.
  std::vector<int64_t> split_sizes(const c10::IValue& packed, const Part& part) const {
    const int64_t rows = batch_size(packed, options_.dim);
    DATAPAR_CHECK(rows >= 0, "DataParallel: the inputs hold no tensor to split along dim ", options_.dim, ".");
    if (balancer_) {
      std::vector<double> weights;
      for (size_t i : part.devices) weights.push_back(balancer_->weights()[i]);
      return weighted_chunk_sizes(rows, weights);
    }
    if (options_.device_weights.empty()) {
      return chunk_sizes(rows, static_cast<int64_t>(options_.devices.size()));
    }
    return weighted_chunk_sizes(rows, options_.device_weights);
  }


  template <typename... Decayed, size_t... I>
  static c10::IValue call_replica(ModuleImpl& replica, const c10::IValue& input, std::index_sequence<I...>) {
    const auto& elements = input.toTupleRef().elements();
    return c10::IValue(replica.forward(elements[I].template to<Decayed>()...));
  }

  std::shared_ptr<ModuleImpl> module_;
  DataParallelOptions options_;
  Part all_;                                        // every device (no replicas with one device)
  Part part_;                                       // the devices the balancer left in, when not all
  int64_t retired_copies_ = 0;                      // parameter_copies() of the part_ sets replaced
  std::vector<int64_t> last_chunk_sizes_;
  std::unique_ptr<LoadBalancer> balancer_;          // auto_balance only
  std::shared_ptr<detail::ReplicaTimes> times_;     // the step being timed (auto_balance)
  double gather_seconds_ = 0;                       // the last forward's gather
};

template <typename ModuleImpl>
DataParallel(std::shared_ptr<ModuleImpl>, DataParallelOptions) -> DataParallel<ModuleImpl>;
template <typename ModuleImpl>
DataParallel(std::shared_ptr<ModuleImpl>, std::vector<Device>) -> DataParallel<ModuleImpl>;
template <typename ModuleImpl>
DataParallel(std::shared_ptr<ModuleImpl>) -> DataParallel<ModuleImpl>;
template <typename ModuleImpl>
DataParallel(const torch::nn::ModuleHolder<ModuleImpl>&, DataParallelOptions) -> DataParallel<ModuleImpl>;
template <typename ModuleImpl>
DataParallel(const torch::nn::ModuleHolder<ModuleImpl>&, std::vector<Device>) -> DataParallel<ModuleImpl>;
template <typename ModuleImpl>
DataParallel(const torch::nn::ModuleHolder<ModuleImpl>&) -> DataParallel<ModuleImpl>;

}  // namespace datapar
