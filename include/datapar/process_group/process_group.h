// ProcessGroup: collectives among the processes of a job, one call per process, matched by
// order: every process must issue the same collectives in the same order.
//
// Every call returns at once with a Work; the operations of one group run one after
// another, in the order they were issued, on the group's own thread, so several may be in
// flight without deadlock. Tensors must stay alive and untouched until their Work is done.
// Backends: Gloo (CPU tensors over TCP). NCCL and MPI arrive with the distributed runtime.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "datapar/process_group/work.h"
#include "datapar/rendezvous/store.h"

namespace datapar {

enum class ReduceOp { kSum, kAvg, kMin, kMax, kProduct };

const char* to_string(ReduceOp op);

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;

  // Reduces `tensor` element-wise over all processes; every process gets the result in
  // `tensor`. kAvg divides the sum by size() (floating-point tensors only).
  // Supported: float32/64, float16, bfloat16, int32/64, on the CPU; non-contiguous tensors
  // are reduced through a contiguous copy.
  virtual std::shared_ptr<Work> all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) = 0;

  // Copies `tensor` of process `root` into `tensor` of every other process.
  virtual std::shared_ptr<Work> broadcast(at::Tensor tensor, int root = 0) = 0;

  // Completes once every process has called it.
  virtual std::shared_ptr<Work> barrier() = 0;

 private:
  int rank_;
  int size_;
};

struct GlooOptions {
  // The address other processes reach this one on (its TCP transport binds it).
  // Empty: this machine's hostname.
  std::string hostname;
  // Limit for connecting and for every collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// A Gloo process group of `size` processes, this one being `rank`, meeting through `store`
// (which every process must share, e.g. from rendezvous()). Blocks until all processes
// have connected. Throws InvalidArgumentError for a bad rank or size, TimeoutError or
// CommError when the others do not connect in time.
std::shared_ptr<ProcessGroup> new_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     GlooOptions options = {});

}  // namespace datapar
