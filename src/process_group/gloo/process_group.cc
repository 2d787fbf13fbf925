// The Gloo backend: CPU tensors over Gloo's TCP transport, with Gloo's own algorithms
// (ring all-reduce, one-to-all broadcast, ...) moving the bytes.
//
// Our Store is adapted to Gloo's rendezvous Store (under a "gloo/" prefix) to connect the
// full mesh. Operations are queued to one thread per group and run in issue order: Gloo
// matches collectives by order, and one group's collectives must never interleave.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>
#include <gloo/math.h>
#include <gloo/types.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/pair.h>
#include <dlfcn.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "datapar/error.h"
#include "datapar/process_group/gloo.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/prefix_store.h"
#include "tensor/coalesce.h"
#include "collectives/aborted.h"
#include "process_group/gloo/socket_shutdown.h"
#include "process_group/gloo/transport.h"
#include "process_group/ordered_runner.h"

namespace datapar {
namespace {

using detail::str_cat;
using detail::unflatten;

// Gloo's rendezvous talks to our Store through this. It keeps what gloo reads under the
// ranks' numbers: each rank's pair addresses (Note [Aborting a gloo group]).
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<datapar::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(key);
    std::vector<char> bytes(value.begin(), value.end());
    if (!key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      read_[std::stoi(key)] = bytes;
    }
    return bytes;
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }
  // Rank r's pair addresses as gloo read them, by r.
  const std::map<int, std::vector<char>>& read() const { return read_; }

 private:
  std::shared_ptr<datapar::Store> store_;
  std::map<int, std::vector<char>> read_;
};

// The socket address at the start of a gloo TCP address's bytes (tcp::Address::bytes():
// its trivially copyable sockaddr_storage, then a sequence number).
bool socket_address(const std::vector<char>& bytes, size_t offset, sockaddr_storage* out) {
  if (offset + sizeof(sockaddr_storage) > bytes.size()) return false;
  std::memcpy(out, bytes.data() + offset, sizeof(sockaddr_storage));
  return out->ss_family == AF_INET || out->ss_family == AF_INET6;
}

// A reduce function for Gloo over elements of type T.
template <typename T>
gloo::AllreduceOptions::Func reducer(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);  // the untyped overloads
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<Fn>(&gloo::sum<T>);
    case ReduceOp::kMin: return static_cast<Fn>(&gloo::min<T>);
    case ReduceOp::kMax: return static_cast<Fn>(&gloo::max<T>);
    case ReduceOp::kProduct: return static_cast<Fn>(&gloo::product<T>);
  }
  return static_cast<Fn>(&gloo::sum<T>);
}

