// Member. See datapar/ft/membership/member.h; the store's keys are in decider.h.
#include "datapar/ft/membership/member.h"

#include <algorithm>
#include <string>

#include "datapar/rendezvous/prefix_store.h"
#include "random_bytes.h"

namespace datapar::ft {
namespace {

using detail::str_cat;
using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

Member::Member(std::shared_ptr<Store> store, const std::string& run, FtOptions options, ReplicaSlot slot)
    : options_(options), slot_(slot), id_(detail::random_hex(8)), last_beat_ns_(now_ns()) {
  if (id_.empty()) throw Error("ft::Member: cannot read random bytes for this member's id");
  const int k = options_.replica_group_size;
  DATAPAR_CHECK(k >= 1 && (k == 1 ? slot_.group == -1 : slot_.group >= 0 && slot_.index >= 0 && slot_.index < k),
                "ft::Member: replica groups of ", k, " members and the slot (group ", slot_.group, ", index ",
                slot_.index, "); give each member of a job in replica groups its group and its index below ", k,
                ", and none without.");
  store_ = std::make_shared<PrefixStore>("ft/" + run + "/", std::move(store));
  heartbeat_ =
      store_->clone(std::max<std::chrono::milliseconds>(options_.heartbeat_interval * 2, std::chrono::seconds(1)));
  if (!heartbeat_) heartbeat_ = store_;
  heartbeat_->add("hb/" + id_, 1);  // alive before it joins: the decider counts from here
  heartbeat_thread_.start(options_.heartbeat_interval, [this] {
    beat();
    return true;
  });
}

Member::~Member() { heartbeat_thread_.stop(); }

void Member::beat() {
  try {
    heartbeat_->add("hb/" + id_, 1);
    const int64_t beat = now_ns();
    const int64_t e = epoch_number_;
    if (e > 0 && broken_epoch_ != e && heartbeat_->check({str_cat("broken/", e)})) {
      broken_epoch_ = e;
      std::function<void(int64_t)> callback;
      {
        const std::lock_guard<std::mutex> guard(mutex_);
        callback = on_broken_;
      }
      if (callback) callback(e);
    }
    if (e > 0 && grow_epoch_ != e && heartbeat_->check({str_cat("grow/", e)})) grow_epoch_ = e;
    // Set only if no join() completed meanwhile (it clears the flag, and the decider the
    // key, when the member is admitted again).
    if (!evicted_ && heartbeat_->check({"evicted/" + id_}) && epoch_number_ == e) evicted_ = true;
    // Renewed last: a process that resumes after a stop learns of its eviction first.
    last_beat_ns_ = beat;
  } catch (const std::exception&) {
    // The store did not answer: the lease runs out (may_commit() turns false), and join()
    // reports the store gone.
  }
}

Membership Member::join(int64_t committed_step) {
  DATAPAR_CHECK(committed_step >= 0, "ft::Member::join: the committed step is ", committed_step, ", not >= 0.");
  // Longer than the decider's own wait, so that its verdict (a stop, with the reason) comes
  // first: it reads this join up to a round late, and then may settle.
  const auto patience = options_.quorum_timeout + options_.settle_time + 4 * options_.heartbeat_interval;
  const auto deadline = Clock::now() + patience;
  auto gone = [&](const std::exception& e) {
    return MembershipError(str_cat("ft: member ", id_, " cannot reach the job's store (", e.what(),
                                   "): the process that hosts it and the membership decider (the launcher of node 0) "
                                   "is gone, so no new membership can form. The job stops; resume it from its last "
                                   "checkpoint."));
  };
  int64_t last = epoch_number_;
  try {
    // The published epoch first: any epoch that can hold this join comes after it.
    if (store_->check({"epoch"})) {
      const int64_t published = std::stoll(as_text(store_->get("epoch")));
      const Membership newest = Membership::decode(published, as_text(store_->get(str_cat("epoch/", published))));
      if (!newest.stop_reason.empty()) newest.throw_verdict();
      last = std::max(last, published);
    }
    const int64_t n = store_->add("joins", 1);
    std::string request = str_cat(id_, ' ', committed_step);
    if (slot_.group >= 0) request += str_cat(' ', slot_.group, ' ', slot_.index, ' ', options_.replica_group_size);
    store_->set(str_cat("join/", n), request);
  } catch (const MembershipError&) {
    throw;
  } catch (const std::exception& e) {
    throw gone(e);
  }
  for (int64_t e = last + 1;; ++e) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Membership got;
    try {
      if (left.count() <= 0) throw TimeoutError("no time left");
      store_->wait({str_cat("epoch/", e)}, left);
      got = Membership::decode(e, as_text(store_->get(str_cat("epoch/", e))));
    } catch (const TimeoutError&) {
      throw MembershipError(str_cat("ft: member ", id_, " asked to join at step ", committed_step,
                                    " and no membership epoch took it within the quorum timeout (", patience.count(),
                                    " ms; the last epoch was ", e - 1,
                                    "). Is the decider running (datapar launch with --fault-tolerant), is the "
                                    "job above its maximum of members",
                                    slot_.group >= 0 ? ", or did a member of this one's replica group not come back" : "",
                                    "?"));
    } catch (const MembershipError&) {
      throw;
    } catch (const std::exception& error) {
      throw gone(error);
    }
    if (!got.stop_reason.empty()) got.throw_verdict();
    if (got.rank_of(id_) < 0) continue;  // formed without it (above the maximum): the next
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      epoch_ = got;
    }
    epoch_number_ = e;
    evicted_ = false;
    return got;
  }
}

void Member::finished() {
  try {
    store_->set("finished", std::string("1"));
  } catch (const std::exception&) {
    // The store is gone: no member will join any more either.
  }
}

Membership Member::epoch() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

bool Member::may_commit() const {
  const int64_t fresh_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.eviction_timeout).count() / 2;
  return now_ns() - last_beat_ns_ < fresh_ns && !evicted_ && !epoch_broken() && epoch_number_ > 0;
}

bool Member::epoch_broken() const {
  const int64_t e = epoch_number_;
  return e > 0 && broken_epoch_ == e;
}

bool Member::newcomer_waiting() const {
  const int64_t e = epoch_number_;
  return e > 0 && grow_epoch_ == e;
}

void Member::on_broken(std::function<void(int64_t epoch)> callback) {
  const std::lock_guard<std::mutex> lock(mutex_);
  on_broken_ = std::move(callback);
}

}  // namespace datapar::ft
