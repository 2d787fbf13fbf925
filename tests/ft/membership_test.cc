// Fault-tolerant membership (datapar/ft/, issue 31) with the decider and the members as
// objects of one process, each member joining from a thread of its own (in the threaded
// list: ThreadSanitizer runs these): epochs, eviction, growth, the minimum, the records.
// Members as processes killed and stopped: membership_process_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <functional>
#include <memory>
#include <set>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "datapar/ft/membership/decider.h"
#include "datapar/ft/elastic_group.h"
#include "datapar/ft/membership/member.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/prefix_store.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/expect_throw.h"

namespace datapar::ft {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

FtOptions fast(int expected) {
  FtOptions o;
  o.heartbeat_interval = 50ms;
  o.eviction_timeout = 600ms;
  o.settle_time = 200ms;
  o.quorum_timeout = 5s;
  o.expected_members = expected;
  return o;
}

// A store served by this process, and connections to it.
class ServedStore {
 public:
  ServedStore() : server_(std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, "ft-test", 10s, ""})) {}
  std::shared_ptr<TcpStore> connect() const {
    return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", server_->port(), false, "ft-test", 10s, ""});
  }

 private:
  std::shared_ptr<TcpStore> server_;
};

// Each member joins at `steps[i]` from a thread of its own (a join waits for the others).
std::vector<Membership> join_all(const std::vector<Member*>& members, const std::vector<int64_t>& steps) {
  std::vector<std::future<Membership>> joins;
  for (size_t i = 0; i < members.size(); ++i) {
    joins.push_back(std::async(std::launch::async, [&, i] { return members[i]->join(steps[i]); }));
  }
  std::vector<Membership> out;
  for (auto& j : joins) out.push_back(j.get());
  return out;
}

template <typename Condition>
bool within(std::chrono::milliseconds limit, Condition condition) {
  for (const auto deadline = Clock::now() + limit; Clock::now() < deadline; std::this_thread::sleep_for(10ms)) {
    if (condition()) return true;
  }
  return condition();
}

TEST(FtMembershipRecord, ReadsBack) {
  Membership e;
  e.number = 4;
  e.members = {{"a", 5}, {"b", 3}, {"c", 5}, {"d", 3}, {"e", 3, ReplicaSlot{2, 1}}};
  const Membership back = Membership::decode(4, e.encode());
  EXPECT_EQ(back.members[4].slot.group, 2);
  EXPECT_EQ(back.members[4].slot.index, 1);
  EXPECT_EQ(back.members[0].slot.group, -1);
  ASSERT_EQ(back.size(), 5);
  EXPECT_EQ(back.members[3].id, "d");
  EXPECT_EQ(back.rank_of("c"), 2);
  EXPECT_EQ(back.rank_of("z"), -1);
  EXPECT_EQ(back.members[2].committed_step, 5);
  Membership stop;
  stop.stop_reason = "only 1 member(s)";
  EXPECT_EQ(Membership::decode(5, stop.encode()).stop_reason, "only 1 member(s)");
  EXPECT_THROW_MSG(Membership::decode(6, "a 5\nb\n"), MembershipError, "malformed record line \"b\"");
  EXPECT_THROW_MSG(Membership::decode(6, "a -1\n"), MembershipError, "malformed");
  EXPECT_THROW_MSG(Membership::decode(6, ""), MembershipError, "no members");
}

// Three members form epoch 1; one stops (its heartbeat with it): within the eviction timeout
// the others see their epoch broken and may not commit; they join again and form epoch 2.
TEST(FtMembership, AMemberWhoseHeartbeatStopsIsEvictedAndTheOthersFormTheNextEpoch) {
  const ServedStore store;
  const FtOptions options = fast(3);
  const Decider decider(store.connect(), "job", options);
  std::vector<std::unique_ptr<Member>> members;
  for (int i = 0; i < 3; ++i) members.push_back(std::make_unique<Member>(store.connect(), "job", options));
  const std::vector<Membership> first = join_all({members[0].get(), members[1].get(), members[2].get()}, {0, 0, 0});
  std::set<int> ranks;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(first[i].number, 1);
    EXPECT_EQ(first[i].size(), 3);
    ranks.insert(first[i].rank_of(members[i]->id()));
    EXPECT_TRUE(members[i]->may_commit());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));

  const auto stopped = Clock::now();
  members[2].reset();
  ASSERT_TRUE(within(options.eviction_timeout + 2s, [&] { return members[0]->epoch_broken(); }));
  EXPECT_LT(Clock::now() - stopped, options.eviction_timeout + 1500ms);
  EXPECT_FALSE(members[0]->may_commit()) << "a broken epoch commits nothing";
  const std::vector<Membership> second = join_all({members[0].get(), members[1].get()}, {5, 5});
  const bool first_before_second = first[0].rank_of(members[0]->id()) < first[0].rank_of(members[1]->id());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(second[i].number, 2);
    EXPECT_EQ(second[i].size(), 2);
    EXPECT_EQ(second[i].rank_of(members[i]->id()), (i == 0) == first_before_second ? 0 : 1) << "the order kept";
    EXPECT_EQ(second[i].members[0].committed_step, 5);
    EXPECT_EQ(second[i].members[1].committed_step, 5);
    EXPECT_TRUE(members[i]->may_commit());
  }
  EXPECT_TRUE(within(1s, [&] { return decider.epoch().number == 2; }));  // it publishes, then notes
}

