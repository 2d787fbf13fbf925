// torch.autocast for C++: within an Autocast's scope the ops autocast covers (matmuls,
// convolutions, linear layers) run on `device`'s type in `dtype`, and those it keeps in
// float32 (losses, norms, softmax) stay there, as under Python's
// `with torch.autocast(device_type, dtype):`. Backward runs outside it, in the dtypes the
// forward chose; parameters and their gradients stay float32, so DDP, FSDP and the optimizer
// see what they see without it.
//
//   {
//     datapar::amp::Autocast autocast(c10::DeviceType::CPU, at::kBFloat16);
//     loss = at::cross_entropy_loss(model->forward(x).to(at::kFloat), y);
//   }
//   loss.backward();
//
// Scopes nest; leaving the outermost one drops the cast copies of the weights autocast keeps
// while it is on (as torch.autocast's exit does). The setting is per thread, as in Python;
// datapar's DataParallel hands it to its device threads. Header-only: libtorch 1.x names
// the calls per device, 2.x takes the device type.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include "datapar/error.h"

namespace datapar::amp {

class Autocast {
 public:
  // Throws InvalidArgumentError for a device type autocast does not cover here (CPU and
  // CUDA do) or a dtype other than bfloat16 and float16.
  Autocast(c10::DeviceType device, at::ScalarType dtype) : device_(device) {
    DATAPAR_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
                  "Autocast covers CPU and CUDA devices, not ", device);
    DATAPAR_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "Autocast computes in bfloat16 or float16, not ",
                  dtype);
#if TORCH_VERSION_MAJOR < 2
    DATAPAR_CHECK(device != c10::DeviceType::CPU || dtype == at::kBFloat16,
                  "libtorch 1.x's autocast on the CPU computes in bfloat16 only, not float16 (2.x does both)");
#endif
    was_enabled_ = enabled(device);
    was_dtype_ = get_dtype(device);
    set_dtype(device, dtype);
    set_enabled(device, true);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_enabled(device_, was_enabled_);
    set_dtype(device_, was_dtype_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  // Whether autocast is on for `device` in this thread.
  static bool enabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    return at::autocast::is_autocast_enabled(device);
#else
    return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
  }

 private:
  static void set_enabled(c10::DeviceType device, bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(device, on);
#else
    device == c10::DeviceType::CPU ? at::autocast::set_cpu_enabled(on) : at::autocast::set_enabled(on);
#endif
  }
  static at::ScalarType get_dtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    return at::autocast::get_autocast_dtype(device);
#else
    return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                          : at::autocast::get_autocast_gpu_dtype();
#endif
  }
  static void set_dtype(c10::DeviceType device, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_dtype(device, dtype);
#else
    device == c10::DeviceType::CPU ? at::autocast::set_autocast_cpu_dtype(dtype)
                                   : at::autocast::set_autocast_gpu_dtype(dtype);
#endif
  }

  c10::DeviceType device_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace datapar::amp
