// The NCCL backend: CUDA tensors, NCCL's collectives. Compiled only where Torch has CUDA
// and NCCL was found. This file chooses the device, joins the group, and says what each
// operation puts on which stream; the communicator (non-blocking init, enqueue, abort) is
// communicator.h, completing Works and catching errors and timeouts is watchdog.h.
//
// Note [Streams of an operation]
// The caller's current stream S (c10::cuda::getCurrentCUDAStream(device)) produced the
// inputs. The group's communication stream C (one of c10's pool) runs the collectives, so
// that they overlap with what the caller queues on S afterwards (DDP's backward). One
// operation is:
//   a. on S: contiguous copies of the inputs and the flat buffers the operation needs;
//      allocated while S is current, so the caching allocator orders their memory by S;
//   b. an event recorded on S, which C waits for: C sees the inputs, and nothing of S
//      queued later; no other stream waits for anything at launch;
//   c. the NCCL call(s) on C, polled until NCCL has enqueued them;
//   d. on C, behind them: results copied into non-contiguous outputs, all_gather's flat
//      buffer into the outputs, coalesced buffers back into their tensors;
//   e. the end event recorded on C, after (d).
// Every tensor of (a)-(d) is recorded on C with the caching allocator (recordStream): when
// the host frees it (the user's tensors whenever the user drops them, the temporaries when
// the call returns), its memory is not handed to S's next allocation until C is past it.
// The watchdog also holds them until (e) has completed. Work::wait() makes the stream that
// is current when it is called wait for (e) (work.h), so work queued there sees the results.
//
// Note [A collective in a CUDA graph]
// Under stream capture (train/cuda_graph_step.h) steps (a)-(e) are recorded, not run: the
// event of (b) makes C part of the capture and the end event of (e), which wait() has the
// caller's stream wait for, joins it back, as every captured fork must. The watchdog never
// sees the operation: its end event belongs to the graph (polling it would break the
// capture), each replay runs it again without the host, and its tensors are the graph
// pool's. So a captured Work stays pending for the host (wait() orders the stream, which is
// all a captured step may do; a blocking wait is refused), and CudaGraphStep bounds each
// replay itself.
//
// Note [One launch at a time]
// Steps (b)-(e) and the watchdog's queue run under one mutex, so that the order of the
// operations on C, in NCCL and in the watchdog's queue is the same when several threads
// issue operations (DDP's hooks run on autograd's threads). Which of two threads goes first
// is theirs to agree on across ranks: NCCL matches operations by order.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "cuda/stream_capture.h"
#include "datapar/error.h"
#include "datapar/process_group/nccl.h"
#include "tensor/coalesce.h"
#include "process_group/nccl/communicator.h"
#include "process_group/nccl/transport.h"
#include "process_group/nccl/watchdog.h"
#include "process_group/nccl/work.h"

namespace datapar {
namespace {

using detail::NcclClock;
using detail::str_cat;

// NCCL's type for a dtype; ncclNumTypes for one NCCL has not.
ncclDataType_t nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: return ncclNumTypes;
  }
}

// A tensor's elements as NCCL sees them.
struct Elements {
  ncclDataType_t type;
  size_t count;
};

// For a reduction: the tensor's own type, which NCCL must have.
Elements reduced(const at::Tensor& t) {
  const ncclDataType_t type = nccl_type(t.scalar_type());
  if (type == ncclNumTypes) {
    throw InvalidArgumentError(str_cat("the nccl backend reduces float32/64, float16, bfloat16, int8/32/64 and uint8 "
                                       "tensors, not ", t.scalar_type(), ". Convert the tensor to one of them first."));
  }
  return {type, static_cast<size_t>(t.numel())};
}

