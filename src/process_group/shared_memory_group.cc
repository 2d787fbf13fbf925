// See shared_memory_group.h.
//
// Note [Two-level all-reduce]
// Between machines the network is the bottleneck, and a flat ring over every process sends
// each byte over it several times, through every process's TCP stack, even between two
// processes of one machine. With several processes per machine, an all-reduce is cheaper in
// two levels, as Horovod's hierarchical all-reduce and NCCL do it. When every machine runs
// the same number L of the group's processes: (1) the processes of each machine
// reduce-scatter the buffer through shared memory, so local rank r holds block r of the
// machine's sum; (2) local rank r all-reduces its block with local rank r of every other
// machine over the transport (L groups, one per local rank, at the same time); (3) the
// processes of each machine all-gather the blocks through shared memory. Each byte crosses
// the network once, and every process carries 1/L of it. (Measured on one 2-core machine,
// two network namespaces of 2 processes each: a single leader per machine carrying the
// whole buffer was 0.82x the flat ring at 16 MiB, the CPU of one process being the limit.)
// When machines run unequal numbers, one leader per machine carries it all: (1) all-reduce
// within the machine, (2) the leaders all-reduce, (3) each leader broadcasts to its machine.
#include "process_group/shared_memory_group.h"
#include "process_group/flight_recorder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "datapar/rendezvous/prefix_store.h"
#include "tensor/coalesce.h"
#include "process_group/ordered_runner.h"
#include "collectives/aborted.h"
#include "collectives/reduce.h"
#include "collectives/shm_collectives.h"
#include "collectives/store_exchange.h"

namespace datapar::detail {
namespace {

using shm::ShmCollectives;

class SharedMemoryGroup final : public ProcessGroup {
 public:
  // One machine: `shm` spans the group. Several (`two_levels`): `shm` spans this member's
  // machine (null if it is alone there); `leaders` joins this member to one process of
  // each other machine: its column (same local rank) when `columns`, else the machines'
  // leaders (null but on them).
  SharedMemoryGroup(std::shared_ptr<ProcessGroup> transport, std::unique_ptr<ShmCollectives> shm, bool two_levels,
                    std::shared_ptr<ProcessGroup> leaders, bool columns = false)
      : ProcessGroup(transport->rank(), transport->size(), transport->timeout()),
        transport_(std::move(transport)),
        shm_(std::move(shm)),
        two_levels_(two_levels),
        leaders_(std::move(leaders)),
        columns_(columns),
        backend_(transport_->backend()) {
    // This group records its collectives; the transports it makes them over do not.
    detail::mark_internal(transport_);
    detail::mark_internal(leaders_);
  }

  std::string backend() const override { return backend_; }

 protected:
  // The region's waits and the transports' sockets, so the collective in flight, whichever
  // level it is on, fails at once.
  void do_abort() override {
    if (shm_) shm_->abort();
    transport_->abort();
    if (leaders_) leaders_->abort();
  }

  std::shared_ptr<Work> do_all_reduce(const std::string& op_name, at::Tensor tensor, ReduceOp op) override {
    check_reducible(tensor, "all_reduce");
    const std::string what = describe(op_name);
    return run(what, [this, tensor, op, what]() mutable {
      at::Tensor buffer = reducible(tensor);
      all_reduce_in_place(buffer, op, what);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& op_name, std::vector<at::Tensor> tensors,
                                                ReduceOp op) override {
    for (const at::Tensor& t : tensors) check_reducible(t, "all_reduce_coalesced");
    const std::string what = describe(op_name);
    return run(what, [this, tensors, op, what]() mutable {
      for (const FlatGroup& group : flatten_by_dtype(tensors)) {
        at::Tensor buffer = reducible(group.flat);
        all_reduce_in_place(buffer, op, what);
        unflatten_into(group, buffer, tensors);
      }
    });
  }

  std::shared_ptr<Work> do_reduce_scatter(const std::string& op_name, at::Tensor output, std::vector<at::Tensor> inputs,
                                          ReduceOp op) override {
    check_reducible(output, "reduce_scatter");
    const std::string what = describe(op_name);
    if (two_levels_) {
      return through_transport(what, [=](ProcessGroup& g) { return g.reduce_scatter(output, inputs, op); });
    }
    return run(what, [this, output, inputs, op, what]() mutable {
      std::vector<at::Tensor> flat_inputs;
      for (const at::Tensor& t : inputs) flat_inputs.push_back(t.reshape({-1}));
      const at::Tensor in = reducible(at::cat(flat_inputs));  // (size * numel,), rank order
      at::Tensor out = at::empty({output.numel()}, in.options());
      shm_->reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), out.scalar_type(), op, what);
      if (op == ReduceOp::kAvg) out.div_(size());
      output.copy_(out.view_as(output));
    });
  }

