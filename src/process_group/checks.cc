#include "process_group/checks.h"

#include <ATen/ATen.h>

#include "datapar/error.h"

namespace datapar::detail {

void check_tensor(const at::Tensor& tensor, const char* what, const char* backend) {
  DATAPAR_CHECK(tensor.defined(), what, ": the tensor is undefined.");
  DATAPAR_CHECK(tensor.device().is_cpu(), what, ": the ", backend, " backend takes CPU tensors, not ",
                tensor.device(), ". Use the nccl backend for CUDA tensors.");
}

void check_root(int root, int size, const char* what) {
  DATAPAR_CHECK(root >= 0 && root < size, what, ": root ", root, " is outside [0, ", size, ").");
}

void check_avg(ReduceOp op, const at::Tensor& tensor, const char* what, bool plural) {
  DATAPAR_CHECK(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()), what, ": avg needs ",
                plural ? "floating-point tensors" : "a floating-point tensor", ", not ", tensor.scalar_type(), ".");
}

void check_like(const std::vector<at::Tensor>& list, const at::Tensor& like, int count, const char* what,
                const char* name) {
  DATAPAR_CHECK(static_cast<int>(list.size()) == count, what, ": ", list.size(), " ", name, " for ", count,
                " processes; give one per process.");
  for (size_t i = 0; i < list.size(); ++i) {
    DATAPAR_CHECK(list[i].defined() && list[i].device().is_cpu() && list[i].sizes() == like.sizes() &&
                      list[i].scalar_type() == like.scalar_type(),
                  what, ": ", name, "[", i, "] must be a CPU tensor of shape ", like.sizes(), " and type ",
                  like.scalar_type(), ".");
  }
}

void check_all_to_all(const at::Tensor& output, const at::Tensor& input, int size) {
  DATAPAR_CHECK(input.sizes() == output.sizes() && input.scalar_type() == output.scalar_type(),
                "all_to_all: output ", output.sizes(), " ", output.scalar_type(), " must match input ",
                input.sizes(), " ", input.scalar_type(), ".");
  DATAPAR_CHECK(input.dim() >= 1 && input.size(0) % size == 0, "all_to_all: dim 0 of the input (",
                input.dim() ? input.size(0) : 0, ") must split into ", size, " equal chunks.");
}

void check_peer(int peer, int rank, int size, int tag, const char* what) {
  DATAPAR_CHECK(peer >= 0 && peer < size, what, ": peer rank ", peer, " is outside [0, ", size, ").");
  DATAPAR_CHECK(peer != rank, what, ": rank ", rank, " is the peer itself; copy the tensor instead.");
  DATAPAR_CHECK(tag >= 0, what, ": tag ", tag, " must not be negative.");
}

}  // namespace datapar::detail
