// The MPI backend: CPU tensors through an MPI library's own collectives, for processes that
// mpirun (or srun) connected. Within a machine the factory puts the shared-memory layer over
// it (src/process_group/shared_memory_group.h), as over Gloo.
//
// A group owns one communicator (a duplicate of MPI_COMM_WORLD, or a subset of it) that
// returns errors instead of aborting. Collectives run in issue order on the group's
// OrderedRunner thread as non-blocking MPI calls polled to completion (Note [Polling] in
// runtime.cc), so each ends by the group's timeout. send/recv are posted at once from the
// caller's thread (MPI_THREAD_MULTIPLE) and waited for, in order, on a second thread.
// Not here: CUDA tensors, and surviving a dead peer: mpirun ends the whole job then.
#include "process_group/mpi/process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/mpi.h"
#include "datapar/process_group/process_group.h"
#include "tensor/coalesce.h"
#include "process_group/mpi/ring.h"
#include "process_group/mpi/runtime.h"
#include "process_group/mpi/types.h"
#include "process_group/ordered_runner.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;
using detail::str_cat;
using detail::mpi::check_reducible;
using detail::mpi::moved;
using detail::mpi::Moved;
using detail::mpi::mpi_count;
using detail::mpi::reduce_op;
using detail::mpi::reduce_type;
using detail::mpi::reducible;
using detail::unflatten;
namespace mpi = detail::mpi;

double seconds(std::chrono::milliseconds d) { return std::chrono::duration<double>(d).count(); }

// Owns a communicator. Declared before the runners, so it is freed after they stopped;
// not freed once MPI is finalised (the program is exiting), nor when a collective on it was
// abandoned: MPI cannot cancel one, it stays posted and completes once the peers post
// theirs, and Open MPI then progresses it on the communicator, freed or not (a crash in
// MPI_Test of any later call, seen with an abandoned MPI_Ireduce).
class Communicator {
 public:
  explicit Communicator(MPI_Comm comm) : comm_(comm) {}
  ~Communicator() {
    if (mpi::finalized() || abandoned_) return;
    try {
      mpi::MpiUse use("MPI_Comm_free");
      MPI_Comm_free(&comm_);
    } catch (const Error&) {
      // MPI is finalising: nothing to free any more.
    }
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  MPI_Comm get() const { return comm_; }
  // A collective on it was abandoned (from the runner's thread, which stops before the
  // destructor runs).
  void abandon() { abandoned_ = true; }

 private:
  MPI_Comm comm_;
  bool abandoned_ = false;
};

// The shared-memory layer's setup over MPI itself (an MPI group may have no store).
class MpiExchange final : public detail::shm::Exchange {
 public:
  // `comm`: outlives this.
  MpiExchange(Communicator& comm, std::string what) : comm_(comm), what_(std::move(what)) {}

  std::vector<std::string> all_gather(const std::string& mine, detail::shm::Clock::time_point deadline) override {
    int size = 0;
    MPI_Comm_size(comm_.get(), &size);
    // On the heap: a collective abandoned at the deadline may still write into it.
    auto blocks = std::make_unique<std::vector<char>>(static_cast<size_t>(size + 1) * kBlock, '\0');
    DATAPAR_INTERNAL_ASSERT(mine.size() < kBlock);
    std::memcpy(blocks->data(), mine.data(), mine.size());
    MPI_Request request = MPI_REQUEST_NULL;
    mpi::check(MPI_Iallgather(blocks->data(), kBlock, MPI_CHAR, blocks->data() + kBlock, kBlock, MPI_CHAR,
                              comm_.get(), &request),
               what_);
    if (!mpi::wait(request, deadline, what_)) {
      static_cast<void>(blocks.release());  // leaked: the abandoned collective may still write into it
      comm_.abandon();
      throw TimeoutError(str_cat(what_, ": the other members stopped answering while their shared memory was set up."));
    }
    std::vector<std::string> texts;
    for (int r = 0; r < size; ++r) texts.emplace_back(blocks->data() + (r + 1) * kBlock);
    return texts;
  }