  std::shared_ptr<Work> do_all_gather(const std::string& op_name, std::vector<at::Tensor> outputs,
                                      at::Tensor input) override {
    const std::string what = describe(op_name);
    if (two_levels_) return through_transport(what, [=](ProcessGroup& g) { return g.all_gather(outputs, input); });
    return run(what, [this, outputs, input, what]() mutable {
      const at::Tensor in = input.contiguous();
      std::vector<at::Tensor> targets;  // the outputs themselves where contiguous: no extra copy
      std::vector<void*> pointers;
      for (const at::Tensor& out : outputs) {
        targets.push_back(out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous));
        pointers.push_back(targets.back().data_ptr());
      }
      shm_->all_gather(in.data_ptr(), pointers, in.nbytes(), what);
      for (size_t r = 0; r < outputs.size(); ++r) {
        if (!targets[r].is_same(outputs[r])) outputs[r].copy_(targets[r]);
      }
    });
  }

  std::shared_ptr<Work> do_broadcast(const std::string& op_name, at::Tensor tensor, int root) override {
    const std::string what = describe(op_name);
    if (two_levels_) return through_transport(what, [=](ProcessGroup& g) { return g.broadcast(tensor, root); });
    return run(what, [this, tensor, root, what]() mutable {
      at::Tensor buffer = tensor.contiguous();
      shm_->broadcast(buffer.data_ptr(), buffer.nbytes(), root, what);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> do_broadcast_coalesced(const std::string& op_name, std::vector<at::Tensor> tensors,
                                               int root) override {
    const std::string what = describe(op_name);
    if (two_levels_) {
      return through_transport(what, [=](ProcessGroup& g) { return g.broadcast_coalesced(tensors, root); });
    }
    return run(what, [this, tensors, root, what]() mutable {
      for (const FlatGroup& group : flatten_by_dtype(tensors, /*copy_values=*/rank() == root)) {
        shm_->broadcast(group.flat.data_ptr(), group.flat.nbytes(), root, what);
        if (rank() != root) unflatten_into(group, group.flat, tensors);
      }
    });
  }

  std::shared_ptr<Work> do_barrier(const std::string& op_name) override {
    const std::string what = describe(op_name);
    if (two_levels_) return through_transport(what, [=](ProcessGroup& g) { return g.barrier(); });
    return run(what, [this, what] { shm_->barrier(what); });
  }

  // No shared-memory algorithm: the transport's, started when its turn comes in this
  // group's order.
  std::shared_ptr<Work> do_reduce(const std::string& op_name, at::Tensor tensor, int root, ReduceOp op) override {
    return through_transport(describe(op_name), [=](ProcessGroup& g) { return g.reduce(tensor, root, op); });
  }
  std::shared_ptr<Work> do_gather(const std::string& op_name, std::vector<at::Tensor> outputs, at::Tensor input,
                                  int root) override {
    return through_transport(describe(op_name), [=](ProcessGroup& g) { return g.gather(outputs, input, root); });
  }
  std::shared_ptr<Work> do_scatter(const std::string& op_name, at::Tensor output, std::vector<at::Tensor> inputs,
                                   int root) override {
    return through_transport(describe(op_name), [=](ProcessGroup& g) { return g.scatter(output, inputs, root); });
  }
  std::shared_ptr<Work> do_all_to_all_single(const std::string& op_name, at::Tensor output, at::Tensor input) override {
    return through_transport(describe(op_name), [=](ProcessGroup& g) { return g.all_to_all_single(output, input); });
  }

  // Point to point is not ordered with the collectives: straight to the transport.
  std::shared_ptr<Work> do_send(const std::string&, at::Tensor tensor, int dst, int tag) override {
    return transport_->send(tensor, dst, tag);
  }
  std::shared_ptr<Work> do_recv(const std::string&, at::Tensor tensor, int src, int tag) override {
    return transport_->recv(tensor, src, tag);
  }

  std::string label() const override { return backend_ + (two_levels_ ? ", two levels" : ", shared memory"); }

 private:
  // Note [Two-level all-reduce] when the group spans machines.
  void all_reduce_in_place(at::Tensor& buffer, ReduceOp op, const std::string& what) {
    const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    if (columns_) {
      all_reduce_by_columns(buffer, combine, what);
    } else {
      if (shm_) shm_->all_reduce(buffer.data_ptr(), buffer.numel(), buffer.scalar_type(), combine, what);
      if (two_levels_) {  // leaders: Note [Two-level all-reduce], unequal machines
        if (leaders_) leaders_->all_reduce(buffer, combine)->wait();
        if (shm_) shm_->broadcast(buffer.data_ptr(), buffer.nbytes(), 0, what);
      }
    }
    if (op == ReduceOp::kAvg) buffer.div_(size());
  }

  // Note [Two-level all-reduce], L processes on every machine, in blocks of equal size: in
  // the buffer itself when L divides it, else in a copy padded to a multiple of L. This
  // member's block is summed in scratch memory kept between calls: a fresh one, and a
  // padded copy, cost a page fault per 4 KiB each time (a fifth of a 16 MiB all-reduce
  // between two network namespaces on one machine).
  void all_reduce_by_columns(at::Tensor& buffer, ReduceOp op, const std::string& what) {
    const int64_t local = shm_->size();
    const int64_t block = (buffer.numel() + local - 1) / local;
    const bool in_place = block * local == buffer.numel() && buffer.is_contiguous();
    at::Tensor whole = buffer;
    if (!in_place) {
      whole = at::zeros({block * local}, buffer.options());
      whole.narrow(0, 0, buffer.numel()).copy_(buffer.view({-1}));
    }
    const int64_t block_bytes = block * static_cast<int64_t>(buffer.element_size());
    if (!column_scratch_.defined() || column_scratch_.nbytes() < static_cast<size_t>(block_bytes)) {
      column_scratch_ = at::empty({block_bytes}, buffer.options().dtype(at::kByte));
    }
    at::Tensor mine = at::from_blob(column_scratch_.data_ptr(), {block}, buffer.options());
    shm_->reduce_scatter(whole.data_ptr(), mine.data_ptr(), block, mine.scalar_type(), op, what);
    leaders_->all_reduce(mine, op)->wait();
    std::vector<void*> blocks;
    for (int64_t r = 0; r < local; ++r) blocks.push_back(static_cast<char*>(whole.data_ptr()) + r * block_bytes);
    shm_->all_gather(mine.data_ptr(), blocks, block_bytes, what);
    if (!in_place) buffer.view({-1}).copy_(whole.narrow(0, 0, buffer.numel()));
  }

  // Queues a collective, which runs in this group's order. Once one failed (timed out, or a
  // member is gone) the members' collectives no longer pair up: every later one fails.
  std::shared_ptr<Work> run(const std::string& what, std::function<void()> op) {
    return collectives_.push(what, [this, what, op = std::move(op)] {
      if (aborted()) throw CommError(aborted_message(what));
      if (!broken_.empty()) {
        throw CommError(str_cat(what, ": this group is unusable since an earlier collective failed (", broken_,
                                "): the processes' collectives no longer pair up. Rebuild the process group (e.g. "
                                "restart the job from a checkpoint)."));
      }
      try {
        op();
      } catch (const TimeoutError&) {
        broken_ = what;
        throw;
      } catch (const CommError&) {
        broken_ = what;
        throw;
      }
    });
  }

  // `start`: the operation, on the transport it is given.
  std::shared_ptr<Work> through_transport(const std::string& what,
                                          std::function<std::shared_ptr<Work>(ProcessGroup&)> start) {
    return run(what, [this, start = std::move(start)] {
      try {
        start(*transport_)->wait();
      } catch (const TimeoutError& e) {
        // The transport cannot tell who is missing (it has no store); this group's stall
        // inspector can.
        const std::string behind = ranks_behind();
        if (behind.empty()) throw;
        throw TimeoutError(str_cat(e.what(), " (", behind, ")"));
      }
    });
  }

  std::shared_ptr<ProcessGroup> transport_;
  std::unique_ptr<ShmCollectives> shm_;  // only the runner's thread uses it
  bool two_levels_;
  std::shared_ptr<ProcessGroup> leaders_;
  bool columns_;
  at::Tensor column_scratch_;  // all_reduce_by_columns: this member's block, kept between calls
  std::string backend_;
  std::string broken_;  // the collective that failed; only the runner's thread uses it
  // Declared last: stopped first, so queued operations finish while the region is mapped.
  OrderedRunner collectives_{"shared-memory collectives"};
};

}  // namespace

SharedMemoryMeeting meeting_through(std::shared_ptr<Store> store, int rank, int size, MakeTransport make_leaders) {
  SharedMemoryMeeting meeting;
  meeting.everyone = std::make_unique<shm::StoreExchange>(std::make_shared<PrefixStore>("all", store), rank, size);
  if (!make_leaders) return meeting;
  meeting.neighbours = [store](int machine, int local_rank, int local_size) {
    return std::make_unique<shm::StoreExchange>(std::make_shared<PrefixStore>(str_cat("machine-", machine), store),
                                                local_rank, local_size);
  };
  meeting.leaders = [store, make_leaders = std::move(make_leaders)](const std::string& name, int leader, int leaders) {
    return make_leaders(std::make_shared<PrefixStore>(name, store), leader, leaders);
  };
  return meeting;
}

std::shared_ptr<ProcessGroup> with_shared_memory(std::shared_ptr<ProcessGroup> transport,
                                                 SharedMemoryMeeting meeting, bool wanted,
                                                 std::chrono::milliseconds timeout) {
  const int rank = transport->rank();
  const int size = transport->size();
  if (size == 1) return transport;
  const shm::Clock::time_point deadline = shm::Clock::now() + timeout;
  shm::Exchange& everyone = *meeting.everyone;
  const std::vector<shm::Member> members = shm::introduce(everyone, wanted, deadline);
  std::vector<std::string> machines;
  std::vector<int> pids;
  for (const shm::Member& m : members) {
    machines.push_back(m.machine);
    pids.push_back(m.pid);
  }
  if (std::any_of(machines.begin(), machines.end(), [](const std::string& m) { return m.empty(); })) return transport;
  if (std::all_of(machines.begin(), machines.end(), [&](const std::string& m) { return m == machines[0]; })) {
    std::unique_ptr<ShmCollectives> shm = ShmCollectives::set_up(everyone, rank, std::move(pids), timeout);
    if (shm == nullptr) return transport;
    return std::make_shared<SharedMemoryGroup>(std::move(transport), std::move(shm), false, nullptr);
  }
  // Several machines, numbered in order of their first member; members by local rank.
  std::map<std::string, int> index;
  std::vector<int> local_size;
  std::vector<int> neighbour_pids;  // of this machine's members, in rank order
  int local_rank = 0;
  for (int r = 0; r < size; ++r) {
    const auto [at, added] = index.emplace(machines[r], static_cast<int>(local_size.size()));
    if (added) local_size.push_back(0);
    if (r < rank && machines[r] == machines[rank]) ++local_rank;
    if (machines[r] == machines[rank]) neighbour_pids.push_back(pids[r]);
    ++local_size[at->second];
  }
  const int machine = index.at(machines[rank]);
  const bool crowded = std::any_of(local_size.begin(), local_size.end(), [](int n) { return n > 1; });
  if (!meeting.leaders || !crowded) return transport;  // one process per machine: nothing to gain
  // Equal machines: a group per local rank (column); else one of the machines' leaders.
  const bool columns = std::all_of(local_size.begin(), local_size.end(), [&](int n) { return n == local_size[0]; });
  std::unique_ptr<ShmCollectives> shm;
  if (local_size[machine] > 1) {
    const std::unique_ptr<shm::Exchange> neighbours = meeting.neighbours(machine, local_rank, local_size[machine]);
    shm = ShmCollectives::set_up(*neighbours, local_rank, std::move(neighbour_pids), timeout);
  }
  std::shared_ptr<ProcessGroup> leaders;
  if (columns || local_rank == 0) {
    const std::string name = columns ? str_cat("column-", local_rank) : "leaders";
    leaders = meeting.leaders(name, machine, static_cast<int>(local_size.size()));
  }
  // Two levels only if every crowded machine has its shared memory; else all stay flat.
  const bool ready = local_size[machine] == 1 || shm != nullptr;
  const std::vector<std::string> verdicts = everyone.all_gather(ready ? "1" : "0", deadline);
  if (std::any_of(verdicts.begin(), verdicts.end(), [](const std::string& v) { return v != "1"; })) return transport;
  return std::make_shared<SharedMemoryGroup>(std::move(transport), std::move(shm), true, std::move(leaders), columns);
}

}  // namespace datapar::detail
