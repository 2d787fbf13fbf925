// The Gloo backend: CPU tensors over Gloo's TCP transport, with Gloo's own algorithms
// (ring all-reduce, one-to-all broadcast, ...) moving the bytes.
//
// Our Store is adapted to Gloo's rendezvous Store (under a "gloo/" prefix) to connect the
// full mesh. Operations are queued to one thread per group and run in issue order: Gloo
// matches collectives by order, and one group's collectives must never interleave.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "datapar/error.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/prefix_store.h"

namespace datapar {
namespace {

using detail::str_cat;

// Gloo's rendezvous talks to our Store through this.
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<datapar::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<datapar::Store> store_;
};

// A reduce function for Gloo over elements of type T.
template <typename T>
gloo::AllreduceOptions::Func reducer(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);  // the untyped overloads
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<Fn>(&gloo::sum<T>);
    case ReduceOp::kMin: return static_cast<Fn>(&gloo::min<T>);
    case ReduceOp::kMax: return static_cast<Fn>(&gloo::max<T>);
    case ReduceOp::kProduct: return static_cast<Fn>(&gloo::product<T>);
  }
  return static_cast<Fn>(&gloo::sum<T>);
}

class ProcessGroupGloo : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options)
      : ProcessGroup(rank, size), timeout_(options.timeout) {
    DATAPAR_CHECK(size >= 1, "ProcessGroup(gloo): size ", size, " must be at least 1.");
    DATAPAR_CHECK(rank >= 0 && rank < size, "ProcessGroup(gloo): rank ", rank, " is outside [0, ", size, ").");
    DATAPAR_CHECK(store != nullptr, "ProcessGroup(gloo): the store is null.");
    gloo::transport::tcp::attr attr;
    if (options.hostname.empty()) {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      attr.hostname = host;
    } else {
      attr.hostname = options.hostname;
    }
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context_->setTimeout(timeout_);
      GlooStore gloo_store(std::make_shared<PrefixStore>("gloo", store));
      context_->connectFullMesh(gloo_store, device_);
    } catch (const datapar::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(str_cat("ProcessGroup(gloo): rank ", rank, " of ", size, " could not connect to the others: ",
                              e.what(), ". Check that every process can reach ", attr.hostname,
                              " (GlooOptions::hostname) and that all of them started."));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~ProcessGroupGloo() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  std::string backend() const override { return "gloo"; }

  std::shared_ptr<Work> all_reduce(at::Tensor tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce");
    DATAPAR_CHECK(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                  "all_reduce: avg needs a floating-point tensor, not ", tensor.scalar_type(), ".");
    return enqueue(str_cat("all_reduce(", to_string(op), ")"), [this, tensor, op]() mutable {
      // Gloo has no bfloat16: reduce those in float32.
      const bool widen = tensor.scalar_type() == at::kBFloat16;
      at::Tensor buffer = widen ? tensor.to(at::kFloat) : tensor.contiguous();
      gloo::AllreduceOptions opts(context_);
      opts.setTimeout(timeout_);
      switch (buffer.scalar_type()) {
        case at::kFloat: set(opts, buffer.data_ptr<float>(), buffer.numel(), reducer<float>(op)); break;
        case at::kDouble: set(opts, buffer.data_ptr<double>(), buffer.numel(), reducer<double>(op)); break;
        case at::kInt: set(opts, buffer.data_ptr<int32_t>(), buffer.numel(), reducer<int32_t>(op)); break;
        case at::kLong: set(opts, buffer.data_ptr<int64_t>(), buffer.numel(), reducer<int64_t>(op)); break;
        case at::kHalf:
          set(opts, static_cast<gloo::float16*>(buffer.data_ptr()), buffer.numel(), reducer<gloo::float16>(op));
          break;
        default:
          throw InvalidArgumentError(str_cat("all_reduce: ", buffer.scalar_type(), " tensors are not supported."));
      }
      gloo::allreduce(opts);
      if (op == ReduceOp::kAvg) buffer.div_(size());
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> broadcast(at::Tensor tensor, int root) override {
    check_tensor(tensor, "broadcast");
    DATAPAR_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is outside [0, ", size(), ").");
    return enqueue(str_cat("broadcast(root ", root, ")"), [this, tensor, root]() mutable {
      at::Tensor buffer = tensor.contiguous();
      gloo::BroadcastOptions opts(context_);
      opts.setTimeout(timeout_);
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(buffer.data_ptr()), buffer.nbytes());
      gloo::broadcast(opts);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> barrier() override {
    return enqueue("barrier", [this] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  static void set(gloo::AllreduceOptions& opts, T* data, int64_t count, gloo::AllreduceOptions::Func fn) {
    opts.setOutput(data, static_cast<size_t>(count));
    opts.setReduceFunction(fn);
  }

  void check_tensor(const at::Tensor& tensor, const char* what) const {
    DATAPAR_CHECK(tensor.defined(), what, ": the tensor is undefined.");
    DATAPAR_CHECK(tensor.device().is_cpu(), what, ": the gloo backend takes CPU tensors, not ", tensor.device(),
                  ". Use the nccl backend for CUDA tensors.");
  }

  std::shared_ptr<Work> enqueue(std::string what, std::function<void()> op) {
    auto work = std::make_shared<Work>(str_cat(what, " on rank ", rank(), " of ", size(), " (gloo)"));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(work, std::move(op));
    }
    wake_.notify_one();
    return work;
  }

  void loop() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      auto [work, op] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        op();
        work->finish();
      } catch (const datapar::Error&) {
        work->fail(std::current_exception());
      } catch (const std::exception& e) {
        // Gloo reports a dead or silent peer as an IoException / timeout.
        work->fail(std::make_exception_ptr(CommError(str_cat(work->what(), " failed: ", e.what(),
                                                             ". A peer probably exited; rebuild the process group."))));
      }
    }
  }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::shared_ptr<Work>, std::function<void()>>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

std::shared_ptr<ProcessGroup> new_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     GlooOptions options) {
  return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, std::move(options));
}

}  // namespace datapar
