// See wait_timer.h. Compiled only where Torch has CUDA.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <utility>

#include "cuda/stream_capture.h"
#include "ddp/wait_timer.h"

namespace datapar::detail {
namespace {

class CudaWaitTimer final : public WaitTimer {
 public:
  explicit CudaWaitTimer(c10::DeviceIndex device) : device_(device) {}

  // Not under a CUDA graph's capture: its events would belong to the graph, which has no
  // host to read them (a replayed step's wait is not timed).
  void start() override {
    capturing_ = stream_capturing(c10::Device(c10::kCUDA, device_));
    if (capturing_) return;
    if (!timed_.empty() && !timed_.back().second.isCreated()) timed_.pop_back();  // no stop(): the wait threw
    count_finished();  // without blocking: keeps the queue short however rarely total() is read
    timed_.emplace_back(at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault));
    timed_.back().first.record(c10::cuda::getCurrentCUDAStream(device_));
  }

  void stop() override {
    if (!capturing_) timed_.back().second.record(c10::cuda::getCurrentCUDAStream(device_));
  }

  std::chrono::nanoseconds total() override {
    for (auto& [from, to] : timed_) to.synchronize();
    count_finished();
    return total_;
  }

 private:
  void count_finished() {
    while (!timed_.empty() && timed_.front().second.isCreated() && timed_.front().second.query()) {
      const float ms = timed_.front().first.elapsed_time(timed_.front().second);
      total_ += std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
      timed_.pop_front();
    }
  }

  const c10::DeviceIndex device_;
  std::deque<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>> timed_;  // started, oldest first
  std::chrono::nanoseconds total_{0};
  bool capturing_ = false;  // the wait being timed is captured
};

}  // namespace

std::unique_ptr<WaitTimer> cuda_wait_timer(c10::DeviceIndex device) { return std::make_unique<CudaWaitTimer>(device); }

}  // namespace datapar::detail
