// See stall_inspector.h.
//
// Note [Stall inspection]
// Collectives are matched by order, so a collective that never completes usually means that
// some rank has not issued it yet: it is slower, stopped, or issuing other collectives. Each
// rank counts the collectives its group issued and publishes the count to the group's
// store ("issued/<rank>"), from a thread, when it changed, at most every `period`. The same
// thread looks at the oldest collective still pending; once it has waited `warn_after`, the
// thread reads the others' counts and warns once for it, naming the ranks whose count is
// below its number, and how far they got. The warning is a hint, not a verdict: counts are
// up to a period old, and a rank that issued the collective and then stopped looks like one
// that is only slow; the group's timeout still ends the wait with an error. One inspector
// serves every collective of its group, whoever waits for them (DDP's buckets, a
// barrier, ...). A rank that died is named by the error the group raises, not here.
// The store lives in rank 0's process. When rank 0 is stopped or hung, a store call would
// wait the store's whole timeout, and the warning never came (issue 27): so the inspector
// has a connection of its own (Store::clone) whose calls wait at most half the stall
// interval (0.25 to 5 s), and when the store does not answer, the warning (and the error's
// hint) says so, naming where it is served.
#include "process_group/stall_inspector.h"

#include <algorithm>
#include <vector>

#include "datapar/error.h"
#include "datapar/warning.h"

namespace datapar::detail {
namespace {

std::string count_key(int rank) { return "issued/" + std::to_string(rank); }

// How long a call of the inspector's may wait for the store: half the stall interval,
// within these bounds (far above a live store's milliseconds), so that a silent store is
// known by the time a warning is due, and the group's exit is not held up.
constexpr std::chrono::milliseconds kMinProbeTimeout{250};
constexpr std::chrono::milliseconds kMaxProbeTimeout{5000};

long long whole_seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

// "rank(s) 1 (at 4), 3 (at 4) have not issued it yet", from behind()'s list.
std::string not_issued(const std::string& ranks) { return str_cat("rank(s) ", ranks, " have not issued it yet"); }

}  // namespace

StallInspector::StallInspector(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds warn_after)
    : store_(std::move(store)), rank_(rank), size_(size), warn_after_ms_(warn_after.count()) {
  DATAPAR_CHECK(store_ != nullptr, "StallInspector: the store is null.");
  thread_.start([this] { return period(); },
                [this] {
                  inspect();
                  return true;
                });
}

StallInspector::~StallInspector() = default;  // thread_ stops first

void StallInspector::set_warn_after(std::chrono::milliseconds after) {
  warn_after_ms_ = after.count();
  thread_.wake();  // a wait of the old period's length may be far too long
}

void StallInspector::issued(std::shared_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({++issued_, std::move(work), Clock::now()});
}

std::shared_ptr<Store> StallInspector::probe() {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  if (!probe_) {
    probe_timeout_ = std::clamp(std::chrono::milliseconds(warn_after_ms_.load() / 2), kMinProbeTimeout,
                                kMaxProbeTimeout);
    probe_ = store_->clone(probe_timeout_);  // a new connection: may wait probe_timeout_, then throw
    if (!probe_) probe_ = store_;
  }
  return probe_;
}

template <typename Call>
bool StallInspector::on_store(Call&& call) {
  try {
    call(*probe());
    std::lock_guard<std::mutex> lock(probe_mutex_);
    silent_since_.reset();
    return true;
  } catch (const std::exception&) {
    std::lock_guard<std::mutex> lock(probe_mutex_);
    if (!silent_since_) silent_since_ = Clock::now() - probe_timeout_;  // it was silent that long already
    if (probe_ != store_) probe_.reset();  // a clone that failed is closed for good: connect again next time
    return false;
  }
}

std::string StallInspector::store_silence() {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  if (!silent_since_) return "";
  const std::string where = store_->address();
  return str_cat("the job's store", where.empty() ? "" : " at " + where, " has not answered for ",
                 whole_seconds(Clock::now() - *silent_since_), " s: the process that serves it (rank 0, in jobs ",
                 "datapar starts) is stopped, hung or cut off from this one");
}

std::chrono::milliseconds StallInspector::period() const {
  return std::clamp<std::chrono::milliseconds>(std::chrono::milliseconds(warn_after_ms_.load()) / 4,
                                               std::chrono::milliseconds(10), std::chrono::seconds(1));
}

void StallInspector::inspect() {
  const std::chrono::milliseconds warn_after(warn_after_ms_.load());
  uint64_t count = 0;
  std::optional<Pending> stalled;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const Pending& p) { return p.work->is_completed(); }),
                   pending_.end());
    count = issued_;
    if (warn_after.count() > 0 && !pending_.empty() && pending_.front().number > warned_ &&
        Clock::now() - pending_.front().since >= warn_after) {
      stalled = pending_.front();
    }
  }
  if (stalled) {  // first: a silent store must not hold the warning up
    std::string message;
    if (store_silence().empty()) {
      on_store([&](Store&) { message = stall_message(*stalled, Clock::now() - stalled->since); });
    }
    if (message.empty()) {
      message = str_cat(stalled->work->what(), ", collective ", stalled->number, " of this group, has not completed ",
                        "after ", whole_seconds(Clock::now() - stalled->since), " s, and ", store_silence(),
                        ". It fails when the group's timeout ends.");
    }
    warn(message);
    warned_ = stalled->number;
  }
  if (count != published_) {
    if (on_store([&](Store& s) { s.set(count_key(rank_), std::to_string(count)); })) published_ = count;
  }
}

std::string StallInspector::behind(uint64_t number) {
  Store& store = *probe();
  std::string ranks;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    int64_t theirs = 0;
    if (store.check({count_key(r)})) theirs = std::stoll(store.get_string(count_key(r)));
    if (theirs >= static_cast<int64_t>(number)) continue;
    ranks += str_cat(ranks.empty() ? "" : ", ", r, " (at ", theirs, ")");
  }
  return ranks;
}

std::string StallInspector::ranks_behind() {
  uint64_t oldest = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Pending& p : pending_) {
      if (!p.work->is_completed()) {
        oldest = p.number;
        break;
      }
    }
  }
  if (oldest == 0) return "";
  std::string ranks;
  if (!on_store([&](Store&) { ranks = behind(oldest); })) return store_silence();
  return ranks.empty() ? "" : not_issued(ranks);
}

std::string StallInspector::stall_message(const Pending& stalled, Clock::duration waited) {
  const std::string behind = this->behind(stalled.number);
  return str_cat(stalled.work->what(), ", collective ", stalled.number, " of this group, has not completed after ",
                 whole_seconds(waited), " s: ",
                 behind.empty() ? "every rank has issued it (a slow or stopped peer, or the network?)"
                                : not_issued(behind),
                 ". It fails when the group's timeout ends.");
}

}  // namespace datapar::detail