// A member reported dead by the process that saw it die (its launcher) is evicted at once:
// the others go on long before its heartbeat would go stale.
TEST(FtMembership, AMemberReportedDeadIsEvictedWithoutWaitingForItsHeartbeat) {
  const ServedStore store;
  FtOptions options = fast(3);
  options.eviction_timeout = 60s;  // the heartbeat alone would take a minute
  options.quorum_timeout = 120s;
  const Decider decider(store.connect(), "job", options);
  std::vector<std::unique_ptr<Member>> members;
  for (int i = 0; i < 3; ++i) members.push_back(std::make_unique<Member>(store.connect(), "job", options));
  join_all({members[0].get(), members[1].get(), members[2].get()}, {0, 0, 0});
  const std::string dead = members[2]->id();
  members[2].reset();
  report_dead(store.connect(), "job", dead);
  ASSERT_TRUE(within(10s, [&] { return members[0]->epoch_broken() && members[1]->epoch_broken(); }));
  const std::vector<Membership> next = join_all({members[0].get(), members[1].get()}, {3, 3});
  EXPECT_EQ(next[0].number, 2);
  EXPECT_EQ(next[0].size(), 2);
  EXPECT_EQ(next[0].rank_of(dead), -1);
  // An id nobody knows changes nothing.
  report_dead(store.connect(), "job", "no-such-member");
  std::this_thread::sleep_for(4 * options.heartbeat_interval);
  EXPECT_FALSE(members[0]->epoch_broken());
  EXPECT_TRUE(members[0]->may_commit());
}

// A new member waits; the members learn it (newcomer_waiting), join again at their step, and
// the epoch grows: the old members keep their ranks, the newcomer gets its state from one.
TEST(FtMembership, ANewMemberGrowsTheJobAtAStepBoundaryAndIsHealedFromAnUpToDateOne) {
  const ServedStore store;
  const FtOptions options = fast(2);
  const Decider decider(store.connect(), "job", options);
  Member a(store.connect(), "job", options), b(store.connect(), "job", options);
  const std::vector<Membership> first = join_all({&a, &b}, {0, 0});
  ASSERT_EQ(first[0].size(), 2);
  Member newcomer(store.connect(), "job", options);
  auto joined = std::async(std::launch::async, [&] { return newcomer.join(0); });
  ASSERT_TRUE(within(3s, [&] { return a.newcomer_waiting() && b.newcomer_waiting(); }));
  EXPECT_TRUE(a.may_commit()) << "a waiting newcomer breaks nothing";
  const std::vector<Membership> second = join_all({&a, &b}, {7, 7});
  const Membership grown = joined.get();
  EXPECT_EQ(grown.number, 2);
  ASSERT_EQ(grown.size(), 3);
  EXPECT_EQ(grown.rank_of(a.id()), first[0].rank_of(a.id()));
  EXPECT_EQ(grown.rank_of(b.id()), first[0].rank_of(b.id()));
  EXPECT_EQ(grown.rank_of(newcomer.id()), 2);
  EXPECT_EQ(grown.members[0].committed_step, 7);
  EXPECT_EQ(grown.members[2].committed_step, 0);  // behind: ElasticGroup::take_newest_state sends it the state
  EXPECT_EQ(second[0].encode(), grown.encode());
}

// Below the minimum no epoch forms: after the quorum timeout every join fails with why.
TEST(FtMembership, BelowTheMinimumTheJobStopsWithTheReason) {
  const ServedStore store;
  FtOptions options = fast(2);
  options.min_members = 2;
  options.quorum_timeout = 1500ms;
  const Decider decider(store.connect(), "job", options);
  auto a = std::make_unique<Member>(store.connect(), "job", options);
  auto b = std::make_unique<Member>(store.connect(), "job", options);
  join_all({a.get(), b.get()}, {0, 0});
  b.reset();
  ASSERT_TRUE(within(options.eviction_timeout + 2s, [&] { return a->epoch_broken(); }));
  EXPECT_THROW_MSG(a->join(3), MembershipError,
                   "the job stops: only 1 member(s) joined within the quorum timeout (1500 ms), and the job needs "
                   "at least 2 (--min-ranks)");
  EXPECT_TRUE(within(1s, [&] { return !decider.stop_reason().empty(); }));
  Member late(store.connect(), "job", options);  // told at once, not after its own wait
  const auto asked = Clock::now();
  EXPECT_THROW_MSG(late.join(0), MembershipError, "the job stops: only 1 member(s)");
  EXPECT_LT(Clock::now() - asked, options.quorum_timeout);
}

