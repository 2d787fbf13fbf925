// See runtime.h.
#include "process_group/mpi/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "datapar/error.h"
#include "process_group/collective_failure.h"

namespace datapar::detail::mpi {
namespace {

using namespace std::chrono_literals;

// Note [Polling]
// A non-blocking MPI operation advances only while someone calls into MPI (Open MPI has
// no progress thread), so waiting means calling MPI_Test in a loop, and a wait can give up
// at a deadline, which a blocking MPI call cannot. The loop must not cost latency: a 4 KiB
// all_reduce through shared memory takes a few microseconds, less than one wake-up from a
// sleep. So a wait spins for kSpinFor, then calls sched_yield between tests (free when
// nothing else wants the core; under oversubscription, e.g. 4 ranks on 2 cores, it hands
// the core to a peer that needs it), and naps only after kYieldFor, when the peers are
// clearly busy elsewhere (e.g. still computing their backward, as under DDP, where a
// polling thread would slow the compute on its core). A nap adds up to kNap to the wait
// once they arrive. Each wait starts its own phases: the ring all-reduce waits per segment,
// so a transfer in progress never naps. MPI's own blocking calls spin forever; this costs
// less CPU and ends at the deadline.
constexpr auto kSpinFor = 100us;
constexpr auto kYieldFor = 20ms;
constexpr auto kNap = 100us;

// Process-wide state. Never destroyed: atexit handlers and exiting threads use it.
struct State {
  std::mutex mutex;
  std::condition_variable idle;  // users dropped to 0
  int users = 0;                 // MpiUse guards held
  bool initialized = false;      // checked (and initialised if needed) by initialize()
  std::atomic<bool> finalizing{false};
  std::mutex kept_mutex;
  std::vector<at::Tensor> kept;  // buffers of abandoned requests: a peer failed or hangs
  std::atomic<int64_t> longest_timeout_ms{0};  // of the groups made: how long a peer may lag
};

State& state() {
  static State* s = new State;
  return *s;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// Note [Finalizing without a hung peer]
// Open MPI's MPI_Finalize waits for every process of the job (a fence), so a rank whose peer
// hangs (SIGSTOP, a deadlock, a lost node) would wait in it forever after reporting the
// error, and mpirun, which ends a job only when a process exits without finalizing or with
// an error, would never exit either. So MPI_Finalize runs under a deadline; past it the
// process exits with status 1, saying why, and mpirun ends the whole job. The deadline is
// the longest timeout of the groups made (a live peer may lag that long, e.g. writing a
// checkpoint) plus kFinalizeGrace. When a collective of this process failed or timed out
// (any backend's: gloo's under mpirun too) or an MPI request was abandoned at its deadline,
// a peer is known to be gone or stuck, and waiting a second group timeout for it only
// doubled the hang (issue 27: 5.5-10 minutes with the default timeouts): the wait is the
// grace alone. Live peers reach their own MPI_Finalize soon after the error they saw too,
// but each may first wait up to kUsersWait for its own operations to leave MPI, and the
// grace must outlast that: a 5 s grace against a peer's 5 s wait failed a job whose peers
// were all healthy (CI, under AddressSanitizer on a loaded machine).
constexpr auto kUsersWait = std::chrono::seconds(5);
constexpr auto kFinalizeGrace = kUsersWait + std::chrono::seconds(5);

// Runs at exit when datapar initialised MPI. Operations still polling see `finalizing`
// and leave MPI at once; one stuck inside a blocking MPI call (e.g. a subgroup's
// construction) would hold us forever, so the wait for them is bounded.
void finalize_at_exit() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.finalizing = true;
  s.idle.wait_for(lock, kUsersWait, [&] { return s.users == 0; });
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  bool abandoned = false;
  {
    std::lock_guard<std::mutex> kept(s.kept_mutex);
    abandoned = !s.kept.empty();
  }
  std::chrono::milliseconds wait(s.longest_timeout_ms.load());
  if (abandoned || detail::collective_failed()) wait = std::chrono::milliseconds(0);
  std::thread([deadline = wait + kFinalizeGrace] {  // Note [Finalizing without a hung peer]
    std::this_thread::sleep_for(deadline);
    static const char message[] =
        "datapar: MPI_Finalize did not return: a peer process is hung or gone; exiting without it.\n";
    (void)!::write(2, message, sizeof message - 1);
    ::_exit(1);
  }).detach();
  MPI_Finalize();
}

}  // namespace

void initialize() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.initialized) return;
  int finalized_already = 0;
  MPI_Finalized(&finalized_already);
  if (finalized_already || s.finalizing) {
    throw CommError("mpi: MPI was finalised already in this process and cannot be initialised again. Make the MPI "
                    "process groups before the program starts to exit, and keep MPI initialised while using them.");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // Note [Non-blocking all-reduce algorithm]: Open MPI's MPI_Iallreduce (libnbc) picks a
    // binomial tree (reduce to one rank, then broadcast) for fewer than 4 processes or an
    // in-place call, which is both of ours: twice the bytes on the critical path of the
    // one-node, 2-process case. Reduce-scatter + all-gather (Rabenseifner) halves that;
    // measured here with 2 processes: 4 KiB 34 -> 17 us, 1 MiB 750-850 -> 270-430 us,
    // 4 MiB 3.4-12 -> 0.9-1.6 ms. A user's own setting wins; other MPIs ignore the name.
    ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
    const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (code != MPI_SUCCESS) {
      throw CommError(str_cat("mpi: MPI_Init_thread failed (MPI error ", code, "). Start the program with mpirun ",
                              "(e.g. mpirun -np 2 ./app), or check the MPI installation with: mpirun -np 1 hostname"));
    }
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    throw CommError(str_cat(
        "mpi: MPI runs at ", thread_level_name(provided), " but datapar needs MPI_THREAD_MULTIPLE (its operations ",
        "run on their own threads). ",
        initialized ? "The program initialised MPI itself: call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                      "instead of MPI_Init, or leave initialisation to datapar."
                    : "This MPI library was built without thread support; use one that has it (Debian's Open MPI "
                      "does)."));
  }
  s.initialized = true;
}

