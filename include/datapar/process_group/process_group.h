// ProcessGroup: collectives among the processes of a job, one call per process, matched by
// order: every process must issue the same collectives in the same order.
//
// Every call returns at once with a Work; the operations of one group run one after
// another, in the order they were issued (on the group's own thread, or for nccl on the
// group's CUDA stream), so several may be in flight without deadlock. Tensors must stay
// alive and untouched until their Work is done (nccl: until work queued after wait() on the
// current stream runs; see work.h).
// Backends, each with a header of its Options and factory: Gloo (gloo.h: CPU tensors over
// TCP; CUDA tensors too where Torch has CUDA, staged through pinned host memory: their
// Work's wait() queues the copy back on the caller's current stream), MPI (mpi.h: CPU
// tensors; shared memory within a node, in builds with MPI: DATAPAR_HAVE_MPI in
// datapar/config.h), NCCL (nccl.h: CUDA tensors, in builds where Torch has CUDA and NCCL
// was found: DATAPAR_HAVE_NCCL). A backend a build lacks answers its factory with
// InvalidArgumentError saying how to get it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/process_group/work.h"
#include "datapar/reduce_op.h"
#include "datapar/rendezvous/store.h"
#include "datapar/timeout.h"

namespace datapar {
namespace detail {
class StallInspector;
class FlightRecorder;
}  // namespace detail

// What Work::wait() waits beyond its group's timeout by default (at most; no longer than
// the timeout itself): the operation fails at the group's timeout with an error that names
// who is missing, and that error must come first.
constexpr std::chrono::milliseconds kWaitGrace = std::chrono::seconds(5);

// How long a collective may wait before a warning names the ranks that have not issued it
// (ProcessGroup::inspect_stalls).
constexpr std::chrono::milliseconds kDefaultStallWarning = std::chrono::seconds(60);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;

  // The limit of every operation of this group, fixed when it was made (GlooOptions,
  // MpiOptions or NcclOptions::timeout; init_process_group's `timeout`): an operation that
  // does not complete within it fails, and Work::wait() waits at most this long (plus
  // kWaitGrace, for that failure to arrive) by default.
  // Everything built on the group (DDP, SyncBatchNorm, ZeRO, the rank balancer) waits
  // within it: a group made with 30 minutes gives DDP 30 minutes.
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Where every tensor this group moves must live: the CPU for gloo and mpi, this rank's
  // cuda:k for nccl. Metadata for a collective (flags, counts, orders) is made with
  // options(), or with datapar/process_group/metadata.h, never with default (CPU) options.
  virtual c10::Device device() const { return c10::Device(c10::kCPU); }
  at::TensorOptions options(at::ScalarType dtype) const { return at::TensorOptions().dtype(dtype).device(device()); }

  // Whether a group on the CPU also takes CUDA tensors: gloo's do in builds where Torch has
  // CUDA (staged through pinned host memory, as PyTorch's gloo does; DDP of a model on a GPU
  // over gloo). Metadata still belongs on device().
  virtual bool takes_cuda_tensors() const { return false; }

  // Every operation below checks its arguments on the caller's thread and throws
  // InvalidArgumentError for a bad call before anything is queued: tensors defined, dense,
  // on device() (or CUDA, where takes_cuda_tensors()), lists of size() tensors alike, roots
  // and peers in [0, size()).
  // Supported dtypes: float32/64, float16, bfloat16, int32/64 (nccl also int8 and uint8).