class ProcessGroupGloo : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options)
      : ProcessGroup(rank, size, options.timeout) {
    DATAPAR_CHECK(store != nullptr, "ProcessGroup(gloo): the store is null.");
    gloo::transport::tcp::attr attr;
    if (options.hostname.empty()) {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      attr.hostname = host;
    } else {
      attr.hostname = options.hostname;
    }
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context_->setTimeout(timeout());
      GlooStore gloo_store(std::make_shared<PrefixStore>("gloo", store));
      context_->connectFullMesh(gloo_store, device_);
      learn_pair_sockets(gloo_store.read());
      roll_store_ = std::make_shared<PrefixStore>("gloo-failed", store);
    } catch (const datapar::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(str_cat("ProcessGroup(gloo): rank ", rank, " of ", size, " could not connect to the others: ",
                              e.what(), ". Check that every process can reach ", attr.hostname,
                              " (GlooOptions::hostname) and that all of them started."));
    }
  }

  std::string backend() const override { return "gloo"; }

 protected:
  // Note [Aborting a gloo group]
  // Gloo (as Debian ships it) has no abort, and a thread blocked in one of its operations
  // waits for its data or the timeout; closing a pair (its one public lever) does not wake
  // it. What wakes it is its connection ending: then gloo's own thread fails every
  // operation pending on the pair at once. So abort shuts the group's sockets down (not
  // closes: gloo owns them). Gloo does not hand them out, but they are known by address:
  // each pair's socket is either the one gloo accepted on the pair's listening address
  // (pair->address()), or the one it connected to the peer's (what the peer published in
  // the store, which GlooStore kept as gloo read it). A TCP connection's two addresses are
  // unique on the machine while it exists, so no other socket matches. The peers see the
  // connections end too, and their operations with this process fail at once.
  void learn_pair_sockets(const std::map<int, std::vector<char>>& published) {
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      const std::vector<char> own = context_->getPair(peer)->address().bytes();
      sockaddr_storage address{};
      if (socket_address(own, 0, &address)) pair_locals_.push_back(address);
      // The peer published one address per other rank, in rank order: ours is at our
      // rank, less one past the peer's own.
      const auto it = published.find(peer);
      if (it == published.end() || size() < 2 || it->second.size() % static_cast<size_t>(size() - 1) != 0) continue;
      const size_t each = it->second.size() / static_cast<size_t>(size() - 1);
      const size_t index = static_cast<size_t>(rank() < peer ? rank() : rank() - 1);
      if (socket_address(it->second, index * each, &address)) pair_remotes_.push_back(address);
    }
  }

  void do_abort() override { detail::shut_down_sockets(pair_locals_, pair_remotes_); }

  std::shared_ptr<Work> do_all_reduce(const std::string& what, at::Tensor tensor, ReduceOp op) override {
    return enqueue(what, [this, tensor, op]() mutable {
      at::Tensor buffer = reducible(tensor);
      all_reduce_in_place(buffer, op);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_reduce(const std::string& what, at::Tensor tensor, int root, ReduceOp op) override {
    return enqueue(what, [this, tensor, root, op]() mutable {
      at::Tensor buffer = reducible(tensor);
      with_reducer(buffer, op, [&](auto* data, size_t count, gloo::ReduceOptions::Func fn) {
        gloo::ReduceOptions opts(context_);
        opts.setTimeout(timeout());
        opts.setRoot(root);
        opts.setInput(data, count);
        opts.setOutput(data, count);
        opts.setReduceFunction(fn);
        gloo::reduce(opts);
      });
      if (rank() != root) return;
      if (op == ReduceOp::kAvg) buffer.div_(size());
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_all_gather(const std::string& what, std::vector<at::Tensor> outputs,
                                      at::Tensor input) override {
    return enqueue(what, [this, outputs, input]() mutable {
      const at::Tensor in = input.contiguous();
      at::Tensor flat = at::empty({size() * in.numel()}, in.options());  // (size * numel,) rank order
      gloo::AllgatherOptions opts(context_);
      opts.setTimeout(timeout());
      opts.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
      opts.setOutput(static_cast<uint8_t*>(flat.data_ptr()), flat.nbytes());
      gloo::allgather(opts);
      unflatten(flat, outputs);
    });
  }

  std::shared_ptr<Work> do_gather(const std::string& what, std::vector<at::Tensor> outputs, at::Tensor input,
                                  int root) override {
    return enqueue(what, [this, outputs, input, root]() mutable {
      const at::Tensor in = input.contiguous();
      gloo::GatherOptions opts(context_);
      opts.setTimeout(timeout());
      opts.setRoot(root);
      opts.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
      at::Tensor flat;
      if (rank() == root) {
        flat = at::empty({size() * in.numel()}, in.options());
        opts.setOutput(static_cast<uint8_t*>(flat.data_ptr()), flat.nbytes());
      }
      gloo::gather(opts);
      if (rank() == root) unflatten(flat, outputs);
    });
  }

  std::shared_ptr<Work> do_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                   int root) override {
    return enqueue(what, [this, output, inputs, root]() mutable {
      at::Tensor out = output.contiguous();
      gloo::ScatterOptions opts(context_);
      opts.setTimeout(timeout());
      opts.setRoot(root);
      std::vector<at::Tensor> contiguous;
      if (rank() == root) {
        std::vector<uint8_t*> pointers;
        for (const at::Tensor& t : inputs) {
          contiguous.push_back(t.contiguous());
          pointers.push_back(static_cast<uint8_t*>(contiguous.back().data_ptr()));
        }
        opts.setInputs(pointers, out.nbytes());
      }
      opts.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      gloo::scatter(opts);
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  std::shared_ptr<Work> do_reduce_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                          ReduceOp op) override {
    // All-reduce of the concatenation, then each process keeps its part: correct on every
    // world size; a bandwidth-optimal ring reduce-scatter can replace it.
    return enqueue(what, [this, output, inputs, op]() mutable {
      std::vector<at::Tensor> flat_inputs;
      for (const at::Tensor& t : inputs) flat_inputs.push_back(t.reshape({-1}));
      at::Tensor buffer = reducible(at::cat(flat_inputs));  // (size * numel,)
      all_reduce_in_place(buffer, op);
      output.copy_(buffer.narrow(0, rank() * output.numel(), output.numel()).view_as(output));
    });
  }

  std::shared_ptr<Work> do_all_to_all_single(const std::string& what, at::Tensor output, at::Tensor input) override {
    return enqueue(what, [this, output, input]() mutable {
      const at::Tensor in = input.contiguous();
      at::Tensor out = output.contiguous();
      gloo::AlltoallOptions opts(context_);
      opts.setTimeout(timeout());
      opts.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      gloo::alltoall(opts);
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  std::shared_ptr<Work> do_broadcast(const std::string& what, at::Tensor tensor, int root) override {
    return enqueue(what, [this, tensor, root]() mutable {
      at::Tensor buffer = tensor.contiguous();
      gloo::BroadcastOptions opts(context_);
      opts.setTimeout(timeout());
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(buffer.data_ptr()), buffer.nbytes());
      gloo::broadcast(opts);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_barrier(const std::string& what) override {
    return enqueue(what, [this] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    });
  }

  std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                                ReduceOp op) override {
    return enqueue(what, [this, tensors, op]() mutable {
      for (const detail::FlatGroup& group : detail::flatten_by_dtype(tensors)) {
        at::Tensor buffer = reducible(group.flat);
        all_reduce_in_place(buffer, op);
        detail::unflatten_into(group, buffer, tensors);
      }
    });
  }

  std::shared_ptr<Work> do_broadcast_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                               int root) override {
    return enqueue(what, [this, tensors, root]() mutable {
      for (const detail::FlatGroup& group : detail::flatten_by_dtype(tensors, /*copy_values=*/rank() == root)) {
        gloo::BroadcastOptions opts(context_);
        opts.setTimeout(timeout());
        opts.setRoot(root);
        opts.setOutput(static_cast<uint8_t*>(group.flat.data_ptr()), group.flat.nbytes());
        gloo::broadcast(opts);
        if (rank() != root) detail::unflatten_into(group, group.flat, tensors);
      }
    });
  }

  std::shared_ptr<Work> do_send(const std::string& what, at::Tensor tensor, int dst, int tag) override {
    const at::Tensor buffer = tensor.contiguous();
    std::shared_ptr<gloo::transport::UnboundBuffer> unbound =
        context_->createUnboundBuffer(buffer.data_ptr(), buffer.nbytes());
    unbound->send(dst, p2p_slot(tag));
    return p2p_.push(describe(what), [this, what, buffer, unbound] {
      wait_p2p(what, [&] { return unbound->waitSend(timeout()); });
    });
  }

  std::shared_ptr<Work> do_recv(const std::string& what, at::Tensor tensor, int src, int tag) override {
    at::Tensor buffer = tensor.contiguous();
    std::shared_ptr<gloo::transport::UnboundBuffer> unbound =
        context_->createUnboundBuffer(buffer.data_ptr(), buffer.nbytes());
    unbound->recv(src, p2p_slot(tag));
    return p2p_.push(describe(what), [this, what, tensor, buffer, unbound]() mutable {
      wait_p2p(what, [&] { return unbound->waitRecv(timeout()); });
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

 private:
  // Waits for a send or recv: `wait` returns false when gloo abandoned it.
  template <typename Wait>
  void wait_p2p(const std::string& what, Wait&& wait) {
    bool done = false;
    try {
      done = wait();
    } catch (const std::exception&) {
      if (aborted()) throw CommError(detail::aborted_message(describe(what)));
      throw;
    }
    if (!done) throw CommError(aborted() ? detail::aborted_message(describe(what)) : describe(what) + " was abandoned.");
  }

  // Point-to-point messages use their own slot range, apart from every collective's.
  static uint64_t p2p_slot(int tag) { return gloo::Slot::build(kP2pSlotPrefix, static_cast<uint32_t>(tag)); }
  static constexpr uint8_t kP2pSlotPrefix = 0x40;

  // All-reduces a contiguous, reducible buffer in place (avg: the sum divided by size()).
  void all_reduce_in_place(at::Tensor& buffer, ReduceOp op) {
    with_reducer(buffer, op, [&](auto* data, size_t count, gloo::AllreduceOptions::Func fn) {
      gloo::AllreduceOptions opts(context_);
      opts.setTimeout(timeout());
      opts.setOutput(data, count);
      opts.setReduceFunction(fn);
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::kAvg) buffer.div_(size());
  }

  // A contiguous tensor Gloo can reduce.
  static at::Tensor reducible(const at::Tensor& tensor) { return tensor.contiguous(); }

  // Calls run(data, count, reduce function) with buffer's elements typed for Gloo.
  template <typename Run>
  static void with_reducer(at::Tensor& buffer, ReduceOp op, Run&& run) {
    const size_t n = static_cast<size_t>(buffer.numel());
    switch (buffer.scalar_type()) {
      case at::kFloat: return run(buffer.data_ptr<float>(), n, reducer<float>(op));
      case at::kDouble: return run(buffer.data_ptr<double>(), n, reducer<double>(op));
      case at::kInt: return run(buffer.data_ptr<int32_t>(), n, reducer<int32_t>(op));
      case at::kLong: return run(buffer.data_ptr<int64_t>(), n, reducer<int64_t>(op));
      case at::kHalf: return run(static_cast<gloo::float16*>(buffer.data_ptr()), n, reducer<gloo::float16>(op));
      // Gloo has no bfloat16: c10's type brings the arithmetic, so it travels as 2 bytes.
      case at::kBFloat16: return run(buffer.data_ptr<c10::BFloat16>(), n, reducer<c10::BFloat16>(op));
      default:
        throw InvalidArgumentError(str_cat("reductions of ", buffer.scalar_type(), " tensors are not supported."));
    }
  }

  // Runs `op` on the group's thread in issue order. Gloo reports a dead peer as an
  // exception naming its address; the error names the ranks (roll_call()).
  std::shared_ptr<Work> enqueue(const std::string& what, std::function<void()> op) {
    const uint64_t seq = issued_++;
    return collectives_.push(describe(what), [this, seq, what, op = std::move(op)] {
      if (aborted()) throw CommError(detail::aborted_message(describe(what)));
      try {
        op();
      } catch (const datapar::Error&) {
        throw;
      } catch (const std::exception& e) {
        if (aborted()) throw CommError(detail::aborted_message(describe(what)));
        throw CommError(str_cat(describe(what), " failed: ", e.what(), ". ", roll_call(seq),
                                " Rebuild the process group (e.g. restart the job from a checkpoint)."));
      }
    });
  }

  // Note [Naming the dead peer]: a collective that failed because a peer died fails on
  // every survivor (their connections to it close), at the same collective, since every
  // rank issues them in the same order. Each survivor marks collective `seq` as failed in
  // the store, then waits kRollCallWindow for the others' marks: the ranks that never mark
  // it are the ones that exited (or hang, or lag behind). Without a store, rank 0 (which
  // serves it) is the one gone.
  // Called on the collectives' thread only; after the first failure the group is broken
  // and later operations repeat its finding instead of waiting again.
  std::string roll_call(uint64_t seq) {
    if (!roll_call_result_.empty()) return roll_call_result_;
    roll_call_result_ = take_roll_call(seq);
    return roll_call_result_;
  }

  std::string take_roll_call(uint64_t seq) const {
    static constexpr auto kRollCallWindow = std::chrono::seconds(3);
    const std::string prefix = str_cat(seq, "/");
    std::vector<int> missing;
    try {
      // A connection of its own whose calls wait a few seconds: with rank 0 stopped, the
      // job's connection would wait the store's whole timeout before saying so.
      std::shared_ptr<Store> store = roll_store_->clone(kRollCallWindow);
      if (!store) store = roll_store_;
      store->set(prefix + std::to_string(rank()), Bytes{1});
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) missing.push_back(r);
      }
      const auto deadline = std::chrono::steady_clock::now() + kRollCallWindow;
      while (!missing.empty() && std::chrono::steady_clock::now() < deadline) {
        missing.erase(std::remove_if(missing.begin(), missing.end(),
                                     [&](int r) { return store->check({prefix + std::to_string(r)}); }),
                      missing.end());
        if (!missing.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (const std::exception& e) {
      return str_cat("The job's store does not answer either (", e.what(), "): rank 0, which serves it, has exited, ",
                     "is stopped or is hung.");
    }
    if (missing.empty()) return "Every other rank saw this operation fail too (a network failure?).";
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return str_cat(missing.size() == 1 ? "Rank " : "Ranks ", ranks, " did not report this failure within ",
                   kRollCallWindow.count(), " s: probably exited (or hung, or behind the others).");
  }

  std::shared_ptr<Store> roll_store_;  // where survivors of a failure report (roll_call())
  std::vector<sockaddr_storage> pair_locals_;   // the pairs' listening addresses (do_abort)
  std::vector<sockaddr_storage> pair_remotes_;  // the peers' listening addresses for us
  std::atomic<uint64_t> issued_{0};    // collectives issued, numbered alike on every rank
  std::string roll_call_result_;       // the first failure's finding (collectives' thread only)
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  // Declared last: destroyed first, so queued operations finish while the context lives.
  detail::OrderedRunner collectives_{"gloo collectives"};
  // Point-to-point operations are posted at once; this thread only waits for them, in order.
  detail::OrderedRunner p2p_{"gloo send/recv"};
};

}  // namespace

namespace detail {

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                      GlooOptions options) {
  return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, std::move(options));
}

std::string gloo_library_of_this_backend() {
  // The address of a gloo function as this file's code calls it: the dynamic linker's choice.
  using Allreduce = void (*)(const gloo::AllreduceOptions&);
  const Allreduce allreduce = &gloo::allreduce;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(allreduce), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace detail
}  // namespace datapar