 private:
  static constexpr int kBlock = 256;
  static_assert(detail::shm::Exchange::kMaxText < kBlock, "a text and its terminating zero fit a block");
  Communicator& comm_;
  std::string what_;
};

class ProcessGroupMpi : public ProcessGroup {
 public:
  // `comm`: the group's communicator; `ring_comm`: a duplicate for the ring all-reduce.
  ProcessGroupMpi(MPI_Comm comm, MPI_Comm ring_comm, int rank, int size, std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size, timeout), comm_(comm), ring_comm_(ring_comm), ring_(ring_comm) {
    mpi::note_group_timeout(timeout);
  }

  std::string backend() const override { return "mpi"; }

  // The members' exchange for the shared-memory layer's setup: over the ring's
  // communicator, before the ring's first use.
  std::unique_ptr<detail::shm::Exchange> setup_exchange(std::string what) {
    return std::make_unique<MpiExchange>(ring_comm_, std::move(what));
  }

 protected:
  std::shared_ptr<Work> do_all_reduce(const std::string& what, at::Tensor tensor, ReduceOp op) override {
    check_reducible(tensor, "all_reduce");
    return enqueue(what, [this, tensor, op](const std::string& what) mutable {
      at::Tensor buffer = reducible(tensor);
      all_reduce_in_place(buffer, op, what);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_reduce(const std::string& what, at::Tensor tensor, int root, ReduceOp op) override {
    check_reducible(tensor, "reduce");
    return enqueue(what, [this, tensor, root, op](const std::string& what) mutable {
      at::Tensor buffer = reducible(tensor);
      const int count = mpi_count(buffer.numel(), what);
      run(what, {buffer}, [&](MPI_Request* request) {
        void* data = buffer.data_ptr();
        return rank() == root ? MPI_Ireduce(MPI_IN_PLACE, data, count, reduce_type(buffer),
                                            reduce_op(op), root, comm(), request)
                              : MPI_Ireduce(data, nullptr, count, reduce_type(buffer), reduce_op(op),
                                            root, comm(), request);
      });
      if (rank() != root) return;
      if (op == ReduceOp::kAvg) buffer.div_(size());
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_all_gather(const std::string& what, std::vector<at::Tensor> outputs,
                                      at::Tensor input) override {
    return enqueue(what, [this, outputs, input](const std::string& what) mutable {
      const at::Tensor in = input.contiguous();
      at::Tensor flat = at::empty({size() * in.numel()}, in.options());  // (size * numel,) rank order
      const Moved m = moved(in, in.numel(), what);
      run(what, {in, flat}, [&](MPI_Request* request) {
        return MPI_Iallgather(in.data_ptr(), m.count, m.type, flat.data_ptr(), m.count, m.type, comm(), request);
    });
      unflatten(flat, outputs);
    });
  }

  std::shared_ptr<Work> do_gather(const std::string& what, std::vector<at::Tensor> outputs, at::Tensor input,
                                  int root) override {
    return enqueue(what, [this, outputs, input, root](const std::string& what) mutable {
      const at::Tensor in = input.contiguous();
      at::Tensor flat = rank() == root ? at::empty({size() * in.numel()}, in.options()) : at::Tensor();
      const Moved m = moved(in, in.numel(), what);
      run(what, {in, flat}, [&](MPI_Request* request) {
        return MPI_Igather(in.data_ptr(), m.count, m.type, flat.defined() ? flat.data_ptr() : nullptr, m.count, m.type,
                           root, comm(), request);
      });
      if (rank() == root) unflatten(flat, outputs);
    });
  }

  std::shared_ptr<Work> do_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                   int root) override {
    return enqueue(what, [this, output, inputs, root](const std::string& what) mutable {
      at::Tensor out = output.contiguous();
      at::Tensor flat;  // (size * numel,) on the root: inputs in rank order
      if (rank() == root) {
        std::vector<at::Tensor> pieces;
        for (const at::Tensor& t : inputs) pieces.push_back(t.reshape({-1}));
        flat = at::cat(pieces);
      }
      const Moved m = moved(out, out.numel(), what);
      run(what, {out, flat}, [&](MPI_Request* request) {
        return MPI_Iscatter(flat.defined() ? flat.data_ptr() : nullptr, m.count, m.type, out.data_ptr(), m.count,
                            m.type, root, comm(), request);
      });
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  std::shared_ptr<Work> do_reduce_scatter(const std::string& what, at::Tensor output, std::vector<at::Tensor> inputs,
                                          ReduceOp op) override {
    check_reducible(output, "reduce_scatter");
    return enqueue(what, [this, output, inputs, op](const std::string& what) mutable {
      std::vector<at::Tensor> pieces;
      for (const at::Tensor& t : inputs) pieces.push_back(t.reshape({-1}));
      const at::Tensor in = reducible(at::cat(pieces));  // (size * numel,)
      at::Tensor out = at::empty({output.numel()}, in.options());
      const int count = mpi_count(output.numel(), what);
      run(what, {in, out}, [&](MPI_Request* request) {
        return MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count, reduce_type(in), reduce_op(op), comm(),
                                         request);
      });
      if (op == ReduceOp::kAvg) out.div_(size());
      output.copy_(out.view(output.sizes()));
    });
  }

  std::shared_ptr<Work> do_all_to_all_single(const std::string& what, at::Tensor output, at::Tensor input) override {
    return enqueue(what, [this, output, input](const std::string& what) mutable {
      const at::Tensor in = input.contiguous();
      at::Tensor out = output.contiguous();
      const Moved m = moved(in, in.numel() / size(), what);  // one chunk per process
      run(what, {in, out}, [&](MPI_Request* request) {
        return MPI_Ialltoall(in.data_ptr(), m.count, m.type, out.data_ptr(), m.count, m.type, comm(), request);
      });
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  std::shared_ptr<Work> do_broadcast(const std::string& what, at::Tensor tensor, int root) override {
    return enqueue(what, [this, tensor, root](const std::string& what) mutable {
      at::Tensor buffer = tensor.contiguous();
      broadcast_in_place(buffer, root, what);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_barrier(const std::string& what) override {
    return enqueue(what, [this](const std::string& what) {
      run(what, {}, [&](MPI_Request* request) { return MPI_Ibarrier(comm(), request); });
    });
  }

  std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                                ReduceOp op) override {
    for (const at::Tensor& t : tensors) check_reducible(t, "all_reduce_coalesced");
    return enqueue(what, [this, tensors, op](const std::string& what) mutable {
      for (const detail::FlatGroup& group : detail::flatten_by_dtype(tensors)) {
        at::Tensor buffer = reducible(group.flat);
        all_reduce_in_place(buffer, op, what);
        detail::unflatten_into(group, buffer, tensors);
      }
    });
  }

  std::shared_ptr<Work> do_broadcast_coalesced(const std::string& what, std::vector<at::Tensor> tensors,
                                               int root) override {
    return enqueue(what, [this, tensors, root](const std::string& what) mutable {
      for (detail::FlatGroup& group : detail::flatten_by_dtype(tensors, /*copy_values=*/rank() == root)) {
        broadcast_in_place(group.flat, root, what);
        if (rank() != root) detail::unflatten_into(group, group.flat, tensors);
      }
    });
  }

  std::shared_ptr<Work> do_send(const std::string& op, at::Tensor tensor, int dst, int tag) override {
    check_tag(tag, "send");
    const std::string what = describe(op);
    const at::Tensor buffer = tensor.contiguous();
    const Moved m = moved(buffer, buffer.numel(), what);
    MPI_Request request = MPI_REQUEST_NULL;
    {
      mpi::MpiUse use(what);
      mpi::check(MPI_Isend(buffer.data_ptr(), m.count, m.type, dst, tag, comm(), &request), what);
    }
    const mpi::Clock::time_point deadline = mpi::Clock::now() + timeout();
    return p2p_.push(what, [this, what, buffer, request, deadline]() mutable {
      mpi::MpiUse use(what);
      finish_p2p(request, deadline, what, buffer, nullptr);
    });
  }

  std::shared_ptr<Work> do_recv(const std::string& op, at::Tensor tensor, int src, int tag) override {
    check_tag(tag, "recv");
    const std::string what = describe(op);
    at::Tensor buffer = tensor.contiguous();
    const Moved m = moved(buffer, buffer.numel(), what);
    MPI_Request request = MPI_REQUEST_NULL;
    {
      mpi::MpiUse use(what);
      mpi::check(MPI_Irecv(buffer.data_ptr(), m.count, m.type, src, tag, comm(), &request), what);
    }
    const mpi::Clock::time_point deadline = mpi::Clock::now() + timeout();
    return p2p_.push(what, [this, what, tensor, buffer, m, request, deadline]() mutable {
      mpi::MpiUse use(what);
      MPI_Status status;
      finish_p2p(request, deadline, what, buffer, &status);
      int received = 0;
      MPI_Get_count(&status, m.type, &received);
      const int64_t unit = m.type == MPI_BYTE ? 1 : static_cast<int64_t>(buffer.element_size());
      DATAPAR_CHECK(received == m.count, what, ": the message is ", received * unit, " bytes but the tensor is ",
                    m.count * unit, " bytes. Send and receive tensors of the same size and dtype.");
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

 private:
  MPI_Comm comm() const { return comm_.get(); }

  void check_tag(int tag, const char* what) const {
    DATAPAR_CHECK(tag <= mpi::max_tag(), what, ": tag ", tag, " is above ", mpi::max_tag(),
                  ", the largest tag this MPI library allows.");
  }

  // Queues a collective. `op` runs on the runner thread with MPI in use and gets the
  // operation's description for its errors.
  std::shared_ptr<Work> enqueue(const std::string& what, std::function<void(const std::string&)> op) {
    std::string full = describe(what);
    return collectives_.push(full, [this, full, op = std::move(op)] {
      if (!broken_.empty()) {
        throw CommError(str_cat(full, ": this group is unusable since an earlier collective timed out (", broken_,
                                "): the processes' collectives no longer pair up. Rebuild the process group."));
      }
      mpi::MpiUse use(full);
      op(full);
    });
  }

  // Starts one non-blocking collective and waits for it within the group's timeout.
  // `buffers`: every tensor MPI reads or writes, kept alive if the collective is abandoned.
  void run(const std::string& what, std::initializer_list<at::Tensor> buffers,
           const std::function<int(MPI_Request*)>& start) {
    MPI_Request request = MPI_REQUEST_NULL;
    mpi::check(start(&request), what);
    if (!mpi::wait(request, mpi::Clock::now() + timeout(), what)) abandon(what, buffers);
  }

  // After a collective's deadline. MPI cannot cancel a collective: it stays posted and may
  // still touch its buffers, and from now on this process's collectives would pair with the
  // wrong ones elsewhere.
  [[noreturn]] void abandon(const std::string& what, std::initializer_list<at::Tensor> buffers) {
    for (const at::Tensor& buffer : buffers) {
      if (buffer.defined()) mpi::keep_alive(buffer);
    }
    comm_.abandon();
    ring_comm_.abandon();
    broken_ = what;
    const std::string behind = ranks_behind();  // MPI cannot say who is missing; the inspector can
    throw TimeoutError(str_cat(what, ": not finished after the group's timeout of ", seconds(timeout()), " s",
                               behind.empty() ? "" : ": " + behind,
                               ". Did every process issue the same collectives in the same order? This group is "
                               "unusable now; rebuild the process group."));
  }

  // Large buffers go around the ring (Note [Ring all-reduce] in src/process_group/mpi/ring.cc),
  // small ones through MPI_Iallreduce, which has the lower latency.
  void all_reduce_in_place(at::Tensor& buffer, ReduceOp op, const std::string& what) {
    const int count = mpi_count(buffer.numel(), what);
    if (size() > 1 && static_cast<int64_t>(buffer.nbytes()) >= mpi::kRingMinBytes) {
      at::Tensor flat = buffer.view({-1});
      if (!ring_.all_reduce(flat, op, mpi::Clock::now() + timeout(), what)) {
        abandon(what, {buffer, ring_.scratch()});
      }
    } else {
      run(what, {buffer}, [&](MPI_Request* request) {
        return MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr(), count, reduce_type(buffer), reduce_op(op), comm(),
                              request);
      });
    }
    if (op == ReduceOp::kAvg) buffer.div_(size());
  }

  void broadcast_in_place(at::Tensor& buffer, int root, const std::string& what) {
    const Moved m = moved(buffer, buffer.numel(), what);
    run(what, {buffer}, [&](MPI_Request* request) {
      return MPI_Ibcast(buffer.data_ptr(), m.count, m.type, root, comm(), request);
    });
  }

  // Waits for a posted send or recv. At the deadline it is cancelled: a recv that found
  // no message yet is cancelled at once; MPI may be unable to cancel a send, which then
  // stays posted with its buffer kept alive.
  void finish_p2p(MPI_Request& request, mpi::Clock::time_point deadline, const std::string& what,
                  const at::Tensor& buffer, MPI_Status* status) {
    MPI_Status local;
    if (status == nullptr) status = &local;
    if (mpi::wait(request, deadline, what, status)) return;
    MPI_Cancel(&request);
    if (mpi::wait(request, mpi::Clock::now() + 100ms, what, status)) {
      int cancelled = 0;
      MPI_Test_cancelled(status, &cancelled);
      if (!cancelled) return;  // it completed after all
    } else {
      mpi::keep_alive(buffer);
      MPI_Request_free(&request);
    }
    throw TimeoutError(str_cat(what, ": not finished after the group's timeout of ", seconds(timeout()),
                               " s. Did the peer post the matching send or recv, with the same tag?"));
  }

  Communicator comm_;
  Communicator ring_comm_;
  mpi::Ring ring_;  // only the runner thread uses it
  std::string broken_;  // the collective that timed out; only the runner thread uses it
  // Declared last: stopped first, so queued operations finish while the communicator lives.
  detail::OrderedRunner collectives_{"mpi collectives"};
  // Point-to-point operations are posted at once; this thread only waits for them, in order.
  detail::OrderedRunner p2p_{"mpi send/recv"};
};

// Members of one MPI_Comm_create_group call share this tag; they call it in the same
// order, so one tag is enough, and MPI keeps it apart from point-to-point tags.
constexpr int kCreateGroupTag = 0x6470;  // "dp"

}  // namespace

namespace detail {

MpiWorld mpi_world() {
  mpi::initialize();
  MpiWorld world;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  return world;
}

MpiTransport new_mpi_transport(const std::vector<int>& ranks, const MpiOptions& options) {
  const detail::MpiWorld world = detail::mpi_world();
  for (int r : ranks) {
    DATAPAR_CHECK(r >= 0 && r < world.size, "new_mpi_process_group: rank ", r, " is outside MPI_COMM_WORLD's [0, ",
                  world.size, "). Start more processes (mpirun -np N) or list ranks below ", world.size, ".");
    DATAPAR_CHECK(std::count(ranks.begin(), ranks.end(), r) == 1, "new_mpi_process_group: rank ", r,
                  " is listed twice.");
  }
  bool whole = ranks.empty();
  if (static_cast<int>(ranks.size()) == world.size) {
    whole = true;
    for (int i = 0; i < world.size; ++i) whole = whole && ranks[i] == i;
  }
  if (!whole && std::find(ranks.begin(), ranks.end(), world.rank) == ranks.end()) return {};

  const std::string what = str_cat("new_mpi_process_group on rank ", world.rank, " of ", world.size);
  mpi::MpiUse use(what);
  MPI_Comm comm = MPI_COMM_NULL;
  if (whole) {
    MPI_Request request = MPI_REQUEST_NULL;
    mpi::check(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), what);
    if (!mpi::wait(request, mpi::Clock::now() + options.timeout, what)) {
      throw TimeoutError(str_cat(what, ": the other processes did not join within ", seconds(options.timeout),
                                 " s. Did every process of the job start and make its MPI process groups in the "
                                 "same order?"));
    }
  } else {
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group members = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &members);
    const int code = MPI_Comm_create_group(MPI_COMM_WORLD, members, kCreateGroupTag, &comm);
    MPI_Group_free(&members);
    MPI_Group_free(&world_group);
    mpi::check(code, what);
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm ring_comm = MPI_COMM_NULL;  // inherits the error handler
  MPI_Request request = MPI_REQUEST_NULL;
  mpi::check(MPI_Comm_idup(comm, &ring_comm, &request), what);
  if (!mpi::wait(request, mpi::Clock::now() + options.timeout, what)) {
    throw TimeoutError(str_cat(what, ": the other members stopped answering while the group was made (after ",
                               seconds(options.timeout), " s)."));
  }
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  auto group = std::make_shared<ProcessGroupMpi>(comm, ring_comm, rank, size, options.timeout);
  MpiTransport transport;
  transport.exchange = group->setup_exchange(what);
  transport.group = std::move(group);
  return transport;
}

}  // namespace detail
}  // namespace datapar
