// get_rng_state / set_rng_state. See rng_state.h.
#include "datapar/train/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <mutex>

#include "datapar/config.h"
#include "datapar/error.h"

namespace datapar::train {
namespace {

at::Tensor get_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const at::Tensor& state, const char* name) {
  DATAPAR_CHECK(state.defined() && state.device().is_cpu() && state.scalar_type() == at::kByte,
                "set_rng_state: the ", name, " state must be a CPU uint8 tensor from get_rng_state().");
  std::lock_guard<std::mutex> lock(generator.mutex());
  try {
    generator.set_state(state.contiguous());
  } catch (const c10::Error& e) {
    throw InvalidArgumentError(detail::str_cat("set_rng_state: the ", name, " state (", state.numel(),
                                               " bytes) was refused: ", e.what_without_backtrace()));
  }
}

#if DATAPAR_HAVE_CUDA
// Through at::Context rather than the CUDA headers, so this file needs no CUDA toolkit.
int64_t cuda_devices() {
  return at::globalContext().hasCUDA() ? static_cast<int64_t>(at::detail::getCUDAHooks().getNumGPUs()) : 0;
}
#endif

}  // namespace

RngState get_rng_state() {
  RngState state;
  state.cpu = get_state(at::detail::getDefaultCPUGenerator());
#if DATAPAR_HAVE_CUDA
  for (int64_t i = 0; i < cuda_devices(); ++i) {
    state.cuda.push_back(get_state(at::globalContext().defaultGenerator(at::Device(at::kCUDA, i))));
  }
#endif
  return state;
}

void set_rng_state(const RngState& state) {
  set_state(at::detail::getDefaultCPUGenerator(), state.cpu, "CPU");
#if DATAPAR_HAVE_CUDA
  const int64_t n = std::min<int64_t>(cuda_devices(), static_cast<int64_t>(state.cuda.size()));
  for (int64_t i = 0; i < n; ++i) {
    set_state(at::globalContext().defaultGenerator(at::Device(at::kCUDA, i)), state.cuda[i], "CUDA");
  }
#endif
}

}  // namespace datapar::train
