// Decider. See datapar/ft/membership/decider.h.
#include "datapar/ft/membership/decider.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "datapar/rendezvous/prefix_store.h"
#include "datapar/warning.h"

namespace datapar::ft {
namespace {

using detail::str_cat;
using Clock = std::chrono::steady_clock;

bool holds(const Membership& e, const std::string& id) { return e.rank_of(id) >= 0; }

}  // namespace

Decider::Decider(std::shared_ptr<Store> store, const std::string& run, FtOptions options)
    : store_(std::make_shared<PrefixStore>("ft/" + run + "/", std::move(store))), options_(options) {
  DATAPAR_CHECK(options_.min_members >= 1 && options_.min_members <= options_.max_members,
                "ft::Decider: the minimum of members is ", options_.min_members, " and the maximum ",
                options_.max_members, "; use 1 <= minimum <= maximum.");
  group_size_ = options_.replica_group_size;
  DATAPAR_CHECK(group_size_ >= 0 && options_.max_members >= group_size_,
                "ft::Decider: replica groups of ", options_.replica_group_size, " members in a job of at most ",
                options_.max_members, "; the groups need at least one member and must fit in the job.");
  started_ = Clock::now();
  const auto period =
      std::max<std::chrono::milliseconds>(options_.heartbeat_interval / 2, std::chrono::milliseconds(1));
  thread_.start(period, [this] { return decide_once(); });
}

Decider::~Decider() { thread_.stop(); }

Membership Decider::epoch() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

std::string Decider::stop_reason() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stop_reason_;
}

bool Decider::training_complete() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return complete_;
}

bool Decider::decide_once() {
  try {
    read_joins();
    read_deaths();
    read_heartbeats();
    decide();
    last_error_.clear();
  } catch (const std::exception& e) {
    // Its own store answers unless this process is failing; say so once, and go on.
    if (last_error_ != e.what()) warn(str_cat("ft: the membership decider could not read the store: ", e.what()));
    last_error_ = e.what();
  }
  return stop_reason().empty();  // a verdict ends the deciding
}

void Decider::read_numbered(const std::string& counter, const std::string& item, int64_t& read,
                            const std::function<void(const std::string& key, const std::string& record)>& take) {
  const int64_t total = store_->add(counter, 0);
  while (read < total) {
    const std::string key = str_cat(item, read + 1);
    if (!store_->check({key})) return;  // numbered, not yet written: the next round
    const std::string record = as_text(store_->get(key));
    ++read;
    take(key, record);
  }
}

void Decider::read_joins() {
  read_numbered("joins", "join/", joins_read_, [&](const std::string& key, const std::string& record) {
    std::istringstream fields(record);
    Pending p;
    const bool read = static_cast<bool>(fields >> p.id >> p.step);
    int said = 1;  // the members per group the member says
    if (read && !(fields >> p.slot.group >> p.slot.index >> said)) p.slot = ReplicaSlot{};
    if (group_size_ == 0 && said >= 1 && said <= options_.max_members) group_size_ = said;  // the first join says
    const int k = std::max(group_size_, 1);
    const bool slot_ok = said == k && (k == 1 ? p.slot.group == -1
                                              : p.slot.group >= 0 && p.slot.index >= 0 && p.slot.index < k);
    if (!read || p.step < 0 || !slot_ok) {
      warn(str_cat("ft: ignoring a malformed join request \"", record, "\" (", key, ")",
                   k > 1 ? str_cat(": the job's members come in replica groups of ", k) : std::string()));
      return;
    }
    const auto now = Clock::now();
    if (evicted_.erase(p.id) > 0) store_->delete_key("evicted/" + p.id);  // back: admitted anew
    // A member of the current epoch asks again: its step failed (or it left the group), so
    // the others' collectives with it will not complete; they abort and join too. Not when
    // the members were asked to grow: they all join at that step boundary anyway.
    if (holds(current_, p.id) && !grow_signalled_ && !store_->check({str_cat("broken/", current_.number)})) {
      store_->set(str_cat("broken/", current_.number), p.id + " joined again");
    }
    seen_[p.id] = Seen{-1, now};                                          // its heartbeat counts from now
    if (pending_.empty()) first_pending_ = now;
    last_join_ = now;
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& q) { return q.id == p.id; });
    if (it != pending_.end()) {
      *it = p;
    } else {
      pending_.push_back(p);
    }
  });
}

