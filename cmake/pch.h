// The libtorch headers every datapar translation unit needs, precompiled once.
// Narrow headers only: <torch/torch.h> pulls in the whole frontend and costs ~15 s a file.
//
// Note [ccache and the PCH]
// ccache caches a compile that uses this PCH when (1) the PCH comes in by -include (CMake's
// way), (2) the sloppiness pch_defines,time_macros (the top CMakeLists.txt) and (3) the PCH
// is the same bytes in every build tree: ccache caches the PCH's own compile too, and clang
// writes no timestamp into it (-fno-pch-timestamp). A hit is checked against the PCH's hash,
// so a changed header here recompiles everything, as it must. With base_dir at the source
// tree, gcc's builds hit from a clone in any folder (measured: 6/6 from a second clone);
// clang's PCH names the files it was made from by absolute path (and CMake passes it after
// -Xclang, where ccache leaves paths alone), so clang's builds (the sanitizer legs) hit in the
// same folder only.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>
