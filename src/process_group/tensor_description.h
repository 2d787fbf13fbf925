// A collective's tensors in words, as the flight recorder keeps them and DETAIL's check
// compares them across ranks: "float32[64, 10]", "float32[512] x3".
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace datapar::detail {

// "float32", "int64": the names PyTorch users know (torch.float32).
const char* dtype_name(at::ScalarType t);

std::string describe_tensor(const at::Tensor& t);
// The tensors of a list: "D[S] xN" when all alike, else each in turn.
std::string describe_tensors(const std::vector<at::Tensor>& tensors);

}  // namespace datapar::detail
