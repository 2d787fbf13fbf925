// See shm_collectives.h.
//
// Note [Shared-memory collectives]
// Under DDP on one machine every core computes, so a collective is paid for in CPU time on
// the cores that train, not hidden behind them. Messages cost a rendezvous per step, a copy
// through the kernel and polling on both sides; here the members share one region instead.
// Each member owns two slots of the region (sets 0 and 1, used by alternate rounds) and a
// page of counters. An operation runs in rounds of at most one slot of data; a round is:
//   1. each member writes what the others need into its own slot, raises its `arrived`
//      counter to the round's generation, and waits until everyone's reached it;
//   2. each member reads from the others' slots what it needs.
// all_reduce needs a second meeting point: in step 2 member r reduces part r of the round
// (parts as in a ring: [len r / n, len (r + 1) / n)) from every slot into its buffer and
// copies the result into part r of its own slot, raises `done` and waits for everyone's;
// then it copies the other parts from their owners' slots. Every part is reduced once, by
// its owner, so all members end with the same bits. reduce_scatter is all_reduce's first
// half: member r reads from the others only block r, which it alone needs.
// A member overwrites its slot of set s in round g only after everyone arrived for round
// g - 1, i.e. after everyone finished reading round g - 2, the last round that used set s.
// A member that waits spins for kSpinFor (the others often arrive within microseconds),
// then yields the core between looks until kYieldFor (free when nothing else wants the
// core; under load a sleep would cost a wake-up, tens of microseconds, per meeting point),
// then sleeps on the late member's counter (a futex in the region) until it is raised, so
// that the core goes back to backward instead of to polling. While it waits it checks now
// and then whether the late member's process exited (a pidfd), so a killed member fails
// the others at once, not at the timeout.
//
// The region lives in /dev/shm only while the group is made: member 0 creates it, the
// others map it by name, and member 0 removes the name as soon as everyone answered, so a
// crash after the group is made leaves nothing behind. posix_fallocate reserves its pages
// up front: a full /dev/shm is then a fallback to the transport at creation, not a SIGBUS
// in the middle of training.
#include "collectives/shm_collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "datapar/error.h"
#include "collectives/reduce.h"
#include "collectives/aborted.h"
#include "stale_files.h"

namespace datapar::detail::shm {
namespace {

using namespace std::chrono_literals;

constexpr size_t kPage = 4096;
constexpr auto kSpinFor = 2us;
constexpr auto kYieldFor = 2ms;
constexpr auto kNapAtMost = 20ms;
constexpr int kArrived = 0;
constexpr int kDone = 1;
constexpr const char* kNamePrefix = "datapar-shm-";

// One round's data per slot: 2 MiB for up to 8 members, less for more (the region is
// 2 slots per member), never under 256 KiB. A multiple of every element size.
size_t slot_bytes(int size) {
  const size_t bytes = std::clamp<size_t>((16u << 20) / static_cast<size_t>(size), 256u << 10, 2u << 20);
  return bytes / 64 * 64;
}

// Page 0: the header; page 1 + r: member r's counters; then the slots, member by member,
// two sets each.
size_t region_bytes(int size) {
  return kPage * (1 + static_cast<size_t>(size)) + static_cast<size_t>(size) * 2 * slot_bytes(size);
}

struct Header {
  uint64_t nonce;  // member 0's random number: the others check that they mapped its region
};

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char target[128] = {};
  const ssize_t n = ::readlink(path, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string("?");
}

void* map(int fd, size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return base == MAP_FAILED ? nullptr : base;
}

// Member 0: a new region, and "name nonce" for the others; nullptr and "" if impossible.
void* make_region(size_t bytes, std::string& invitation) {
  // A region has a name only until every member mapped it; a member 0 killed before that
  // left one behind (stale_files.h). POSIX shared memory lives in /dev/shm on Linux.
  remove_stale_entries("/dev/shm", kNamePrefix);
  std::random_device random;
  const uint64_t nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
  char name[64];
  std::snprintf(name, sizeof name, "/%s%d-%016llx", kNamePrefix, static_cast<int>(::getpid()),
                static_cast<unsigned long long>(nonce));
  const int fd = ::shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  void* base = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0 ? map(fd, bytes) : nullptr;
  ::close(fd);
  if (base == nullptr) {
    ::shm_unlink(name);
    return nullptr;
  }
  static_cast<Header*>(base)->nonce = nonce;
  invitation = str_cat(name, ' ', nonce);
  return base;
}

// The other members: member 0's region, or nullptr if it is not reachable from here.
void* open_region(size_t bytes, const std::string& invitation) {
  std::istringstream in(invitation);
  std::string name;
  uint64_t nonce = 0;
  if (!(in >> name >> nonce)) return nullptr;
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes ? map(fd, bytes) : nullptr;
  ::close(fd);
  if (base != nullptr && static_cast<const Header*>(base)->nonce != nonce) {
    ::munmap(base, bytes);
    return nullptr;
  }
  return base;
}

// A descriptor that becomes readable when process `pid` exits; -1 if the kernel has none
// (before Linux 5.3) or the process is gone already.
int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  return -1;
#endif
}

// Whether a counter that reads `seen` reached `generation` (modulo 2^32).
bool reached(uint32_t seen, uint32_t generation) { return static_cast<int32_t>(seen - generation) >= 0; }

// futex(2) on a counter in memory shared between processes (so not FUTEX_PRIVATE_FLAG).
void futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace

// What members must share to share memory and to see each other's processes: the booted
// kernel, the /dev/shm mount, the pid namespace; and the network namespace, so that
// processes in separate network namespaces count as separate machines (as they do for
// everything else, e.g. the two-host tests).
std::string this_machine() {
  struct stat st {};
  const bool shm = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode);
  if (!shm) return "";  // no /dev/shm: share nothing
  return str_cat(first_line("/proc/sys/kernel/random/boot_id"), ' ', st.st_dev, ':', st.st_ino, ' ',
                 link_target("/proc/self/ns/pid"), ' ', link_target("/proc/self/ns/net"));
}