MpiUse::MpiUse(const std::string& what) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.finalizing) {
    throw CommError(str_cat(what, ": MPI is being finalised because the program is exiting. Wait for the "
                                  "operations of MPI process groups before returning from main()."));
  }
  ++s.users;
}

MpiUse::~MpiUse() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (--s.users == 0 && s.finalizing) s.idle.notify_all();
}

bool finalized() {
  if (state().finalizing) return true;
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

void check(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  int error_class = MPI_ERR_OTHER;
  MPI_Error_class(code, &error_class);
  if (error_class == MPI_ERR_TRUNCATE) {
    throw InvalidArgumentError(str_cat(what, ": the message is larger than the tensor (", text,
                                       "). Send and receive tensors of the same size and dtype."));
  }
  throw CommError(str_cat(what, " failed: MPI error ", code, ": ", text,
                          ". A peer probably exited or the processes issued different operations; rebuild the "
                          "process group."));
}

void throw_if_finalizing(const std::string& what) {
  if (state().finalizing) {
    throw CommError(str_cat(what, ": abandoned because MPI is being finalised (the program is exiting)."));
  }
}

bool poll_until(const std::function<bool()>& done, Clock::time_point deadline, const std::string& what) {
  const Clock::time_point start = Clock::now();
  for (unsigned polls = 0;; ++polls) {
    if (done()) return true;
    if (polls % 8 != 7) continue;  // the clock and the flag every few polls
    throw_if_finalizing(what);
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    const auto waited = now - start;
    if (waited >= kYieldFor) {
      std::this_thread::sleep_for(kNap);
    } else if (waited >= kSpinFor) {
      std::this_thread::yield();
    }
  }
}

bool wait(MPI_Request& request, Clock::time_point deadline, const std::string& what, MPI_Status* status) {
  MPI_Status ignored;
  return poll_until(
      [&] {
        int done = 0;
        check(MPI_Test(&request, &done, status ? status : &ignored), what);
        return done != 0;
      },
      deadline, what);
}

void note_group_timeout(std::chrono::milliseconds timeout) {
  std::atomic<int64_t>& longest = state().longest_timeout_ms;
  int64_t seen = longest.load();
  while (timeout.count() > seen && !longest.compare_exchange_weak(seen, timeout.count())) {
  }
}

void keep_alive(const at::Tensor& buffer) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.kept_mutex);
  s.kept.push_back(buffer);
}

int max_tag() {
  static const int value = [] {
    void* attribute = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attribute, &found);
    return found ? *static_cast<int*>(attribute) : 32767;  // 32767: the least MPI allows
  }();
  return value;
}

}  // namespace datapar::detail::mpi