  // Reduces `tensor` element-wise over all processes; every process gets the result in
  // `tensor`. kAvg divides the sum by size() (floating-point tensors only).
  // Non-contiguous tensors are reduced through a contiguous copy.
  std::shared_ptr<Work> all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum);

  // Copies `tensor` of process `root` into `tensor` of every other process.
  std::shared_ptr<Work> broadcast(at::Tensor tensor, int root = 0);

  // Reduces `tensor` over all processes into `tensor` of process `root` (the others'
  // tensors are left as they were or used as scratch space: do not rely on them).
  std::shared_ptr<Work> reduce(at::Tensor tensor, int root = 0, ReduceOp op = ReduceOp::kSum);

  // outputs[i] receives `input` of process i. REQUIRES: size() outputs, each of input's
  // shape and dtype.
  std::shared_ptr<Work> all_gather(std::vector<at::Tensor> outputs, at::Tensor input);

  // On `root`, outputs[i] receives `input` of process i; elsewhere `outputs` is ignored
  // (may be empty).
  std::shared_ptr<Work> gather(std::vector<at::Tensor> outputs, at::Tensor input, int root = 0);

  // On `root`, inputs[i] goes to `output` of process i; elsewhere `inputs` is ignored (may
  // be empty).
  std::shared_ptr<Work> scatter(at::Tensor output, std::vector<at::Tensor> inputs, int root = 0);

  // `output` of process i receives the reduction over all processes of their inputs[i].
  // REQUIRES: size() inputs, each of output's shape and dtype.
  std::shared_ptr<Work> reduce_scatter(at::Tensor output, std::vector<at::Tensor> inputs,
                                       ReduceOp op = ReduceOp::kSum);

  // PyTorch's all_to_all_single with equal splits: `input` is split into size() equal
  // chunks along dim 0; chunk j goes to process j, and chunk i of `output` comes from
  // process i. REQUIRES: output and input of one shape and dtype, dim 0 divisible by size().
  std::shared_ptr<Work> all_to_all_single(at::Tensor output, at::Tensor input);

  // Completes once every process has called it.
  std::shared_ptr<Work> barrier();

  // all_reduce of several tensors as one operation: tensors of one dtype travel as one
  // flat message, which is much faster than one all_reduce each for many small tensors.
  std::shared_ptr<Work> all_reduce_coalesced(std::vector<at::Tensor> tensors, ReduceOp op = ReduceOp::kSum);

  // broadcast of several tensors as one operation (one flat message per dtype).
  std::shared_ptr<Work> broadcast_coalesced(std::vector<at::Tensor> tensors, int root = 0);

  // Point to point. send() delivers `tensor` to process `dst`, where the recv() with
  // src == this rank and the same tag receives it; messages between two processes with one
  // tag arrive in the order they were sent. Sizes and dtypes must match. Unlike
  // collectives, send and recv are started at once, not behind queued collectives, so
  // two processes may each send to the other before receiving without deadlock. Except on
  // nccl, where NCCL's rules hold (new_nccl_process_group): no tags (tag 0 only), and each
  // send and recv waits its turn behind the operations issued before it.
  std::shared_ptr<Work> send(at::Tensor tensor, int dst, int tag = 0);
  std::shared_ptr<Work> recv(at::Tensor tensor, int src, int tag = 0);

  // Abandons the group, as a job that goes on without a failed member must (datapar/ft/):
  // every operation in flight fails at once with CommError (its Work; what the backend does
  // underneath: gloo closes its connections to every peer, which fails the peers'
  // operations with this process too; the shared-memory layer stops waiting; nccl aborts
  // the communicator), and every operation issued later throws CommError without waiting.
  // Thread-safe, idempotent, never waits for a peer. The survivors of a failure abort their
  // group and make a new one (on a fresh store prefix). Destroying an aborted group may
  // wait, at most the timeout, for an operation its backend could not abandon (gloo's, mpi's).
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Stall warnings (Note [Stall inspection] in src/process_group/stall_inspector.cc): when a
  // collective of this group has not completed after `warn_after`, one warning through the
  // warning sink (datapar/warning.h) names it and the ranks that have not issued it yet,
  // which publish their progress to `store`: a namespace of the job's store for this group
  // alone, the same on every member. Every member calls it once, before the group's first
  // collective; the groups datapar makes with a store do (new_gloo_process_group,
  // new_nccl_process_group, init_process_group, new_group), after kDefaultStallWarning.
  void inspect_stalls(std::shared_ptr<Store> store, std::chrono::milliseconds warn_after = kDefaultStallWarning);
  // Changes the wait before a warning (zero: none). REQUIRES: inspect_stalls() was called.
  void set_stall_warning(std::chrono::milliseconds warn_after);

  // The group's name in flight recorder dumps (flight_recorder.h), the same on every rank:
  // init_process_group's is "default", new_group's "group/<N>".
  void set_name(const std::string& name);

 protected:
  ProcessGroup(int rank, int size, std::chrono::milliseconds timeout);

  // What a backend implements: how the bytes of one operation move. The operation above
  // has checked the arguments; `what` names it for errors ("all_reduce(sum)"; describe()
  // adds the rank). A backend returns a Work it completes (work_completion.h) and may throw:
  // datapar's errors reach the caller as they are, anything else as a CommError naming the
  // operation.
  virtual std::shared_ptr<Work> do_all_reduce(const std::string& what, at::Tensor tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> do_broadcast(const std::string& what, at::Tensor tensor, int root) = 0;
  virtual std::shared_ptr<Work> do_reduce(const std::string& what, at::Tensor tensor, int root, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> do_all_gather(const std::string& what, std::vector<at::Tensor> outputs,
                                              at::Tensor input) = 0;
  // Off the root, `outputs` (`inputs`) is empty.
  virtual std::shared_ptr<Work> do_gather(const std::string& what, std::vector<at::Tensor> outputs, at::Tensor input,
                                          int root) = 0;
  virtual std::shared_ptr<Work> do_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                           int root) = 0;
  virtual std::shared_ptr<Work> do_reduce_scatter(const std::string& what, at::Tensor output,
                                                  std::vector<at::Tensor> inputs, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> do_all_to_all_single(const std::string& what, at::Tensor output, at::Tensor input) = 0;
  virtual std::shared_ptr<Work> do_barrier(const std::string& what) = 0;
  virtual std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                                        ReduceOp op) = 0;
  virtual std::shared_ptr<Work> do_broadcast_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                                       int root) = 0;
  virtual std::shared_ptr<Work> do_send(const std::string& what, at::Tensor tensor, int dst, int tag) = 0;
  virtual std::shared_ptr<Work> do_recv(const std::string& what, at::Tensor tensor, int src, int tag) = 0;

  // What abort() does underneath, after failing the Works in flight: nothing by default.
  // Called once, from any thread.
  virtual void do_abort() {}

  // "<what> on rank R of N (<label()>)", the name of an operation in every error.
  std::string describe(const std::string& what) const;
  // How describe() names the backend: backend(), or more ("gloo, shared memory").
  virtual std::string label() const { return backend(); }

  // For a backend's error when a collective times out: the stall inspector's "rank(s) 1
  // (at 4) have not issued it yet" for the oldest collective still pending, or "".
  std::string ranks_behind() const;

 private:
  // Runs a backend's do_* under the one error translation (see do_all_reduce), and shows
  // a collective's Work to the stall inspector.
  // `tensors` describes the operation's tensors (tensor_description.h), for the flight
  // recorder and DETAIL's check; called only when one of them is on.
  template <typename Start, typename Tensors>
  std::shared_ptr<Work> start(const std::string& what, Start&& start_operation, Tensors&& tensors,
                              bool collective = true);
  // DATAPAR_DISTRIBUTED_DEBUG=DETAIL: every rank's call, compared before the collective runs
  // (src/process_group/collective_check.cc); throws InvalidArgumentError naming each call.
  void check_same_call(const std::string& what, const std::string& tensors);

  void check_tensor(const at::Tensor& tensor, const char* what) const;
  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what,
                  const char* name) const;

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false};
  // The Works handed out and perhaps not done, for abort() to fail (completed ones are
  // pruned as it grows).
  std::mutex in_flight_mutex_;
  std::vector<std::weak_ptr<Work>> in_flight_;
  size_t prune_at_ = 64;
  std::shared_ptr<detail::StallInspector> stall_inspector_;  // null: not inspected
  // The flight recorder's ring of this group's collectives; made at the first collective
  // (null: off).
  std::once_flag recorder_once_;
  std::shared_ptr<detail::FlightRecorder> recorder_;
  std::string name_;
};

}  // namespace datapar