// At the maximum a newcomer waits, and never forms an epoch alone (the members' state would
// be lost to it): the members train on, undisturbed, and its join fails in time.
TEST(FtMembership, AtTheMaximumANewcomerWaitsAndNeverFormsAnEpochAlone) {
  const ServedStore store;
  FtOptions options = fast(2);
  options.max_members = 2;
  options.quorum_timeout = 800ms;
  const Decider decider(store.connect(), "job", options);
  Member a(store.connect(), "job", options), b(store.connect(), "job", options);
  join_all({&a, &b}, {4, 4});
  Member newcomer(store.connect(), "job", options);
  EXPECT_THROW_MSG(newcomer.join(0), MembershipError, "is the job above its maximum of members?");
  EXPECT_EQ(decider.epoch().number, 1);
  EXPECT_FALSE(a.newcomer_waiting()) << "no room: no reason to join again";
  EXPECT_TRUE(a.may_commit());
  EXPECT_TRUE(b.may_commit());
}

// Replica groups of two (HSDP's): a member lost takes its group out of the job as a whole.
// The other group forms the next epoch alone; the lost member's group-mate waits in join()
// (its group is not whole) and grows nothing; a replacement in the lost slot makes the group
// whole again, the job grows at a step boundary, and the ranks follow group and slot order.
TEST(FtMembership, InReplicaGroupsAMemberLostTakesItsGroupOutUntilItsSlotIsFilledAgain) {
  const ServedStore store;
  FtOptions options = fast(4);
  options.replica_group_size = 2;
  const Decider decider(store.connect(), "job", options);
  std::vector<std::unique_ptr<Member>> members;
  for (const ReplicaSlot slot : {ReplicaSlot{1, 1}, ReplicaSlot{0, 0}, ReplicaSlot{1, 0}, ReplicaSlot{0, 1}}) {
    members.push_back(std::make_unique<Member>(store.connect(), "job", options, slot));
  }
  const auto rank_of_slot = [](const Membership& e, int group, int index) {
    for (int r = 0; r < e.size(); ++r) {
      if (e.members[r].slot.group == group && e.members[r].slot.index == index) return r;
    }
    return -1;
  };
  const std::vector<Membership> first =
      join_all({members[0].get(), members[1].get(), members[2].get(), members[3].get()}, {0, 0, 0, 0});
  ASSERT_EQ(first[0].size(), 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rank_of_slot(first[0], r / 2, r % 2), r) << first[0].encode();
  EXPECT_EQ(first[0].encode(), first[3].encode());

  members[2].reset();  // group 1, slot 0
  ASSERT_TRUE(within(options.eviction_timeout + 2s, [&] { return members[1]->epoch_broken(); }));
  auto waiting = std::async(std::launch::async, [&] { return members[0]->join(6); });  // its group is not whole
  const std::vector<Membership> second = join_all({members[1].get(), members[3].get()}, {6, 6});
  EXPECT_EQ(second[0].number, 2);
  ASSERT_EQ(second[0].size(), 2) << second[0].encode();
  EXPECT_EQ(rank_of_slot(second[0], 0, 0), 0);
  EXPECT_EQ(rank_of_slot(second[0], 0, 1), 1);
  std::this_thread::sleep_for(options.settle_time + 4 * options.heartbeat_interval);
  EXPECT_FALSE(members[1]->newcomer_waiting()) << "half a group is no reason to join again";
  EXPECT_TRUE(members[1]->may_commit());
  EXPECT_EQ(waiting.wait_for(0s), std::future_status::timeout);

  Member replacement(store.connect(), "job", options, ReplicaSlot{1, 0});
  auto replaced = std::async(std::launch::async, [&] { return replacement.join(0); });
  ASSERT_TRUE(within(3s, [&] { return members[1]->newcomer_waiting() && members[3]->newcomer_waiting(); }));
  const std::vector<Membership> third = join_all({members[1].get(), members[3].get()}, {9, 9});
  const Membership grown = replaced.get();
  EXPECT_EQ(waiting.get().encode(), grown.encode());
  EXPECT_EQ(third[0].encode(), grown.encode());
  EXPECT_EQ(grown.number, 3);
  ASSERT_EQ(grown.size(), 4);
  EXPECT_EQ(grown.rank_of(replacement.id()), 2);
  EXPECT_EQ(grown.rank_of(members[0]->id()), 3);
  EXPECT_EQ(grown.members[0].committed_step, 9);
  EXPECT_EQ(grown.members[3].committed_step, 6);  // behind: it takes its shards from slot (0, 1)

  // A member without a slot, or with one outside its group, is refused.
  EXPECT_THROW_MSG(Member(store.connect(), "job", options), Error, "give each member of a job in replica groups");
  EXPECT_THROW_MSG(Member(store.connect(), "job", options, ReplicaSlot{0, 2}), Error, "its index below 2");
}

