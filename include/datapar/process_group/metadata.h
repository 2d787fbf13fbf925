// Metadata tensors for a group's collectives: the flags, counts, orders and texts that DDP,
// join, SyncBatchNorm, the model check and exact evaluation exchange beside the gradients.
//
// Every tensor a group moves must live on the group's device (ProcessGroup::device()): the
// CPU for gloo and mpi, this rank's GPU for nccl, which refuses host memory. This is the
// one place such tensors are made, so that code written and tested on CPUs is right on
// GPUs too: values go in from the host here and come back to the host here.
//
// Going in never blocks the host: a device gets its values by a non-blocking copy from
// page-locked memory, ordered on the current stream. Coming back (host_*) waits for the
// device, so it is for where the host must decide something; each one is counted
// (detail::metadata_host_reads), and a test holds DDP's step to none.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar {

// A 1-D tensor on the group's device holding `values` (int64 or float64).
at::Tensor metadata_tensor(const ProcessGroup& group, const std::vector<int64_t>& values);
at::Tensor metadata_tensor(const ProcessGroup& group, const std::vector<double>& values);

// `count` zeros of `dtype` on the group's device.
at::Tensor metadata_zeros(const ProcessGroup& group, int64_t count, at::ScalarType dtype);

// The bytes of `text`, zero-padded to `length` (>= text.size()), as a uint8 tensor on the
// group's device.
at::Tensor metadata_text(const ProcessGroup& group, const std::string& text, int64_t length);

// A metadata tensor's values on the host. Call after the Work that filled it was waited
// for (on a device backend the copy is ordered after the collective on the current stream).
std::vector<int64_t> host_int64s(const at::Tensor& tensor);
std::vector<double> host_doubles(const at::Tensor& tensor);
std::string host_text(const at::Tensor& tensor, int64_t length);

// Byte strings over a group (a plan, a serialized state, an error), collective and waited
// for: every rank's `bytes` on every rank, in rank order; and `root`'s `bytes` on every
// rank (the others' `bytes` are ignored). Two collectives each: the lengths, then the bytes.
std::vector<std::string> all_gather_bytes(ProcessGroup& group, const std::string& bytes);
std::string broadcast_bytes(ProcessGroup& group, int root, const std::string& bytes);

namespace detail {

// How many host_* reads this process has made: the points where the host waited for
// metadata (on a GPU, for the device). For tests.
int64_t metadata_host_reads();

}  // namespace detail

}  // namespace datapar
