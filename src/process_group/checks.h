// Argument checks shared by the CPU backends (gloo, mpi), so that every backend refuses a
// bad call with the same InvalidArgumentError and the same words, before queuing anything.
// They check the caller's side only; whether the other processes agree is not checked here.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::detail {

// A defined CPU tensor. `backend` names the backend in the hint ("gloo", "mpi").
void check_tensor(const at::Tensor& tensor, const char* what, const char* backend);

// root in [0, size).
void check_root(int root, int size, const char* what);

// kAvg only for floating-point tensors. `plural`: the message speaks of a list.
void check_avg(ReduceOp op, const at::Tensor& tensor, const char* what, bool plural = false);

// `count` CPU tensors in `list`, each of like's shape and dtype; `name` says which list.
void check_like(const std::vector<at::Tensor>& list, const at::Tensor& like, int count, const char* what,
                const char* name);

// all_to_all: output and input alike, dim 0 splitting into `size` equal chunks.
void check_all_to_all(const at::Tensor& output, const at::Tensor& input, int size);

// send / recv: a peer in [0, size) other than `rank`, and a tag >= 0.
void check_peer(int peer, int rank, int size, int tag, const char* what);

}  // namespace datapar::detail
