// The NCCL backend: CUDA tensors, NCCL's collectives. Compiled only where Torch has CUDA.
//
// Streams: each group has its own CUDA stream. An operation first makes that stream wait
// for the work already queued on the default stream (which produced the inputs), then
// runs the NCCL call there, then records an event. Work::wait() blocks until the event has
// completed (or the timeout ends, which aborts the communicator so nothing hangs), so the
// results are visible to whatever runs next. Tensors are held by the Work until then,
// which keeps the caching allocator from handing their memory to someone else.
//
// Operations are launched by the calling thread, in call order (NCCL matches them by
// order); a runner thread only waits for their events. Only the default stream is
// synchronised with: code that fills tensors on other streams must synchronise first.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "datapar/error.h"
#include "datapar/process_group/nccl.h"
#include "datapar/rendezvous/prefix_store.h"
#include "process_group/checks.h"
#include "process_group/coalesce.h"
#include "process_group/ordered_runner.h"

namespace datapar {
namespace {

using detail::str_cat;

void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw CommError(str_cat("nccl backend: ", what, ": ", cudaGetErrorString(result)));
}

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
    default: throw InvalidArgumentError(str_cat("the nccl backend does not move ", type, " tensors."));
  }
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

class ProcessGroupNccl : public ProcessGroup {
 public:
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, NcclOptions options)
      : ProcessGroup(rank, size), options_(options) {
    DATAPAR_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroup(nccl): rank ", rank, " is outside [0, ", size,
                  ").");
    DATAPAR_CHECK(store != nullptr, "ProcessGroup(nccl): the store is null.");
    // c10's count is 0, not an error, on a machine without a GPU or driver.
    const int devices = c10::cuda::device_count();
    DATAPAR_CHECK(devices > 0, "ProcessGroup(nccl): no CUDA device is visible. Use the gloo or mpi backend on CPUs.");
    device_ = options_.device >= 0 ? options_.device : rank % devices;
    DATAPAR_CHECK(device_ < devices, "ProcessGroup(nccl): device cuda:", device_, " does not exist (", devices,
                  " visible).");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");

    // Rank 0 makes the unique id; everyone checks in before ncclCommInitRank, which
    // would otherwise block forever for a rank that never comes.
    auto nccl_store = std::make_shared<PrefixStore>("nccl", store);
    ncclUniqueId id;
    if (rank == 0) {
      if (ncclGetUniqueId(&id) != ncclSuccess) throw CommError("ProcessGroup(nccl): ncclGetUniqueId failed.");
      nccl_store->set("id", Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    }
    const Bytes bytes = nccl_store->get("id");
    DATAPAR_CHECK(bytes.size() == sizeof(id), "ProcessGroup(nccl): the store holds a malformed NCCL id.");
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<uint8_t*>(&id));
    nccl_store->add("joined", 1);
    for (auto deadline = std::chrono::steady_clock::now() + options_.timeout;;) {
      if (nccl_store->add("joined", 0) >= size) break;
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(str_cat("ProcessGroup(nccl): rank ", rank, " waited ", options_.timeout.count(),
                                   " ms for the other ranks to join; ", nccl_store->add("joined", 0), " of ", size,
                                   " arrived."));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const ncclResult_t init = ncclCommInitRank(&comm_, size, id, rank);
    if (init != ncclSuccess) {
      throw CommError(str_cat("ProcessGroup(nccl): ncclCommInitRank failed on rank ", rank, ": ",
                              ncclGetErrorString(init)));
    }
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  ~ProcessGroupNccl() override {
    runner_.reset();  // waits for what is in flight
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }

  std::shared_ptr<Work> all_reduce(at::Tensor tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce");
    return launch(str_cat("all_reduce(", to_string(op), ")"), {tensor}, [&](const std::vector<at::Tensor>& in) {
      return ncclAllReduce(in[0].data_ptr(), in[0].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()),
                           nccl_op(op), comm_, stream_);
    });
  }

  std::shared_ptr<Work> broadcast(at::Tensor tensor, int root) override {
    check_tensor(tensor, "broadcast");
    check_root(root, "broadcast");
    return launch(str_cat("broadcast(root ", root, ")"), {tensor}, [&](const std::vector<at::Tensor>& in) {
      return ncclBroadcast(in[0].data_ptr(), in[0].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), root,
                           comm_, stream_);
    });
  }

  std::shared_ptr<Work> reduce(at::Tensor tensor, int root, ReduceOp op) override {
    check_tensor(tensor, "reduce");
    check_root(root, "reduce");
    return launch(str_cat("reduce(", to_string(op), ", root ", root, ")"), {tensor},
                  [&](const std::vector<at::Tensor>& in) {
                    return ncclReduce(in[0].data_ptr(), in[0].data_ptr(), in[0].numel(),
                                      nccl_type(in[0].scalar_type()), nccl_op(op), root, comm_, stream_);
                  });
  }

  std::shared_ptr<Work> all_gather(std::vector<at::Tensor> outputs, at::Tensor input) override {
    check_tensor(input, "all_gather");
    check_like(outputs, input, "all_gather");
    at::Tensor flat = at::empty({size() * input.numel()}, input.options());
    auto work = launch("all_gather", {input, flat}, [&](const std::vector<at::Tensor>& in) {
      return ncclAllGather(in[0].data_ptr(), in[1].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), comm_,
                           stream_);
    });
    copy_out_after(flat, outputs);
    return work;
  }

  std::shared_ptr<Work> gather(std::vector<at::Tensor> outputs, at::Tensor input, int root) override {
    check_tensor(input, "gather");
    check_root(root, "gather");
    if (rank() == root) check_like(outputs, input, "gather");
    std::vector<at::Tensor> held{input};
    for (const at::Tensor& t : outputs) held.push_back(t);
    return launch(str_cat("gather(root ", root, ")"), held, [&](const std::vector<at::Tensor>& in) {
      ncclGroupStart();
      if (rank() == root) {
        for (int r = 0; r < size(); ++r) {
          ncclRecv(in[r + 1].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), r, comm_, stream_);
        }
      }
      ncclSend(in[0].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), root, comm_, stream_);
      return ncclGroupEnd();
    });
  }

  std::shared_ptr<Work> scatter(at::Tensor output, std::vector<at::Tensor> inputs, int root) override {
    check_tensor(output, "scatter");
    check_root(root, "scatter");
    if (rank() == root) check_like(inputs, output, "scatter");
    std::vector<at::Tensor> held{output};
    for (const at::Tensor& t : inputs) held.push_back(t);
    return launch(str_cat("scatter(root ", root, ")"), held, [&](const std::vector<at::Tensor>& in) {
      ncclGroupStart();
      if (rank() == root) {
        for (int r = 0; r < size(); ++r) {
          ncclSend(in[r + 1].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), r, comm_, stream_);
        }
      }
      ncclRecv(in[0].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), root, comm_, stream_);
      return ncclGroupEnd();
    });
  }

  std::shared_ptr<Work> reduce_scatter(at::Tensor output, std::vector<at::Tensor> inputs, ReduceOp op) override {
    check_tensor(output, "reduce_scatter");
    check_like(inputs, output, "reduce_scatter");
    at::Tensor flat = at::cat(flattened(inputs));
    return launch(str_cat("reduce_scatter(", to_string(op), ")"), {output, flat},
                  [&](const std::vector<at::Tensor>& in) {
                    return ncclReduceScatter(in[1].data_ptr(), in[0].data_ptr(), in[0].numel(),
                                             nccl_type(in[0].scalar_type()), nccl_op(op), comm_, stream_);
                  });
  }

  std::shared_ptr<Work> all_to_all(at::Tensor output, at::Tensor input) override {
    check_tensor(input, "all_to_all");
    check_tensor(output, "all_to_all");
    detail::check_all_to_all(output, input, size());
    return launch("all_to_all", {input, output}, [&](const std::vector<at::Tensor>& in) {
      const int64_t chunk = in[0].numel() / size();
      const size_t bytes = static_cast<size_t>(chunk) * in[0].element_size();
      ncclGroupStart();
      for (int r = 0; r < size(); ++r) {
        ncclSend(static_cast<char*>(in[0].data_ptr()) + r * bytes, chunk, nccl_type(in[0].scalar_type()), r, comm_,
                 stream_);
        ncclRecv(static_cast<char*>(in[1].data_ptr()) + r * bytes, chunk, nccl_type(in[0].scalar_type()), r, comm_,
                 stream_);
      }
      return ncclGroupEnd();
    });
  }

  std::shared_ptr<Work> barrier() override {
    at::Tensor one = at::ones({1}, at::TensorOptions().device(at::kCUDA, device_));
    return all_reduce(one, ReduceOp::kSum);
  }

  std::shared_ptr<Work> all_reduce_coalesced(std::vector<at::Tensor> tensors, ReduceOp op) override {
    for (const at::Tensor& t : tensors) check_tensor(t, "all_reduce_coalesced");
    std::shared_ptr<Work> last;
    for (const detail::FlatGroup& group : detail::flatten_by_dtype(tensors)) {
      last = all_reduce(group.flat, op);
      detail::unflatten_into(group, group.flat, tensors);  // queued behind the collective
    }
    return last ? last : barrier();
  }

  std::shared_ptr<Work> broadcast_coalesced(std::vector<at::Tensor> tensors, int root) override {
    for (const at::Tensor& t : tensors) check_tensor(t, "broadcast_coalesced");
    std::shared_ptr<Work> last;
    for (const detail::FlatGroup& group : detail::flatten_by_dtype(tensors)) {
      last = broadcast(group.flat, root);
      detail::unflatten_into(group, group.flat, tensors);  // queued behind the collective
    }
    return last ? last : barrier();
  }

  std::shared_ptr<Work> send(at::Tensor tensor, int dst, int tag) override {
    check_tensor(tensor, "send");
    detail::check_peer(dst, rank(), size(), tag, "send");
    return launch(str_cat("send(to ", dst, ")"), {tensor}, [&](const std::vector<at::Tensor>& in) {
      return ncclSend(in[0].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), dst, comm_, stream_);
    });
  }

  std::shared_ptr<Work> recv(at::Tensor tensor, int src, int tag) override {
    check_tensor(tensor, "recv");
    detail::check_peer(src, rank(), size(), tag, "recv");
    return launch(str_cat("recv(from ", src, ")"), {tensor}, [&](const std::vector<at::Tensor>& in) {
      return ncclRecv(in[0].data_ptr(), in[0].numel(), nccl_type(in[0].scalar_type()), src, comm_, stream_);
    });
  }

 private:
  // Runs `call` on contiguous versions of `tensors` on the group's stream, after the
  // default stream's work; copies non-contiguous ones back after it; returns its Work.
  template <typename Call>
  std::shared_ptr<Work> launch(const std::string& what, const std::vector<at::Tensor>& tensors, Call&& call) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    std::vector<at::Tensor> contiguous;
    for (const at::Tensor& t : tensors) contiguous.push_back(t.contiguous());
    cudaEvent_t ready = nullptr, done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready, cudaStreamLegacy), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    const ncclResult_t result = call(contiguous);
    if (result != ncclSuccess) {
      cudaEventDestroy(ready);
      cudaEventDestroy(done);
      throw CommError(str_cat(what, " on rank ", rank(), " of ", size(), " (nccl) failed: ", ncclGetErrorString(result),
                              " ", ncclGetLastError(comm_)));
    }
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    // Results reach non-contiguous tensors by copies queued behind the collective.
    check_cuda(cudaStreamWaitEvent(cudaStreamLegacy, done, 0), "cudaStreamWaitEvent");
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!contiguous[i].is_same(tensors[i])) tensors[i].copy_(contiguous[i]);
    }
    const auto timeout = options_.timeout;
    ncclComm_t comm = comm_;
    return runner_->push(str_cat(what, " on rank ", rank(), " of ", size(), " (nccl)"),
                         [contiguous, ready, done, timeout, comm] {
                           const auto deadline = std::chrono::steady_clock::now() + timeout;
                           cudaError_t state;
                           while ((state = cudaEventQuery(done)) == cudaErrorNotReady) {
                             ncclResult_t async = ncclSuccess;
                             ncclCommGetAsyncError(comm, &async);
                             if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
                               ncclCommAbort(comm);  // unblocks the stream; the group is unusable now
                               throw TimeoutError(str_cat("did not complete within ", timeout.count(),
                                                          " ms (", ncclGetErrorString(async),
                                                          "); a peer is missing or failed. The group was aborted."));
                             }
                             std::this_thread::sleep_for(std::chrono::microseconds(50));
                           }
                           cudaEventDestroy(ready);
                           cudaEventDestroy(done);
                           check_cuda(state, "cudaEventQuery");
                         });
  }

  void copy_out_after(const at::Tensor& flat, std::vector<at::Tensor>& outputs) {
    int64_t offset = 0;
    for (at::Tensor& out : outputs) {
      out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
      offset += out.numel();
    }
  }

  static std::vector<at::Tensor> flattened(const std::vector<at::Tensor>& list) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : list) out.push_back(t.reshape({-1}));
    return out;
  }

  void check_tensor(const at::Tensor& tensor, const char* what) const {
    DATAPAR_CHECK(tensor.defined(), what, ": the tensor is undefined.");
    DATAPAR_CHECK(tensor.is_cuda() && tensor.device().index() == device_, what,
                  ": the nccl backend takes tensors on this rank's device cuda:", device_, ", not ", tensor.device(),
                  ". Use the gloo or mpi backend for CPU tensors.");
  }

  void check_root(int root, const char* what) const { detail::check_root(root, size(), what); }

  void check_like(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what) const {
    DATAPAR_CHECK(static_cast<int>(list.size()) == size(), what, ": ", list.size(), " tensors for ", size(),
                  " processes; give one per process.");
    for (const at::Tensor& t : list) {
      check_tensor(t, what);
      DATAPAR_CHECK(t.sizes() == like.sizes() && t.scalar_type() == like.scalar_type(), what,
                    ": every tensor must have shape ", like.sizes(), " and type ", like.scalar_type(), ".");
    }
  }

  NcclOptions options_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<detail::OrderedRunner> runner_ = std::make_unique<detail::OrderedRunner>("nccl");
};

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     NcclOptions options) {
  return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, options);
}

}  // namespace datapar
