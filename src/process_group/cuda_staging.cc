// See cuda_staging.h. Compiled only where Torch has CUDA.
//
// Note [Staging CUDA tensors]
// A host group moves host memory, on a thread of its own. An operation on CUDA tensors:
//   a. Issue, on the caller's thread: a pinned host tensor stands in for each CUDA tensor
//      (from the caching host allocator, which reuses it only once the copies that used it
//      have run). Inputs are copied into theirs on the caller's current stream, non-blocking,
//      behind whatever computed them; an event recorded there marks the copies' end. The
//      caller goes on at once: DDP's backward keeps computing.
//   b. The staging thread, in issue order: waits for that event (this thread blocks, never
//      the caller), hands the host tensors to the host group, and waits for its result.
//   c. wait() or synchronize(), once the host operation is done: the results go back into
//      the CUDA tensors, non-blocking, on the waiting thread's current stream, so that work
//      queued there afterwards sees them (Work::deliver). No device-wide synchronisation.
// The host group must see every operation in issue order, because the other ranks' see
// theirs in that order: one on CPU tensors only (DDP's metadata) goes straight to it while no
// staged operation waits its turn on the staging thread, and behind them otherwise.
#include "process_group/cuda_staging.h"
#include "process_group/flight_recorder.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "process_group/exit_order.h"
#include "process_group/ordered_runner.h"

namespace datapar::detail {
namespace {

// A CUDA tensor an operation writes, and the host tensor that stood in for it.
struct Result {
  at::Tensor device;
  at::Tensor host;
};

// A staged operation's Work: done when the host group's is; then delivers the results (c).
class StagedWork final : public Work {
 public:
  StagedWork(std::string what, std::vector<Result> results) : Work(std::move(what)), results_(std::move(results)) {}
  ~StagedWork() override {
    // Never delivered (it failed, or nobody waited) and released by the exit handler: the
    // pinned host allocator may be gone by then (exit_order.h), and a free into it crashed.
    if (process_exiting() && !results_.empty()) new std::vector<Result>(std::move(results_));  // leaked on purpose
  }

 protected:
  void deliver() override {
    std::call_once(delivered_, [this] {
      for (Result& r : results_) {
        const c10::Device device = r.device.device();
        const c10::cuda::CUDAGuard guard(device);
        r.device.copy_(r.host, /*non_blocking=*/true);
        // The waiter's stream may not be the one the tensor was made on: its memory is not
        // reused before this copy ran, whenever the caller drops it.
        r.device.record_stream(c10::cuda::getCurrentCUDAStream(device.index()));
      }
      results_.clear();
    });
  }

 private:
  std::once_flag delivered_;
  std::vector<Result> results_;
};

// The host side of one operation's tensors (Note [Staging CUDA tensors], a). CPU tensors
// stand for themselves.
class Staging {
 public:
  // A tensor the operation reads.
  at::Tensor in(const at::Tensor& t) { return stand_in(t, /*read=*/true, /*write=*/false); }
  // A tensor the operation writes.
  at::Tensor out(const at::Tensor& t) { return stand_in(t, /*read=*/false, /*write=*/true); }
  // A tensor it reads and writes.
  at::Tensor in_out(const at::Tensor& t) { return stand_in(t, /*read=*/true, /*write=*/true); }

  template <typename Each>
  std::vector<at::Tensor> each(const std::vector<at::Tensor>& tensors, Each&& stage) {
    std::vector<at::Tensor> hosts;
    hosts.reserve(tensors.size());
    for (const at::Tensor& t : tensors) hosts.push_back(stage(t));
    return hosts;
  }

  bool staged() const { return staged_; }

  // The end of the input copies on each device's current stream, recorded now.
  std::vector<std::shared_ptr<at::cuda::CUDAEvent>> copies_done() const {
    std::vector<std::shared_ptr<at::cuda::CUDAEvent>> events;
    for (const c10::DeviceIndex d : read_on_) {
      auto event = std::make_shared<at::cuda::CUDAEvent>();
      event->record(c10::cuda::getCurrentCUDAStream(d));
      events.push_back(std::move(event));
    }
    return events;
  }

  std::vector<Result> take_results() { return std::move(results_); }

 private:
  at::Tensor stand_in(const at::Tensor& t, bool read, bool write) {
    if (!t.is_cuda()) return t;
    staged_ = true;
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    if (read) {
      const c10::cuda::CUDAGuard guard(t.device());
      host.copy_(t, /*non_blocking=*/true);
      if (std::find(read_on_.begin(), read_on_.end(), t.device().index()) == read_on_.end()) {
        read_on_.push_back(t.device().index());
      }
    }
    if (write) results_.push_back({t, host});
    return host;
  }

  bool staged_ = false;
  std::vector<c10::DeviceIndex> read_on_;  // devices whose current stream copies inputs
  std::vector<Result> results_;
};

class CudaStagingGroup final : public ProcessGroup {
 public:
  explicit CudaStagingGroup(std::shared_ptr<ProcessGroup> host)
      : ProcessGroup(host->rank(), host->size(), host->timeout()),
        host_(std::move(host)),
        staging_(host_->backend() + " CUDA staging") {
    detail::mark_internal(host_);  // this group records its collectives, not the host group too
  }

  std::string backend() const override { return host_->backend(); }
  bool takes_cuda_tensors() const override { return true; }

