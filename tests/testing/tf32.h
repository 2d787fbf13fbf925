// GPU comparisons run in true float32: TF32 (Ampere and newer) rounds the inputs of matrix
// products and convolutions to 10 bits of mantissa, which no stated tolerance survives.
#pragma once

#include <ATen/Context.h>

namespace datapar::testing {

inline void turn_off_tf32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

}  // namespace datapar::testing
