// See shm_all_reduce.h.
//
// Note [Shared-memory all-reduce]
// Under DDP on one machine every core computes, so an all-reduce is paid for in CPU time
// on the cores that train, not hidden behind them: what counts is the CPU it takes. The
// ring (ring.cc) sends each part as MPI messages: per step a rendezvous between the two
// processes, a copy by the kernel (CMA) into a scratch buffer, the reduction, and the
// polling on both sides while the peer's communication thread waits for a turn on a core
// busy with backward. For the MLP's 2.7 MB of gradients that came to about 2 ms of CPU per
// step for 1.1-1.4 ms of all-reduce alone (docs/benchmarks.md, "Where a DDP step's time
// goes"). Here the processes share one region instead, and a round of up to
// kShmRoundBytes of the buffer takes two meeting points and no messages:
//   1. each process copies its round of the buffer into its own slot (all but its own
//      part, which only it reads, from its buffer), then raises its `arrived` counter to
//      the round's generation and waits for everyone's;
//   2. process r reduces part r of the round (parts as in the ring: [len r / n,
//      len (r + 1) / n)) from every slot into its own buffer, copies the result into part
//      r of its own slot, raises `done` and waits for everyone's;
//   3. each process copies the other parts from their owners' slots into its buffer.
// Every part is reduced once, by its owner, so all processes end with the same bits. A
// process that waits for the others spins for a few microseconds, then sleeps on the late
// one's counter (a futex in the shared region) until it is raised: the core goes back to
// backward instead of to polling.
// Slots come in two sets used by alternate rounds: a process overwrites its slot of set
// s in round g only after everyone raised `done` for round g - 1, i.e. after everyone
// finished reading round g - 2, the last round that used set s.
//
// The region lives in /dev/shm only while the group is made: rank 0 creates it, the others
// map it by name, and rank 0 removes the name as soon as everyone answered, so a crash
// after the group is made leaves nothing behind. posix_fallocate reserves its pages up front: a full /dev/shm is
// then a fallback to the ring at creation, not a SIGBUS in the middle of training.
#include "process_group/mpi/shm_all_reduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "datapar/error.h"
#include "process_group/mpi/types.h"
#include "stale_files.h"

