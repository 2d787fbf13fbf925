// ElasticGroup. See datapar/ft/elastic_group.h.
#include "datapar/ft/elastic_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/rendezvous/prefix_store.h"
#include "ft/breakable_store.h"
#include "ft/standings.h"

namespace datapar::ft {
namespace {

using datapar::detail::str_cat;

}  // namespace

ElasticGroup::ElasticGroup(std::shared_ptr<Store> store, std::string run, FtOptions options, MakeGroup make_group,
                           ReplicaSlot slot)
    : store_(std::move(store)), run_(std::move(run)), options_(options), make_group_(std::move(make_group)) {
  DATAPAR_CHECK(store_ != nullptr, "ft::ElasticGroup: the store is null.");
  DATAPAR_CHECK(make_group_ != nullptr, "ft::ElasticGroup: no function makes the epochs' groups.");
  member_ = std::make_unique<Member>(store_, run_, options_, slot);
  member_->on_broken([this](int64_t epoch) {
    const std::lock_guard<std::mutex> lock(abort_mutex_);
    if (!abortable_ || group_epoch_ != epoch) return;
    abortable_->abort();
    for (const std::shared_ptr<ProcessGroup>& g : subgroups_) g->abort();
  });
}

ElasticGroup::~ElasticGroup() {
  retire();
  member_.reset();  // stops the heartbeat thread, the only other user of abortable_
  for (std::thread& reaper : reapers_) reaper.join();
}

void ElasticGroup::retire() {
  std::vector<std::shared_ptr<ProcessGroup>> subgroups;
  {
    const std::lock_guard<std::mutex> lock(abort_mutex_);
    abortable_.reset();
    group_epoch_ = 0;
    subgroups.swap(subgroups_);
  }
  for (std::shared_ptr<ProcessGroup>& g : subgroups) {
    g->abort();
    reapers_.emplace_back([group = std::move(g)]() mutable { group.reset(); });
  }
  if (!group_) return;
  group_->abort();
  // Its backend's thread may still be inside an operation it could not abandon (gloo's);
  // destroying the group waits for it, which must not hold up the next epoch.
  reapers_.emplace_back([group = std::move(group_)]() mutable { group.reset(); });
  group_ = nullptr;
}

const Membership& ElasticGroup::join(int64_t committed_step) {
  // Leaving a group that did not fail (the members agreed to grow): its connections reset
  // as it goes, so the others must be done with its last vote first.
  if (group_ && !group_->aborted()) leave();
  retire();
  epoch_ = member_->join(committed_step);
  rank_ = epoch_.rank_of(member_->id());
  group_ = make_epoch_group("", rank_, epoch_.size());
  const std::lock_guard<std::mutex> lock(abort_mutex_);
  abortable_ = group_;
  group_epoch_ = epoch_.number;
  // Broken while the group was made: the heartbeat thread's callback came too early for it.
  if (member_->epoch_broken()) group_->abort();
  return epoch_;
}

std::shared_ptr<ProcessGroup> ElasticGroup::make_epoch_group(const std::string& prefix, int rank, int size) {
  auto store = std::make_shared<detail::BreakableStore>(
      std::make_shared<PrefixStore>(str_cat("ft/", run_, "/", epoch_.number, "/", prefix), store_),
      [member = member_.get()] { return member->epoch_broken(); });
  std::shared_ptr<ProcessGroup> group;
  try {
    group = make_group_(std::move(store), rank, size);
  } catch (const std::exception& e) {
    // A backend may wrap the store's error in its own: a broken epoch is a failure of the
    // membership whatever the type (StepProtocol joins the next epoch).
    if (member_->epoch_broken()) {
      throw CommError(str_cat("ft: membership epoch ", epoch_.number, " broke while its group was being made (",
                              e.what(), ")"));
    }
    throw;
  }
  DATAPAR_CHECK(group != nullptr && group->size() == size && group->rank() == rank,
                "ft::ElasticGroup: the function that makes the groups returned no group, or one of the wrong size "
                "or rank.");
  return group;
}

std::shared_ptr<ProcessGroup> ElasticGroup::subgroup(const std::string& name, const std::vector<int>& ranks) {
  DATAPAR_CHECK(group_ != nullptr, "ft::ElasticGroup::subgroup: join() first.");
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  DATAPAR_CHECK(me != ranks.end(), "ft::ElasticGroup::subgroup: rank ", rank_, " is not among the ranks of \"", name,
                "\".");
  std::string prefix = "sub/" + name;
  for (int r : ranks) prefix += str_cat("-", r);
  std::shared_ptr<ProcessGroup> group =
      make_epoch_group(prefix + "/", static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()));
  const std::lock_guard<std::mutex> lock(abort_mutex_);
  subgroups_.push_back(group);
  if (member_->epoch_broken() || group_->aborted()) group->abort();
  return group;
}

void ElasticGroup::abort() {
  if (group_) group_->abort();
  const std::lock_guard<std::mutex> lock(abort_mutex_);
  for (const std::shared_ptr<ProcessGroup>& g : subgroups_) g->abort();
}

int64_t ElasticGroup::take_newest_state(int64_t committed_step, const std::function<std::string()>& save,
                                        const std::function<void(const std::string&)>& load) {
  DATAPAR_CHECK(group_ != nullptr, "ft::ElasticGroup::take_newest_state: join() first.");
  // The steps as the members have them, not as the record says (Standings: who is newest,
  // decided alike on every rank). No missed vote is applied here: a member behind loads.
  const detail::Standings standings(*group_, Standing{committed_step, 0, -1, 0}, {});
  const int64_t newest = standings.newest();
  bool anyone_behind = false;
  for (int r = 0; r < standings.size(); ++r) anyone_behind = anyone_behind || standings.step(r) < newest;
  if (!anyone_behind) return newest;
  const int root = standings.first_at_newest();
  const std::string bytes = broadcast_bytes(*group_, root, rank_ == root ? save() : std::string());
  if (committed_step < newest) load(bytes);
  return newest;
}

Vote ElasticGroup::vote(int64_t step) {
  DATAPAR_CHECK(group_ != nullptr, "ft::ElasticGroup::vote: join() first.");
  // Reduced by MIN: {may commit, no newcomer waits, step, -step}: the step's min and max.
  at::Tensor ballot =
      at::tensor({int64_t{member_->may_commit()}, int64_t{!member_->newcomer_waiting()}, step, -step}, at::kLong)
          .to(group_->device());
  group_->all_reduce(ballot, ReduceOp::kMin)->synchronize();
  const at::Tensor result = ballot.cpu();
  const int64_t* r = result.data_ptr<int64_t>();
  const bool same_step = r[2] == step && -r[3] == step;
  Vote vote;
  vote.commit = r[0] == 1 && same_step;
  vote.reconfigure = !vote.commit || r[1] == 0;
  return vote;
}

void ElasticGroup::leave() {
  if (rank_ < 0 || left_epoch_ == epoch_.number) return;
  left_epoch_ = epoch_.number;
  const std::string prefix = str_cat("ft/", run_, "/", epoch_.number, "/left/");
  store_->set(prefix + std::to_string(rank_), std::string("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < epoch_.size(); ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store_->wait(keys, options_.eviction_timeout);
  } catch (const TimeoutError&) {
    // A member died after the last vote: nobody is in a collective with it any more.
  }
}

}  // namespace datapar::ft