void Decider::read_deaths() {
  read_numbered("deaths", "death/", deaths_read_, [&](const std::string&, const std::string& id) {
    if (evicted_.count(id) == 0) evict(id);
  });
}

void Decider::read_heartbeats() {
  std::vector<std::string> watched;
  for (const MembershipEntry& m : current_.members) watched.push_back(m.id);
  for (const Pending& p : pending_) watched.push_back(p.id);
  const auto now = Clock::now();
  for (const std::string& id : watched) {
    if (evicted_.count(id) > 0) continue;
    const int64_t beats = store_->add("hb/" + id, 0);
    Seen& seen = seen_[id];
    if (seen.beats != beats) seen = Seen{beats, now};  // judged by this clock alone: no skew
    if (now - seen.changed > options_.eviction_timeout) evict(id);
  }
}

void Decider::evict(const std::string& id) {
  evicted_.insert(id);
  store_->set("evicted/" + id, std::string("1"));
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.id == id; }),
                 pending_.end());
  if (holds(current_, id)) store_->set(str_cat("broken/", current_.number), id);
}

std::vector<Decider::Pending> Decider::admissible() const {
  const int k = group_size_;
  if (k <= 1) return pending_;
  // Group by group, the first member to ask for each slot; whole groups only.
  std::map<int, std::vector<const Pending*>> groups;
  for (const Pending& p : pending_) {
    std::vector<const Pending*>& slots = groups[p.slot.group];
    slots.resize(static_cast<size_t>(k), nullptr);
    if (slots[static_cast<size_t>(p.slot.index)] == nullptr) slots[static_cast<size_t>(p.slot.index)] = &p;
  }
  std::vector<Pending> out;
  for (const auto& [group, slots] : groups) {
    if (std::any_of(slots.begin(), slots.end(), [](const Pending* p) { return p == nullptr; })) continue;
    for (const Pending* p : slots) out.push_back(*p);
  }
  return out;
}

Membership Decider::next_epoch(const std::vector<Pending>& ready, int most) const {
  Membership next;
  next.number = current_.number + 1;
  if (group_size_ <= 1) {
    for (const MembershipEntry& m : current_.members) {  // the last epoch's members keep their order
      for (const Pending& p : ready) {
        if (p.id == m.id) next.members.push_back({p.id, p.step, p.slot});
      }
    }
    for (const Pending& p : ready) {
      if (!holds(current_, p.id)) next.members.push_back({p.id, p.step, p.slot});
    }
  } else {  // in group and slot order (admissible()'s): a group's ranks are consecutive
    for (const Pending& p : ready) next.members.push_back({p.id, p.step, p.slot});
  }
  next.members.resize(std::min<size_t>(next.members.size(), static_cast<size_t>(most)));
  return next;
}