namespace datapar::detail::mpi {
namespace {

using namespace std::chrono_literals;

constexpr size_t kPage = 4096;
// A wait spins this long (the others usually arrive within microseconds), then sleeps on
// the late member's counter, which costs no CPU: under DDP the core belongs to backward.
constexpr auto kSpinFor = 30us;
constexpr auto kNapAtMost = 20ms;
constexpr int kArrived = 0;
constexpr int kDone = 1;

struct Header {
  uint64_t nonce;  // rank 0's random number: the others check that they mapped its region
};

// Rank 0's invitation to the region, broadcast to the others.
struct Invitation {
  char name[64];  // empty: no region (rank 0 could not make one or does not want it)
  uint64_t nonce;
};

// Page 0: the header; page 1 + r: rank r's flags; then the slots, rank by rank, two sets each.
size_t region_bytes(int size) {
  return kPage * (1 + static_cast<size_t>(size)) + static_cast<size_t>(size) * 2 * kShmRoundBytes;
}

bool wanted() {
  const char* value = std::getenv("DATAPAR_MPI_SHM");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

void* map(int fd, size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return base == MAP_FAILED ? nullptr : base;
}

// Rank 0: a new region, its name in `invitation`; nullptr and an empty name if impossible.
void* make_region(size_t bytes, Invitation& invitation) {
  // A region has a name only until every member mapped it; a rank 0 killed before that
  // left one behind (stale_files.h). POSIX shared memory lives in /dev/shm on Linux.
  remove_stale_entries("/dev/shm", "datapar-mpi-");
  std::random_device random;
  invitation.nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
  std::snprintf(invitation.name, sizeof invitation.name, "/datapar-mpi-%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(invitation.nonce));
  const int fd = ::shm_open(invitation.name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    invitation.name[0] = '\0';
    return nullptr;
  }
  void* base = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0 ? map(fd, bytes) : nullptr;
  ::close(fd);
  if (base == nullptr) {
    ::shm_unlink(invitation.name);
    invitation.name[0] = '\0';
    return nullptr;
  }
  static_cast<Header*>(base)->nonce = invitation.nonce;
  return base;
}

// The other ranks: rank 0's region, or nullptr if it is not reachable from here.
void* open_region(size_t bytes, const Invitation& invitation) {
  const int fd = ::shm_open(invitation.name, O_RDWR, 0);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes ? map(fd, bytes) : nullptr;
  ::close(fd);
  if (base != nullptr && static_cast<const Header*>(base)->nonce != invitation.nonce) {
    ::munmap(base, bytes);
    return nullptr;
  }
  return base;
}

// Whether a counter that reads `seen` reached `generation` (modulo 2^32).
bool reached(uint32_t seen, uint32_t generation) { return static_cast<int32_t>(seen - generation) >= 0; }

// futex(2) on a counter in memory shared between processes (so not FUTEX_PRIVATE_FLAG).
void futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

// Runs one non-blocking collective to completion by `deadline`.
void collective(int code, MPI_Request& request, Clock::time_point deadline, const std::string& what) {
  check(code, what);
  if (!wait(request, deadline, what)) {
    throw TimeoutError(str_cat(what, ": the other members stopped answering while their shared memory was set up."));
  }
}

}  // namespace

struct ShmAllReduce::Flags {
  struct alignas(64) Counter {
    std::atomic<uint32_t> generation;  // the last round that reached this point; a futex word
  };
  Counter reached[2];  // [kArrived], [kDone]
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "the counters are futex words shared between processes");

std::unique_ptr<ShmAllReduce> ShmAllReduce::create(MPI_Comm comm, Clock::time_point deadline,
                                                   const std::string& what) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const size_t bytes = region_bytes(size);
  // On the heap: a collective abandoned at the deadline may still write into it.
  struct Exchange {
    Invitation invitation{};
    int mine = 0;  // this member mapped the region
    int all = 0;   // every member did
  };
  auto exchange = std::make_unique<Exchange>();
  Invitation& invitation = exchange->invitation;
  void* base = nullptr;
  if (rank == 0 && wanted()) base = make_region(bytes, invitation);
  const auto forget = [&] {  // the name goes once everyone answered, or on any error
    if (rank == 0 && invitation.name[0] != '\0') ::shm_unlink(invitation.name);
  };
  try {
    MPI_Request request = MPI_REQUEST_NULL;
    collective(MPI_Ibcast(&invitation, sizeof invitation, MPI_BYTE, 0, comm, &request), request, deadline, what);
    if (rank != 0 && wanted() && invitation.name[0] != '\0') base = open_region(bytes, invitation);
    exchange->mine = base != nullptr;
    collective(MPI_Iallreduce(&exchange->mine, &exchange->all, 1, MPI_INT, MPI_MIN, comm, &request), request,
               deadline, what);
  } catch (...) {
    forget();
    if (base != nullptr) ::munmap(base, bytes);
    static_cast<void>(exchange.release());  // leaked: the abandoned collective may still write into it
    throw;
  }
  forget();
  if (!exchange->all) {
    if (base != nullptr) ::munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(base, bytes, rank, size));
}

ShmAllReduce::ShmAllReduce(void* base, size_t bytes, int rank, int size)
    : base_(base), bytes_(bytes), rank_(rank), size_(size) {}

ShmAllReduce::~ShmAllReduce() { ::munmap(base_, bytes_); }

ShmAllReduce::Flags& ShmAllReduce::flags(int rank) const {
  static_assert(sizeof(Flags) <= kPage, "a rank's flags fill at most their page");
  return *reinterpret_cast<Flags*>(static_cast<char*>(base_) + kPage * (1 + static_cast<size_t>(rank)));
}

char* ShmAllReduce::slot(int rank, int set) const {
  const size_t index = 2 * static_cast<size_t>(rank) + static_cast<size_t>(set);
  return static_cast<char*>(base_) + kPage * (1 + static_cast<size_t>(size_)) + index * kShmRoundBytes;
}

void ShmAllReduce::reach(int which, uint32_t generation) {
  std::atomic<uint32_t>& counter = flags(rank_).reached[which].generation;
  counter.store(generation, std::memory_order_release);
  futex(counter, FUTEX_WAKE, INT_MAX, nullptr);
}

bool ShmAllReduce::all_reached(int which, uint32_t generation, Clock::time_point deadline,
                               const std::string& what) const {
  const Clock::time_point start = Clock::now();
  for (int r = 0; r < size_; ++r) {
    std::atomic<uint32_t>& counter = flags(r).reached[which].generation;
    for (unsigned polls = 0;; ++polls) {
      const uint32_t seen = counter.load(std::memory_order_acquire);
      if (reached(seen, generation)) break;
      if (polls % 8 != 7) continue;
      throw_if_finalizing(what);
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return false;
      if (now - start < kSpinFor) continue;
      // Sleep until the member raises its counter (or a while passes: the deadline and
      // the exit flag are checked between naps).
      const auto nap = std::min<Clock::duration>(deadline - now, kNapAtMost);
      const timespec timeout{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count())};
      futex(counter, FUTEX_WAIT, seen, &timeout);
    }
  }
  return true;
}

bool ShmAllReduce::all_reduce(at::Tensor& buffer, ReduceOp op, Clock::time_point deadline, const std::string& what) {
  DATAPAR_INTERNAL_ASSERT(buffer.is_contiguous() && buffer.dim() == 1);
  const at::ScalarType type = buffer.scalar_type();
  const int64_t element = static_cast<int64_t>(buffer.element_size());
  const int64_t per_round = kShmRoundBytes / element;
  const int64_t total = buffer.numel();
  char* data = static_cast<char*>(buffer.data_ptr());
  for (int64_t offset = 0; offset < total; offset += per_round) {
    const int64_t len = std::min(per_round, total - offset);
    const auto begin = [&](int part) { return len * part / size_; };  // parts: [begin(p), begin(p + 1))
    const uint32_t generation = ++generation_;
    const int set = static_cast<int>(generation % 2);
    char* round = data + offset * element;
    char* mine = slot(rank_, set);

    const int64_t first = begin(rank_);  // this process's part of the round
    const int64_t count = begin(rank_ + 1) - first;
    // 1. Only the parts that others reduce: this process reads its own part from `round`.
    std::memcpy(mine, round, static_cast<size_t>(first * element));
    const int64_t after = first + count;
    std::memcpy(mine + after * element, round + after * element, static_cast<size_t>((len - after) * element));
    reach(kArrived, generation);
    if (!all_reached(kArrived, generation, deadline, what)) return false;

    // 2.
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) reduce_into(round + first * element, slot(r, set) + first * element, count, type, op);
    }
    std::memcpy(mine + first * element, round + first * element, static_cast<size_t>(count * element));
    reach(kDone, generation);
    if (!all_reached(kDone, generation, deadline, what)) return false;

    for (int r = 0; r < size_; ++r) {  // 3.
      if (r == rank_) continue;
      const int64_t at = begin(r);
      std::memcpy(round + at * element, slot(r, set) + at * element, static_cast<size_t>((begin(r + 1) - at) * element));
    }
  }
  return true;
}

}  // namespace datapar::detail::mpi
