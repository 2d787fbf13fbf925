// The states of libtorch's default random generators, so that a resumed run draws the same
// random numbers (dropout masks, torch::randn noise, shuffles) as an uninterrupted one.
//
// Same states and layout as Python's torch.get_rng_state() (CPU: a uint8 tensor of the
// Mersenne Twister state) and torch.cuda.get_rng_state_all() (one uint8 tensor per CUDA
// device), so a checkpoint's RNG state can be restored on either side. Generators that
// are not the default ones (a torch::Generator you made yourself) are not covered.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace datapar::train {

struct RngState {
  at::Tensor cpu;                 // (N,) uint8: the default CPU generator
  std::vector<at::Tensor> cuda;   // (M,) uint8 each: device 0, 1, ...; empty without CUDA
};

// Copies the default generators' states (CUDA ones only in a CUDA build with devices).
// Thread-safe: takes each generator's lock. Cost: a few KB.
RngState get_rng_state();

// Restores states from get_rng_state(), here or in another process. CUDA states are set for
// min(saved, visible) devices; the rest are left alone. Throws InvalidArgumentError if a
// state is not a CPU uint8 tensor of the right size.
void set_rng_state(const RngState& state);

}  // namespace datapar::train