void Decider::decide() {
  if (pending_.empty()) return;
  const auto now = Clock::now();
  auto pending = [&](const std::string& id) {
    return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.id == id; });
  };
  const std::vector<Pending> ready_members = admissible();
  bool all_back = true;
  for (const MembershipEntry& m : current_.members) {
    if (evicted_.count(m.id) == 0 && !pending(m.id)) all_back = false;
  }
  const bool newcomer = std::any_of(ready_members.begin(), ready_members.end(),
                                    [&](const Pending& p) { return !holds(current_, p.id); });
  if (current_.number > 0 && newcomer && !grow_signalled_ && current_.size() < options_.max_members) {
    store_->set(str_cat("grow/", current_.number), std::string("1"));
    grow_signalled_ = true;
  }
  const int k = std::max(group_size_, 1);
  const int most = options_.max_members / k * k;  // whole groups
  const int ready = std::min<int>(static_cast<int>(ready_members.size()), most);
  const int need =
      current_.number == 0 ? std::max(options_.min_members, options_.expected_members) : options_.min_members;
  const bool settled = !newcomer || ready >= most || now - last_join_ >= options_.settle_time;
  const bool timed_out = now - first_pending_ >= options_.quorum_timeout;
  // Without a member of the last epoch, the state it trained would be lost: newcomers alone
  // never form an epoch (they wait while the job runs at its maximum).
  const auto of_last_epoch = [&](const std::vector<Pending>& members) {
    return current_.number == 0 ||
           std::any_of(members.begin(), members.end(), [&](const Pending& p) { return holds(current_, p.id); });
  };
  const bool continues = of_last_epoch(ready_members);
  if (!of_last_epoch(pending_) && all_back) {  // every member of the last epoch is gone: so is its state
    Membership stop;
    stop.number = current_.number + 1;
    if (store_->check({"finished"})) {  // because they finished the training
      stop.complete = true;
      stop.stop_reason = str_cat("the members of epoch ", current_.number,
                                 " finished it before this member could join; nothing is left to train");
    } else {
      stop.stop_reason = str_cat("every member of epoch ", current_.number,
                                 " is gone, and with them the state they trained (new members have none to "
                                 "take). Resume the job from its last checkpoint");
    }
    publish(stop);
    return;
  }
  const bool complete = all_back && ready >= need && settled;
  // In time, the members that did not join again (alive, but stuck) are left out.
  const bool without_stragglers = timed_out && continues && ready >= options_.min_members;
  if (!complete && !without_stragglers) {
    if (timed_out && all_back && ready < need) {  // every live member is here, and too few
      Membership stop;
      stop.number = current_.number + 1;
      stop.stop_reason = str_cat("only ", ready, " member(s) joined within the quorum timeout (",
                                 options_.quorum_timeout.count(), " ms), and the job needs at least ",
                                 options_.min_members, " (--min-ranks). Resume it from its last checkpoint");
      publish(stop);
    }
    return;
  }
  Membership next = next_epoch(ready_members, most);
  bool left_out = false;  // a live member of the last epoch that did not join in time
  for (const MembershipEntry& m : current_.members) {
    if (evicted_.count(m.id) == 0 && !holds(next, m.id)) left_out = true;
  }
  if (left_out && current_.number > 0) store_->set(str_cat("broken/", current_.number), std::string("left out"));
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return holds(next, p.id); }),
                 pending_.end());
  if (!pending_.empty()) first_pending_ = now;
  publish(next);
}

void Decider::publish(Membership epoch) {
  // The decider is the only writer of epoch records, so a record already there was forged
  // (whoever holds the job's token can write the store; issue 46). Members may have formed
  // it: it is marked broken, so that their collectives abort and they join again, and this
  // record takes the next number. Members read the numbers in order: they get here too.
  const auto record_verdict = [&](const Membership& verdict) {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_reason_ = verdict.stop_reason;
    complete_ = verdict.complete;
  };
  if (!epoch.stop_reason.empty()) record_verdict(epoch);  // known here before a member can read it
  try {
    for (;;) {
      const std::string record = epoch.encode();
      const Bytes mine(record.begin(), record.end());
      if (store_->compare_set(str_cat("epoch/", epoch.number), {}, mine) == mine) break;
      warn(str_cat("ft: membership epoch ", epoch.number, " in the store was not written by the decider (forged?); "
                   "it is marked broken and the members go on in epoch ", epoch.number + 1));
      store_->set(str_cat("broken/", epoch.number), std::string("forged"));
      ++epoch.number;
    }
    store_->set("epoch", std::to_string(epoch.number));
  } catch (...) {
    record_verdict(Membership{});  // not published: the next round decides again
    throw;
  }
  grow_signalled_ = false;
  if (epoch.stop_reason.empty()) {
    const std::lock_guard<std::mutex> lock(mutex_);
    current_ = std::move(epoch);
  }
}

void report_dead(std::shared_ptr<Store> store, const std::string& run, const std::string& id) {
  PrefixStore keys("ft/" + run + "/", std::move(store));
  const int64_t n = keys.add("deaths", 1);
  keys.set(str_cat("death/", n), id);
}

}  // namespace datapar::ft
