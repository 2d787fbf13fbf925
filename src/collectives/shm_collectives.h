// Collectives through one shared-memory region that every member of a group maps, when all
// of them run on one machine: all_reduce, reduce_scatter, all_gather, broadcast and
// barrier, with no messages and no copies through the kernel (Note [Shared-memory
// collectives] in shm_collectives.cc). Independent of the transport: set up over an
// Exchange, used by the shared-memory layer (shared_memory_group.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "datapar/reduce_op.h"
#include "collectives/exchange.h"

namespace datapar::detail::shm {

// What members must share to share memory: "" where there is no /dev/shm. Members whose
// texts are equal run on one machine (see machine_identity() in shm_collectives.cc).
std::string this_machine();

// A member of a group as it introduces itself: its process and its machine (this_machine(),
// or "" where it cannot or will not share memory).
struct Member {
  int pid = 0;
  std::string machine;
};

// Collective over `exchange` (every member calls it): every member's introduction, in rank
// order. `wanted` false: this member gives no machine. Throws TimeoutError at `deadline`.
std::vector<Member> introduce(Exchange& exchange, bool wanted, Clock::time_point deadline);

class ShmCollectives {
 public:
  // Collective over `exchange` (every member calls it): maps one region that every member
  // shares, or returns nullptr on every member when that is impossible (members on
  // different machines, or in different mount, pid or network namespaces; /dev/shm
  // missing or full) or not wanted (`wanted` false on any member). The region has no name
  // once this returns, so nothing is left in /dev/shm whatever happens to the processes.
  // Operations fail after `timeout`. Throws TimeoutError when the members do not all take
  // part within `timeout`.
  static std::unique_ptr<ShmCollectives> create(Exchange& exchange, int rank, int size, bool wanted,
                                                std::chrono::milliseconds timeout);

  // The same for members known to share this machine (from introduce()): `pids` in rank
  // order. Returns nullptr on every member when a region cannot be made or mapped.
  static std::unique_ptr<ShmCollectives> set_up(Exchange& exchange, int rank, std::vector<int> pids,
                                                std::chrono::milliseconds timeout);

  ~ShmCollectives();  // unmaps the region; local, never waits for the other members
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The operations. Every member calls them in the same order, one thread at a time. `what`
  // names the operation in errors ("all_reduce(sum) on rank 1 of 2 (gloo)"). They throw
  // TimeoutError naming the members that did not arrive within the timeout, or CommError
  // naming a member whose process exited; from then on the object is unusable and every
  // call throws CommError.
  // Types: reductions take float32/64 or int32/64 (kAvg: the sum; the caller divides); the
  // others move bytes.

  // data[0, count) reduced over the members, in place; every member gets the same bits.
  void all_reduce(void* data, int64_t count, c10::ScalarType type, ReduceOp op, const std::string& what);

  // input: size() blocks of `count` elements; output[0, count) = block rank() reduced over
  // the members. Each member reads only the blocks it reduces: bandwidth-optimal.
  void reduce_scatter(const void* input, void* output, int64_t count, c10::ScalarType type, ReduceOp op,
                      const std::string& what);

  // outputs[r] (`bytes` each, size() of them) receives member r's input.
  void all_gather(const void* input, const std::vector<void*>& outputs, size_t bytes, const std::string& what);

  // data[0, bytes) of member `root` copied to every member's data.
  void broadcast(void* data, size_t bytes, int root, const std::string& what);

  // Returns once every member called it.
  void barrier(const std::string& what);

  // From any thread (ProcessGroup::abort): the operation in flight and every later one
  // throw CommError saying the group was aborted; the object is unusable from then on.
  void abort() { aborted_.store(true, std::memory_order_release); }

 private:
  struct Flags;
  ShmCollectives(void* base, size_t bytes, int rank, int size, std::vector<int> pidfds, std::vector<int> pids,
                 std::chrono::milliseconds timeout);
  Flags& flags(int rank) const;
  char* slot(int rank, int set) const;
  // Starts round number ++generation_: returns the slot set it uses.
  int begin_round();
  // Raises this member's counter `which` (kArrived or kDone) to the round's generation and
  // waits until every member's reached it. Throws as the operations do.
  void meet(int which, const std::string& what);
  void check_usable(const std::string& what) const;
  [[noreturn]] void fail_timeout(int late, const std::string& what);
  [[noreturn]] void fail_exited(int gone, const std::string& what);
  [[noreturn]] void fail_aborted(const std::string& what);
  bool exited(int member) const;

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  size_t slot_bytes_;
  std::vector<int> pidfds_;  // per member: a pidfd to see it exit, or -1 (this process; none)
  std::vector<int> pids_;
  std::chrono::milliseconds timeout_;
  uint32_t generation_ = 0;      // rounds done (modulo 2^32); the same on every member
  Clock::time_point deadline_;   // the current operation's
  std::string broken_;           // why the object is unusable; empty while it is usable
  std::atomic<bool> aborted_{false};
};

}  // namespace datapar::detail::shm