struct ShmCollectives::Flags {
  struct alignas(64) Counter {
    std::atomic<uint32_t> generation;  // the last round that reached this point; a futex word
  };
  Counter reached[2];  // [kArrived], [kDone]
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "the counters are futex words shared between processes");

std::vector<Member> introduce(Exchange& exchange, bool wanted, Clock::time_point deadline) {
  const std::string mine = str_cat(::getpid(), ' ', wanted ? this_machine() : "");
  DATAPAR_INTERNAL_ASSERT(mine.size() <= Exchange::kMaxText);
  std::vector<Member> members;
  for (const std::string& text : exchange.all_gather(mine, deadline)) {
    const size_t space = text.find(' ');
    members.push_back({std::atoi(text.substr(0, space).c_str()),
                       space == std::string::npos ? "" : text.substr(space + 1)});
  }
  return members;
}

std::unique_ptr<ShmCollectives> ShmCollectives::create(Exchange& exchange, int rank, int size, bool wanted,
                                                       std::chrono::milliseconds timeout) {
  const std::vector<Member> members = introduce(exchange, wanted, Clock::now() + timeout);
  DATAPAR_INTERNAL_ASSERT(static_cast<int>(members.size()) == size);
  std::vector<int> pids;
  for (const Member& m : members) {
    // Every member saw the same introductions, so all return here alike.
    if (m.machine.empty() || m.machine != members[0].machine) return nullptr;
    pids.push_back(m.pid);
  }
  return set_up(exchange, rank, std::move(pids), timeout);
}

std::unique_ptr<ShmCollectives> ShmCollectives::set_up(Exchange& exchange, int rank, std::vector<int> pids,
                                                       std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  const int size = static_cast<int>(pids.size());
  const size_t bytes = region_bytes(size);
  std::string invitation;
  void* base = rank == 0 ? make_region(bytes, invitation) : nullptr;
  const auto forget = [&] {  // the name goes once everyone answered, or on any error
    if (rank == 0 && !invitation.empty()) ::shm_unlink(invitation.substr(0, invitation.find(' ')).c_str());
  };
  bool everyone = false;
  try {
    const std::string offered = exchange.all_gather(invitation, deadline)[0];
    if (rank != 0 && !offered.empty()) base = open_region(bytes, offered);
    const std::vector<std::string> mapped = exchange.all_gather(base != nullptr ? "1" : "0", deadline);
    everyone = std::all_of(mapped.begin(), mapped.end(), [](const std::string& m) { return m == "1"; });
  } catch (...) {
    forget();
    if (base != nullptr) ::munmap(base, bytes);
    throw;
  }
  forget();
  if (!everyone) {
    if (base != nullptr) ::munmap(base, bytes);
    return nullptr;
  }
  std::vector<int> pidfds(static_cast<size_t>(size), -1);
  for (int r = 0; r < size; ++r) {
    if (pids[r] != ::getpid() && pids[r] > 0) pidfds[r] = open_pidfd(pids[r]);
  }
  return std::unique_ptr<ShmCollectives>(
      new ShmCollectives(base, bytes, rank, size, std::move(pidfds), std::move(pids), timeout));
}