// For an operation that only moves the elements (broadcast, the gathers and scatters,
// send and recv): the tensor's own type where NCCL has it, else its bytes, so that every
// dtype moves (bool, int16, complex, ...): NCCL never looks at values it only moves.
Elements moved(const at::Tensor& t) {
  const ncclDataType_t type = nccl_type(t.scalar_type());
  if (type != ncclNumTypes) return {type, static_cast<size_t>(t.numel())};
  return {ncclUint8, t.nbytes()};
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

// Note [Which GPU]: the rule of NcclOptions::device, the same for every group of the
// process. Never the rank: a subgroup passes its rank within the subgroup.
c10::DeviceIndex choose_device(int requested, const std::optional<std::string>& local_rank_text) {
  const int visible = c10::cuda::device_count();  // 0, not an error, without a GPU or driver
  DATAPAR_CHECK(visible > 0, "ProcessGroup(nccl): no CUDA device is visible. Use the gloo or mpi backend on CPUs.");
  if (requested >= 0) {
    DATAPAR_CHECK(requested < visible, "ProcessGroup(nccl): NcclOptions::device asks for cuda:", requested,
                  ", which does not exist: ", visible, " CUDA device(s) are visible (cuda:0 .. cuda:", visible - 1,
                  ").");
    return static_cast<c10::DeviceIndex>(requested);
  }
  // One visible GPU (CUDA_VISIBLE_DEVICES narrowed per process, as Slurm does): that one,
  // whatever the local rank.
  if (visible == 1) return 0;
  if (local_rank_text) {
    const char* text = local_rank_text->c_str();
    int local_rank = -1;
    const char* end = text + std::strlen(text);
    const auto [stop, error] = std::from_chars(text, end, local_rank);
    DATAPAR_CHECK(error == std::errc() && stop == end && *text != '\0' && local_rank >= 0 && local_rank < visible,
                  "ProcessGroup(nccl): LOCAL_RANK=\"", text, "\" does not name a GPU of this machine: ", visible,
                  " CUDA device(s) are visible, so it must be an integer in [0, ", visible,
                  "). Start at most that many processes per machine, or unset LOCAL_RANK and choose the GPU with "
                  "NcclOptions::device or c10::cuda::set_device().");
    return static_cast<c10::DeviceIndex>(local_rank);
  }
  const int current = c10::cuda::current_device();
  DATAPAR_CHECK(current >= 0 && current < visible, "ProcessGroup(nccl): the current device cuda:", current,
                " does not exist: ", visible, " CUDA device(s) are visible.");
  return static_cast<c10::DeviceIndex>(current);
}

// `t` itself when contiguous, else a contiguous tensor like it; for outputs, whose
// contents do not matter (made on the caller's stream: Note [Streams of an operation], a).
at::Tensor contiguous_output(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

// Runs NCCL calls between ncclGroupStart and ncclGroupEnd. `body` gets a function to hand
// each call's result to; returns the first error, else ncclGroupEnd's result (ncclInProgress
// while a non-blocking communicator enqueues). The group is always closed, even after an
// error, since NCCL's group depth is per thread.
ncclResult_t in_group(const std::function<void(const std::function<void(ncclResult_t)>&)>& body) {
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return result;
  body([&](ncclResult_t call) {
    if (result == ncclSuccess && call != ncclSuccess && call != ncclInProgress) result = call;
  });
  const ncclResult_t end = ncclGroupEnd();
  return result != ncclSuccess ? result : end;
}

class ProcessGroupNccl : public ProcessGroup {
 public:
  ProcessGroupNccl(const std::shared_ptr<Store>& store, int rank, int size, c10::DeviceIndex device,
                   NcclOptions options)
      : ProcessGroup(rank, size, options.timeout),
        options_(options),
        device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)) {
    c10::cuda::CUDAGuard guard(device_);  // for NCCL's id and init; the caller's device comes back
    const NcclClock::time_point deadline = NcclClock::now() + options_.timeout;
    const ncclUniqueId id = meet(store, deadline);
    comm_ = std::make_unique<detail::NcclComm>(id, rank, size, device_, deadline, options_.timeout);
    watchdog_ = std::make_unique<detail::NcclWatchdog>(*comm_, device_, options_.timeout,
                                                       options_.end_process_on_failure);
  }

  ~ProcessGroupNccl() override {
    watchdog_.reset();  // every Work finishes or fails first (at most the timeout)
    comm_.reset();      // then finalize and destroy, unless aborted (Note [Abort once])
  }

  std::string backend() const override { return "nccl"; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, device_); }

 protected:
  // ncclCommAbort: the kernels in flight end early, the watchdog fails their Works.
  void do_abort() override { comm_->abort("abort()", "ProcessGroup::abort() was called on this rank"); }

  std::shared_ptr<Work> do_all_reduce(const std::string& what, at::Tensor tensor, ReduceOp op) override {
    const Elements e = reduced(tensor);
    const at::Tensor buffer = tensor.contiguous();
    return launch({what, {tensor, buffer},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), e.count, e.type, nccl_op(op), comm,
                                          stream);
                   },
                   copy_back({buffer}, {tensor})});
  }

  std::shared_ptr<Work> do_broadcast(const std::string& what, at::Tensor tensor, int root) override {
    const Elements e = moved(tensor);
    const at::Tensor buffer = tensor.contiguous();
    return launch({what, {tensor, buffer},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclBroadcast(buffer.data_ptr(), buffer.data_ptr(), e.count, e.type, root, comm, stream);
                   },
                   copy_back({buffer}, {tensor})});
  }

  std::shared_ptr<Work> do_reduce(const std::string& what, at::Tensor tensor, int root, ReduceOp op) override {
    const Elements e = reduced(tensor);
    const at::Tensor buffer = tensor.contiguous();
    return launch({what, {tensor, buffer},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclReduce(buffer.data_ptr(), buffer.data_ptr(), e.count, e.type, nccl_op(op), root, comm,
                                       stream);
                   },
                   copy_back({buffer}, {tensor})});
  }

  std::shared_ptr<Work> do_all_gather(const std::string& what, std::vector<at::Tensor> outputs,
                                      at::Tensor input) override {
    const Elements e = moved(input);
    const at::Tensor in = input.contiguous();
    const int64_t count = in.numel();
    const at::Tensor flat = at::empty({size() * count}, in.options());  // (size * count), rank r's at r * count
    std::vector<at::Tensor> used = outputs;
    used.insert(used.end(), {input, in, flat});
    return launch({what, std::move(used),
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclAllGather(in.data_ptr(), flat.data_ptr(), e.count, e.type, comm, stream);
                   },
                   [&] {
                     for (int r = 0; r < size(); ++r) {
                       outputs[r].copy_(flat.narrow(0, r * count, count).view(outputs[r].sizes()));
                     }
                   }});
  }

  std::shared_ptr<Work> do_gather(const std::string& what, std::vector<at::Tensor> outputs, at::Tensor input,
                                  int root) override {
    const Elements e = moved(input);
    const at::Tensor in = input.contiguous();
    std::vector<at::Tensor> buffers;
    for (const at::Tensor& t : outputs) buffers.push_back(contiguous_output(t));
    std::vector<at::Tensor> used = outputs;
    used.insert(used.end(), buffers.begin(), buffers.end());
    used.insert(used.end(), {input, in});
    return launch({what, std::move(used),
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return in_group([&](const auto& keep) {
                       for (int r = 0; r < static_cast<int>(buffers.size()); ++r) {
                         keep(ncclRecv(buffers[r].data_ptr(), e.count, e.type, r, comm, stream));
                       }
                       keep(ncclSend(in.data_ptr(), e.count, e.type, root, comm, stream));
                     });
                   },
                   copy_back(buffers, outputs)});
  }

  std::shared_ptr<Work> do_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                   int root) override {
    const Elements e = moved(output);
    std::vector<at::Tensor> ins;
    for (const at::Tensor& t : inputs) ins.push_back(t.contiguous());
    const at::Tensor out = contiguous_output(output);
    std::vector<at::Tensor> used = inputs;
    used.insert(used.end(), ins.begin(), ins.end());
    used.insert(used.end(), {output, out});
    return launch({what, std::move(used),
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return in_group([&](const auto& keep) {
                       for (int r = 0; r < static_cast<int>(ins.size()); ++r) {
                         keep(ncclSend(ins[r].data_ptr(), e.count, e.type, r, comm, stream));
                       }
                       keep(ncclRecv(out.data_ptr(), e.count, e.type, root, comm, stream));
                     });
                   },
                   copy_back({out}, {output})});
  }

  std::shared_ptr<Work> do_reduce_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                          ReduceOp op) override {
    const Elements e = reduced(output);
    std::vector<at::Tensor> pieces;
    for (const at::Tensor& t : inputs) pieces.push_back(t.reshape({-1}));
    const at::Tensor flat = at::cat(pieces);  // (size * numel), process r's part at r * numel
    const at::Tensor out = contiguous_output(output);
    return launch({what, {output, out, flat},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclReduceScatter(flat.data_ptr(), out.data_ptr(), e.count, e.type, nccl_op(op), comm,
                                              stream);
                   },
                   copy_back({out}, {output})});
  }

  std::shared_ptr<Work> do_all_to_all_single(const std::string& what, at::Tensor output, at::Tensor input) override {
    const Elements e = moved(input);
    const at::Tensor in = input.contiguous();
    const at::Tensor out = contiguous_output(output);
    return launch({what, {input, in, output, out},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     const size_t chunk = e.count / static_cast<size_t>(size());
                     const size_t bytes = in.nbytes() / static_cast<size_t>(size());
                     return in_group([&](const auto& keep) {
                       for (int r = 0; r < size(); ++r) {
                         keep(ncclSend(static_cast<const char*>(in.data_ptr()) + r * bytes, chunk, e.type, r, comm,
                                       stream));
                         keep(ncclRecv(static_cast<char*>(out.data_ptr()) + r * bytes, chunk, e.type, r, comm,
                                       stream));
                       }
                     });
                   },
                   copy_back({out}, {output})});
  }

  // Its wait() blocks the host, as PyTorch's does: code calls barrier() to line processes
  // up, not streams.
  std::shared_ptr<Work> do_barrier(const std::string& what) override {
    const at::Tensor one = at::ones({1}, at::TensorOptions().device(device()).dtype(at::kFloat));
    return launch({what, {one},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm, stream);
                   },
                   nullptr, /*blocking=*/true});
  }

  // One NCCL group call for all dtypes: one Work, one end event.
  std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                                ReduceOp op) override {
    return coalesced(what, std::move(tensors), /*sends=*/true,
                     reduced, [op](const at::Tensor& flat, Elements e, ncclComm_t comm, cudaStream_t stream) {
                       return ncclAllReduce(flat.data_ptr(), flat.data_ptr(), e.count, e.type, nccl_op(op), comm,
                                            stream);
                     });
  }

  std::shared_ptr<Work> do_broadcast_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                               int root) override {
    return coalesced(what, std::move(tensors), /*sends=*/rank() == root,
                     moved, [root](const at::Tensor& flat, Elements e, ncclComm_t comm, cudaStream_t stream) {
                       return ncclBroadcast(flat.data_ptr(), flat.data_ptr(), e.count, e.type, root, comm, stream);
                     });
  }

  std::shared_ptr<Work> do_send(const std::string& what, at::Tensor tensor, int dst, int tag) override {
    refuse_tag(what, tag);
    const Elements e = moved(tensor);
    const at::Tensor in = tensor.contiguous();
    return launch({what, {tensor, in},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclSend(in.data_ptr(), e.count, e.type, dst, comm, stream);
                   },
                   nullptr});
  }

  std::shared_ptr<Work> do_recv(const std::string& what, at::Tensor tensor, int src, int tag) override {
    refuse_tag(what, tag);
    const Elements e = moved(tensor);
    const at::Tensor out = contiguous_output(tensor);
    return launch({what, {tensor, out},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclRecv(out.data_ptr(), e.count, e.type, src, comm, stream);
                   },
                   copy_back({out}, {tensor})});
  }

 private:
  // NCCL matches a send with the peer's next recv, whatever the tag: a tag that would
  // pick another message is refused rather than ignored (PyTorch ignores it).
  static void refuse_tag(const std::string& what, int tag) {
    DATAPAR_CHECK(tag == 0, what, ": the nccl backend has no message tags (NCCL matches each send with the peer's "
                  "next recv, in issue order). Pass tag 0 and issue the messages in the order they are to match, "
                  "or use the gloo backend, which has tags.");
  }

  // One operation, as the methods above describe it to launch().
  struct Launch {
    std::string op;                   // "all_reduce(sum)", for messages
    std::vector<at::Tensor> tensors;  // every tensor used on the communication stream
    std::function<ncclResult_t(ncclComm_t, cudaStream_t)> calls;  // the NCCL call(s)
    std::function<void()> after;      // ATen copies for (d); may be empty
    bool blocking = false;            // wait() blocks the host whatever blocking_wait says
  };

  // Steps (b)-(e) of Note [Streams of an operation]; the caller did (a).
  std::shared_ptr<Work> launch(Launch operation) {
    std::lock_guard<std::mutex> lock(launch_mutex_);  // Note [One launch at a time]
    comm_->check_alive(operation.op);
    const NcclClock::time_point deadline = NcclClock::now() + options_.timeout;
    c10::cuda::CUDAGuard guard(device_);
    const bool captured = detail::stream_capturing(device());
    DATAPAR_CHECK(!captured || !(options_.blocking_wait || operation.blocking), operation.op,
                  ": a blocking wait (NcclOptions::blocking_wait, barrier()) cannot be captured in a CUDA graph: ",
                  "the host would wait for work that only a replay runs.\n---> HINT: leave blocking_wait off and ",
                  "no barrier() in a captured step.");
    ready_.record(c10::cuda::getCurrentCUDAStream(device_));  // (b)
    ready_.block(stream_);
    for (const at::Tensor& t : operation.tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    }
    comm_->enqueue(  // (c)
        operation.op, [&](ncclComm_t comm) { return operation.calls(comm, stream_.stream()); }, deadline);
    if (operation.after) {  // (d): ATen queues on the current stream, C for this scope
      c10::cuda::CUDAStreamGuard on_comm_stream(stream_);
      operation.after();
    }
    auto end = std::make_shared<at::cuda::CUDAEvent>();  // (e); cudaEventDisableTiming
    end->record(stream_);
    auto work = std::make_shared<detail::NcclWork>(comm_->describe(operation.op), device_, end,
                                                   !captured && (options_.blocking_wait || operation.blocking));
    if (captured) return work;  // Note [A collective in a CUDA graph]
    watchdog_->push(
        {work, operation.op, std::move(end), std::move(operation.tensors), deadline, trace::detail::queued()});
    return work;
  }

  // The *_coalesced operations: one flat buffer per dtype (made on the caller's stream),
  // `call` on each inside one NCCL group, the buffers copied back behind it.
  // `sends`: whether this rank's values are read (false: a broadcast's receivers);
  // `elements`: reduced or moved.
  std::shared_ptr<Work> coalesced(
      const std::string& op, std::vector<at::Tensor> tensors, bool sends, Elements (*elements)(const at::Tensor&),
      const std::function<ncclResult_t(const at::Tensor&, Elements, ncclComm_t, cudaStream_t)>& call) {
    if (tensors.empty()) return do_barrier(op);  // still one operation, as on every other rank
    std::vector<detail::FlatGroup> groups = detail::flatten_by_dtype(tensors, sends);
    std::vector<Elements> types;
    std::vector<at::Tensor> used = tensors;
    for (const detail::FlatGroup& g : groups) {
      types.push_back(elements(g.flat));
      used.push_back(g.flat);
    }
    return launch({op, std::move(used),
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return in_group([&](const auto& keep) {
                       for (size_t g = 0; g < groups.size(); ++g) keep(call(groups[g].flat, types[g], comm, stream));
                     });
                   },
                   [&] {
                     for (const detail::FlatGroup& g : groups) detail::unflatten_into(g, g.flat, tensors);
                   }});
  }

  // (d) for outputs that went through a contiguous buffer; empty when none did.
  static std::function<void()> copy_back(std::vector<at::Tensor> buffers, std::vector<at::Tensor> outputs) {
    bool any = false;
    for (size_t i = 0; i < buffers.size(); ++i) any = any || !buffers[i].is_same(outputs[i]);
    if (!any) return nullptr;
    return [buffers = std::move(buffers), outputs = std::move(outputs)] {
      for (size_t i = 0; i < buffers.size(); ++i) {
        if (!buffers[i].is_same(outputs[i])) outputs[i].copy_(buffers[i]);
      }
    };
  }

  // `nccl_store`: this group's own namespace (new_nccl_process_group).
  ncclUniqueId meet(const std::shared_ptr<Store>& nccl_store, NcclClock::time_point deadline) const {
    // Rank 0 makes the unique id; everyone checks in before the init, so that a rank that
    // never comes shows as a count of arrivals rather than as a silent NCCL init.
    ncclUniqueId id;
    if (rank() == 0) {
      const ncclResult_t made = ncclGetUniqueId(&id);
      if (made != ncclSuccess) {
        throw CommError(str_cat("ProcessGroup(nccl): ncclGetUniqueId failed on rank 0: ", ncclGetErrorString(made),
                                ". Run with NCCL_DEBUG=INFO for details."));
      }
      nccl_store->set("id", Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    }
    const Bytes bytes = nccl_store->get("id");
    DATAPAR_CHECK(bytes.size() == sizeof(id), "ProcessGroup(nccl): the store holds a malformed NCCL id.");
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<uint8_t*>(&id));
    nccl_store->add("joined", 1);
    for (;;) {
      const int64_t joined = nccl_store->add("joined", 0);
      if (joined >= size()) break;
      if (NcclClock::now() > deadline) {
        throw TimeoutError(str_cat("ProcessGroup(nccl): rank ", rank(), " waited ",
                                   std::chrono::duration<double>(options_.timeout).count(),
                                   " s for the other ranks to join; ", joined, " of ", size(),
                                   " arrived. Start every rank, or raise the timeout."));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return id;
  }

  const NcclOptions options_;
  const c10::DeviceIndex device_;
  const c10::cuda::CUDAStream stream_;  // C of Note [Streams of an operation]
  std::mutex launch_mutex_;             // Note [One launch at a time]
  at::cuda::CUDAEvent ready_;           // (b); re-recorded by each launch, under launch_mutex_
  std::unique_ptr<detail::NcclComm> comm_;
  std::unique_ptr<detail::NcclWatchdog> watchdog_;
};

}  // namespace

namespace detail {

std::shared_ptr<ProcessGroup> new_nccl_transport(const std::shared_ptr<Store>& store, int rank, int size,
                                                 const NcclOptions& options) {
  const c10::DeviceIndex device = choose_device(options.device, options.local_rank);
  return std::make_shared<ProcessGroupNccl>(store, rank, size, device, options);
}

}  // namespace detail
}  // namespace datapar
