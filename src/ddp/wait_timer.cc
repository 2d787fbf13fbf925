// See wait_timer.h.
#include "ddp/wait_timer.h"

#include "datapar/config.h"

namespace datapar::detail {
namespace {

class HostWaitTimer final : public WaitTimer {
 public:
  void start() override { started_ = std::chrono::steady_clock::now(); }
  void stop() override { total_ += std::chrono::steady_clock::now() - started_; }
  std::chrono::nanoseconds total() override { return total_; }

 private:
  std::chrono::steady_clock::time_point started_;
  std::chrono::nanoseconds total_{0};
};

}  // namespace

std::unique_ptr<WaitTimer> wait_timer_for(const c10::Device& device) {
#if DATAPAR_HAVE_CUDA
  if (device.is_cuda()) return cuda_wait_timer(device.index());
#endif
  return std::make_unique<HostWaitTimer>();
}

}  // namespace datapar::detail