ShmCollectives::ShmCollectives(void* base, size_t bytes, int rank, int size, std::vector<int> pidfds,
                               std::vector<int> pids, std::chrono::milliseconds timeout)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes(size)),
      pidfds_(std::move(pidfds)),
      pids_(std::move(pids)),
      timeout_(timeout) {}

ShmCollectives::~ShmCollectives() {
  ::munmap(base_, bytes_);
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

ShmCollectives::Flags& ShmCollectives::flags(int rank) const {
  static_assert(sizeof(Flags) <= kPage, "a member's counters fill at most their page");
  return *reinterpret_cast<Flags*>(static_cast<char*>(base_) + kPage * (1 + static_cast<size_t>(rank)));
}

char* ShmCollectives::slot(int rank, int set) const {
  const size_t index = 2 * static_cast<size_t>(rank) + static_cast<size_t>(set);
  return static_cast<char*>(base_) + kPage * (1 + static_cast<size_t>(size_)) + index * slot_bytes_;
}

int ShmCollectives::begin_round() { return static_cast<int>(++generation_ % 2); }

bool ShmCollectives::exited(int member) const {
  const int fd = pidfds_[static_cast<size_t>(member)];
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  const int pid = pids_[static_cast<size_t>(member)];
  return pid != ::getpid() && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

void ShmCollectives::check_usable(const std::string& what) const {
  if (aborted_.load(std::memory_order_acquire)) throw CommError(aborted_message(what));
  if (!broken_.empty()) {
    throw CommError(str_cat(what, ": this group is unusable since an earlier collective failed (", broken_,
                            "). Rebuild the process group (e.g. restart the job from a checkpoint)."));
  }
}

void ShmCollectives::fail_timeout(int late, const std::string& what) {
  broken_ = str_cat(what, " timed out");
  throw TimeoutError(str_cat(what, ": not finished after the group's timeout of ", seconds(timeout_), " s: rank ",
                             late, " did not arrive (hung, or behind the others: did every process issue the same ",
                             "collectives in the same order?). This group is unusable now; rebuild the process group."));
}

void ShmCollectives::fail_exited(int gone, const std::string& what) {
  broken_ = str_cat(what, " failed: rank ", gone, " exited");
  throw CommError(str_cat(what, " failed: Rank ", gone, " (process ", pids_[static_cast<size_t>(gone)],
                          " on this machine) exited. Rebuild the process group (e.g. restart the job from a ",
                          "checkpoint)."));
}

void ShmCollectives::fail_aborted(const std::string& what) {
  broken_ = "aborted";
  throw CommError(aborted_message(what));
}

void ShmCollectives::meet(int which, const std::string& what) {
  const uint32_t generation = generation_;
  std::atomic<uint32_t>& own = flags(rank_).reached[which].generation;
  own.store(generation, std::memory_order_release);
  futex(own, FUTEX_WAKE, INT_MAX, nullptr);
  const Clock::time_point start = Clock::now();
  for (int r = 0; r < size_; ++r) {
    std::atomic<uint32_t>& counter = flags(r).reached[which].generation;
    for (unsigned polls = 0;; ++polls) {
      const uint32_t seen = counter.load(std::memory_order_acquire);
      if (reached(seen, generation)) break;
      if (polls % 8 != 7) continue;
      const Clock::time_point now = Clock::now();
      if (now >= deadline_) fail_timeout(r, what);
      if (aborted_.load(std::memory_order_relaxed)) fail_aborted(what);
      if (now - start < kSpinFor) continue;
      if (polls % 64 == 63 && exited(r)) fail_exited(r, what);
      if (now - start < kYieldFor) {
        sched_yield();
        continue;
      }
      if (exited(r)) fail_exited(r, what);
      // Sleep until the member raises its counter (or a while passes: the deadline and
      // whether it still lives are checked between naps).
      const auto nap = std::min<Clock::duration>(deadline_ - now, kNapAtMost);
      const timespec timeout{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count())};
      futex(counter, FUTEX_WAIT, seen, &timeout);
    }
  }
}

void ShmCollectives::all_reduce(void* data, int64_t count, c10::ScalarType type, ReduceOp op,
                                const std::string& what) {
  check_usable(what);
  deadline_ = Clock::now() + timeout_;
  const int64_t element = static_cast<int64_t>(c10::elementSize(type));
  const int64_t per_round = static_cast<int64_t>(slot_bytes_) / element;
  char* bytes = static_cast<char*>(data);
  for (int64_t offset = 0; offset < count; offset += per_round) {
    const int64_t len = std::min(per_round, count - offset);
    const auto begin = [&](int part) { return len * part / size_; };  // parts: [begin(p), begin(p + 1))
    const int set = begin_round();
    char* round = bytes + offset * element;
    char* mine = slot(rank_, set);
    const int64_t first = begin(rank_);  // this member's part of the round
    const int64_t after = begin(rank_ + 1);
    // 1. Only the parts that others reduce: this member reads its own part from `round`.
    std::memcpy(mine, round, static_cast<size_t>(first * element));
    std::memcpy(mine + after * element, round + after * element, static_cast<size_t>((len - after) * element));
    meet(kArrived, what);
    // 2.
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) reduce_into(round + first * element, slot(r, set) + first * element, after - first, type, op);
    }
    std::memcpy(mine + first * element, round + first * element, static_cast<size_t>((after - first) * element));
    meet(kDone, what);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const int64_t at = begin(r);
      std::memcpy(round + at * element, slot(r, set) + at * element, static_cast<size_t>((begin(r + 1) - at) * element));
    }
  }
}