// Two members join epoch 1 (having finished the training first, if `finished`), then both
// are gone; a newcomer asks to join, and `expect(newcomer, decider)` checks what it is told.
void join_after_every_member_is_gone(bool finished, const std::function<void(Member&, const Decider&)>& expect) {
  const ServedStore store;
  const FtOptions options = fast(2);
  const Decider decider(store.connect(), "job", options);
  auto a = std::make_unique<Member>(store.connect(), "job", options);
  auto b = std::make_unique<Member>(store.connect(), "job", options);
  join_all({a.get(), b.get()}, {9, 9});
  if (finished) {
    a->finished();
    b->finished();
  }
  a.reset();
  b.reset();
  Member newcomer(store.connect(), "job", options);
  expect(newcomer, decider);
}

// Every member of the last epoch gone because they finished the training (Member::finished,
// which the step protocol's finish calls): a replacement that asks to join afterwards is
// told the training is complete (not a failure: its launcher exits 0), not that the state
// is lost. On a loaded machine a restarted worker can come after the survivors finished
// (issue 46's CI run: the launcher of its node exited 1).
TEST(FtMembership, AReplacementThatComesAfterTheTrainingEndedIsToldItIsComplete) {
  join_after_every_member_is_gone(true, [](Member& late, const Decider& decider) {
    EXPECT_THROW_MSG(late.join(0), TrainingComplete,
                     "the training is complete: the members of epoch 1 finished it before this member could join");
    EXPECT_TRUE(decider.training_complete());
  });
}

// Every member of the last epoch gone: a newcomer has no one to take the state from, and the
// job stops saying so, rather than start again from nothing.
TEST(FtMembership, WhenEveryMemberIsGoneTheJobStopsRatherThanStartOver) {
  join_after_every_member_is_gone(false, [](Member& newcomer, const Decider& decider) {
    EXPECT_THROW_MSG(newcomer.join(0), MembershipError,
                     "the job stops: every member of epoch 1 is gone, and with them the state they trained");
    EXPECT_FALSE(decider.training_complete());
  });
}

// A join that no decider answers fails after the quorum timeout, naming what to check.
TEST(FtMembership, WithoutADeciderAJoinFailsAfterTheQuorumTimeout) {
  const ServedStore store;
  FtOptions options = fast(1);
  options.quorum_timeout = 300ms;
  Member lonely(store.connect(), "job", options);
  EXPECT_THROW_MSG(lonely.join(0), MembershipError,
                   "no membership epoch took it within the quorum timeout (700 ms");  // 300 + 200 + 4 * 50
}


// A record whose steps are wrong, as a forged one's are (issue 46; or stale: steps committed
// since in a forged epoch's group): the members trust the steps they exchange, not the
// record. Here the record says b is newest, and a is: b takes a's state, a loads nothing.
TEST(FtElasticGroup, TakesTheNewestStateWhateverTheRecordSays) {
  const ServedStore store;
  const FtOptions options = fast(2);
  const MakeGroup gloo = [](std::shared_ptr<Store> s, int rank, int size) {
    return new_gloo_process_group(std::move(s), rank, size, {"127.0.0.1", 10s, /*shared_memory=*/false});
  };
  ElasticGroup a(store.connect(), "job", options, gloo), b(store.connect(), "job", options, gloo);
  Membership forged;  // no decider: the forger's record is the only one
  forged.number = 1;
  forged.members = {{a.member().id(), 0}, {b.member().id(), 9}};
  PrefixStore("ft/job/", store.connect()).set("epoch/1", forged.encode());
  const auto join_and_take_newest = [](ElasticGroup& group, int64_t step, const std::string& state) {
    EXPECT_EQ(group.join(step).number, 1);
    std::string loaded = "nothing";
    const int64_t newest = group.take_newest_state(step, [&] { return state; }, [&](const std::string& bytes) { loaded = bytes; });
    return std::make_pair(newest, loaded);
  };
  auto newest = std::async(std::launch::async, [&] { return join_and_take_newest(a, 7, "a's state at step 7"); });
  auto behind = std::async(std::launch::async, [&] { return join_and_take_newest(b, 5, "b's state at step 5"); });
  EXPECT_EQ(newest.get(), std::make_pair(int64_t{7}, std::string("nothing")));
  EXPECT_EQ(behind.get(), std::make_pair(int64_t{7}, std::string("a's state at step 7")));
}

}  // namespace
}  // namespace datapar::ft
