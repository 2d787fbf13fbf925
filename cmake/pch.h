// The libtorch headers every datapar translation unit needs, precompiled once.
// Narrow headers only: <torch/torch.h> pulls in the whole frontend and costs ~15 s a file.
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