void ShmCollectives::reduce_scatter(const void* input, void* output, int64_t count, c10::ScalarType type,
                                    ReduceOp op, const std::string& what) {
  check_usable(what);
  deadline_ = Clock::now() + timeout_;
  const int64_t element = static_cast<int64_t>(c10::elementSize(type));
  const int64_t per_round = std::max<int64_t>(1, static_cast<int64_t>(slot_bytes_) / element / size_);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  for (int64_t offset = 0; offset < count; offset += per_round) {
    const int64_t len = std::min(per_round, count - offset);
    const size_t part = static_cast<size_t>(len * element);  // block d of the round sits at d * part
    const int set = begin_round();
    char* mine = slot(rank_, set);
    for (int d = 0; d < size_; ++d) {  // 1. what the others reduce
      if (d != rank_) std::memcpy(mine + d * part, in + (d * count + offset) * element, part);
    }
    meet(kArrived, what);
    char* result = out + offset * element;  // 2. this member's block, from every member
    std::memcpy(result, in + (rank_ * count + offset) * element, part);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) reduce_into(result, slot(r, set) + rank_ * part, len, type, op);
    }
  }
}

void ShmCollectives::all_gather(const void* input, const std::vector<void*>& outputs, size_t bytes,
                                const std::string& what) {
  DATAPAR_INTERNAL_ASSERT(outputs.size() == static_cast<size_t>(size_));
  check_usable(what);
  deadline_ = Clock::now() + timeout_;
  const char* in = static_cast<const char*>(input);
  for (size_t offset = 0; offset < bytes; offset += slot_bytes_) {
    const size_t len = std::min(slot_bytes_, bytes - offset);
    const int set = begin_round();
    std::memcpy(slot(rank_, set), in + offset, len);
    meet(kArrived, what);
    for (int r = 0; r < size_; ++r) {
      std::memcpy(static_cast<char*>(outputs[r]) + offset, r == rank_ ? in + offset : slot(r, set), len);
    }
  }
}

void ShmCollectives::broadcast(void* data, size_t bytes, int root, const std::string& what) {
  check_usable(what);
  deadline_ = Clock::now() + timeout_;
  char* buffer = static_cast<char*>(data);
  for (size_t offset = 0; offset < bytes; offset += slot_bytes_) {
    const size_t len = std::min(slot_bytes_, bytes - offset);
    const int set = begin_round();
    if (rank_ == root) std::memcpy(slot(rank_, set), buffer + offset, len);
    meet(kArrived, what);
    if (rank_ != root) std::memcpy(buffer + offset, slot(root, set), len);
  }
}

void ShmCollectives::barrier(const std::string& what) {
  check_usable(what);
  deadline_ = Clock::now() + timeout_;
  begin_round();
  meet(kArrived, what);
}

}  // namespace datapar::detail::shm