 protected:
  void do_abort() override { host_->abort(); }
  std::shared_ptr<Work> do_all_reduce(const std::string& what, at::Tensor tensor, ReduceOp op) override {
    Staging s;
    const at::Tensor h = s.in_out(tensor);
    return issue(what, s, [this, h, op] { return host_->all_reduce(h, op); });
  }
  std::shared_ptr<Work> do_broadcast(const std::string& what, at::Tensor tensor, int root) override {
    Staging s;
    const at::Tensor h = s.in_out(tensor);
    return issue(what, s, [this, h, root] { return host_->broadcast(h, root); });
  }
  std::shared_ptr<Work> do_reduce(const std::string& what, at::Tensor tensor, int root, ReduceOp op) override {
    Staging s;
    const at::Tensor h = s.in_out(tensor);
    return issue(what, s, [this, h, root, op] { return host_->reduce(h, root, op); });
  }
  std::shared_ptr<Work> do_all_gather(const std::string& what, std::vector<at::Tensor> outputs,
                                      at::Tensor input) override {
    Staging s;
    const at::Tensor in = s.in(input);
    const std::vector<at::Tensor> outs = s.each(outputs, [&](const at::Tensor& t) { return s.out(t); });
    return issue(what, s, [this, outs, in] { return host_->all_gather(outs, in); });
  }
  std::shared_ptr<Work> do_gather(const std::string& what, std::vector<at::Tensor> outputs, at::Tensor input,
                                  int root) override {
    Staging s;
    const at::Tensor in = s.in(input);
    const std::vector<at::Tensor> outs = s.each(outputs, [&](const at::Tensor& t) { return s.out(t); });
    return issue(what, s, [this, outs, in, root] { return host_->gather(outs, in, root); });
  }
  std::shared_ptr<Work> do_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                   int root) override {
    Staging s;
    const std::vector<at::Tensor> ins = s.each(inputs, [&](const at::Tensor& t) { return s.in(t); });
    const at::Tensor out = s.out(output);
    return issue(what, s, [this, out, ins, root] { return host_->scatter(out, ins, root); });
  }
  std::shared_ptr<Work> do_reduce_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                          ReduceOp op) override {
    Staging s;
    const std::vector<at::Tensor> ins = s.each(inputs, [&](const at::Tensor& t) { return s.in(t); });
    const at::Tensor out = s.out(output);
    return issue(what, s, [this, out, ins, op] { return host_->reduce_scatter(out, ins, op); });
  }
  std::shared_ptr<Work> do_all_to_all_single(const std::string& what, at::Tensor output, at::Tensor input) override {
    Staging s;
    const at::Tensor in = s.in(input);
    const at::Tensor out = s.out(output);
    return issue(what, s, [this, out, in] { return host_->all_to_all_single(out, in); });
  }
  std::shared_ptr<Work> do_barrier(const std::string& what) override {
    return issue(what, Staging{}, [this] { return host_->barrier(); });
  }
  std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                                ReduceOp op) override {
    Staging s;
    const std::vector<at::Tensor> hs = s.each(tensors, [&](const at::Tensor& t) { return s.in_out(t); });
    return issue(what, s, [this, hs, op] { return host_->all_reduce_coalesced(hs, op); });
  }
  std::shared_ptr<Work> do_broadcast_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                               int root) override {
    Staging s;
    const std::vector<at::Tensor> hs = s.each(tensors, [&](const at::Tensor& t) { return s.in_out(t); });
    return issue(what, s, [this, hs, root] { return host_->broadcast_coalesced(hs, root); });
  }

  // Point to point starts at once, not in the collectives' order (process_group.h), so it
  // has no staging thread to wait on: CPU tensors only, as with PyTorch's gloo.
  std::shared_ptr<Work> do_send(const std::string& what, at::Tensor tensor, int dst, int tag) override {
    refuse_cuda(tensor, what);
    return host_->send(tensor, dst, tag);
  }
  std::shared_ptr<Work> do_recv(const std::string& what, at::Tensor tensor, int src, int tag) override {
    refuse_cuda(tensor, what);
    return host_->recv(tensor, src, tag);
  }

 private:
  void refuse_cuda(const at::Tensor& tensor, const std::string& what) const {
    DATAPAR_CHECK(!tensor.is_cuda(), what, ": the ", backend(), " backend sends and receives CPU tensors, not ",
                  tensor.device(), ". Copy the tensor to the CPU first, or use the nccl backend.");
  }

  // Note [Staging CUDA tensors]: b, and the order of the host group's operations.
  std::shared_ptr<Work> issue(const std::string& what, Staging& staging, std::function<std::shared_ptr<Work>()> start) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!staging.staged() && waiting_ == 0) return start();
    if (staging.staged()) std::call_once(cuda_started_, release_default_group_at_exit);  // CUDA runs now
    auto work = std::make_shared<StagedWork>(describe(what), staging.take_results());
    ++waiting_;
    staging_.push(work, [this, inputs_copied = staging.copies_done(), start = std::move(start)] {
      for (const auto& event : inputs_copied) event->synchronize();
      std::shared_ptr<Work> host_work;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --waiting_;
        host_work = start();
      }
      host_work->synchronize();
    });
    return work;
  }
  std::shared_ptr<Work> issue(const std::string& what, Staging&& staging, std::function<std::shared_ptr<Work>()> start) {
    return issue(what, staging, std::move(start));
  }

  const std::shared_ptr<ProcessGroup> host_;  // outlives staging_, whose thread uses it
  std::mutex mutex_;
  size_t waiting_ = 0;  // staged operations not yet handed to host_
  std::once_flag cuda_started_;
  OrderedRunner staging_;
};

}  // namespace

std::shared_ptr<ProcessGroup> with_cuda_staging(std::shared_ptr<ProcessGroup> host_group) {
  return std::make_shared<CudaStagingGroup>(std::move(host_group));
}

}  // namespace datapar::detail
