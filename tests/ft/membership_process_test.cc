// Fault-tolerant membership (datapar/ft/, issue 31) with members as processes of their own:
// one killed with SIGKILL, one stopped with SIGSTOP and continued, and the process that
// hosts the store and the decider killed. Each member runs a loop of steps (member_main):
// it commits a step when may_commit(), joins again when its epoch broke or a newcomer waits,
// and writes what happened to its log, which the test reads.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/ft/membership/member.h"
#include "datapar/rendezvous/tcp_store.h"
#include "file_system.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar::ft {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::read_text;

constexpr const char* kMembershipToken = "ft-process-test";

FtOptions options(int expected) {
  FtOptions o;
  o.heartbeat_interval = 100ms;
  o.eviction_timeout = 1000ms;
  o.settle_time = 300ms;
  o.quorum_timeout = 8s;
  o.expected_members = expected;
  return o;
}

std::shared_ptr<TcpStore> connect_member(uint16_t port) {
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", port, false, kMembershipToken, 5s, ""});
}

// A member's life: join, then steps of 20 ms until `dir`/stop exists. Exit 0 when stopped,
// 3 with "error: ..." in its log when membership failed.
int member_main(uint16_t port, const std::string& dir, int index, int expected) {
  std::ofstream log(dir + "/member-" + std::to_string(index) + ".log", std::ios::app);
  auto say = [&](const std::string& line) { log << line << std::endl; };
  try {
    Member me(connect_member(port), "job", options(expected));
    int64_t step = 0;
    auto join = [&] {
      const Membership e = me.join(step);
      say("epoch " + std::to_string(e.number) + " rank " + std::to_string(e.rank_of(me.id())) + " size " +
          std::to_string(e.size()));
    };
    join();
    int refused = 0;  // steps in a row it could not commit
    while (!detail::exists(dir + "/stop")) {
      std::this_thread::sleep_for(20ms);
      if (me.epoch_broken() || me.newcomer_waiting() || refused >= 25) {
        say("rejoin, may commit " + std::to_string(me.may_commit()));
        join();
        refused = 0;
      } else if (me.may_commit()) {
        say("commit " + std::to_string(++step));
        refused = 0;
      } else {
        ++refused;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    say(std::string("error: ") + e.what());
    return 3;
  }
}

std::string log_of(const std::string& dir, int index) {
  return read_text(dir + "/member-" + std::to_string(index) + ".log");
}

template <typename Condition>
bool within(std::chrono::milliseconds limit, Condition condition) {
  for (const auto deadline = Clock::now() + limit; Clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    if (condition()) return true;
  }
  return condition();
}

// Member processes, SIGKILLed and reaped at the end of the test whatever happened (a failed
// assertion included), unless stop_all() ended them first.
class Members {
 public:
  explicit Members(std::string dir) : dir_(std::move(dir)) {}
  ~Members() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      detail::wait_child(pid);
    }
  }
  pid_t start(uint16_t port, int index, int expected) {
    pids_.push_back(detail::fork_child([=] { return member_main(port, dir_, index, expected); }, "member"));
    return pids_.back();
  }
  void adopt(pid_t pid) { pids_.push_back(pid); }
  pid_t operator[](size_t i) const { return pids_.at(i); }
  // Asks every member to stop and reaps them all (any killed one too).
  void stop_all() {
    std::ofstream(dir_ + "/stop") << "stop";
    for (pid_t pid : pids_) detail::wait_child(pid, Clock::now() + 10s);
    pids_.clear();
  }
  // Waits for member i's end, and reaps it.
  detail::ChildExit wait(size_t i, std::chrono::seconds limit) {
    const detail::ChildExit exit = detail::wait_child(pids_.at(i), Clock::now() + limit);
    pids_.erase(pids_.begin() + static_cast<std::ptrdiff_t>(i));
    return exit;
  }

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
};

// Three members whose store and decider this test hosts: start() returns once all three are
// in epoch 1 and member `watched` has committed 5 steps.
class FtThreeMembers : public ::testing::Test {
 protected:
  void start(int watched) {
    for (int i = 0; i < 3; ++i) members.start(server->port(), i, 3);
    decider = std::make_unique<Decider>(connect_member(server->port()), "job", options(3));
    ASSERT_TRUE(within(10s, [&] { return decider->epoch().size() == 3; }));
    ASSERT_TRUE(within(5s, [&] { return log_of(dir, watched).find("commit 5") != std::string::npos; }))
        << log_of(dir, watched);
  }

  const testing::TempDir temp{"ft"};
  const std::string& dir = temp.path();
  const std::shared_ptr<TcpStore> server =
      std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, kMembershipToken, 10s, ""});
  Members members{dir};
  std::unique_ptr<Decider> decider;  // destroyed first
};

// SIGKILL of one of three: evicted within the eviction timeout; the two others go on in
// epoch 2 with ranks 0 and 1, committing steps again.
TEST_F(FtThreeMembers, AKilledMemberIsEvictedAndTheOthersGoOn) {
  ASSERT_NO_FATAL_FAILURE(start(2));
  const auto killed = Clock::now();
  ::kill(members[2], SIGKILL);
  ASSERT_TRUE(within(10s, [&] { return decider->epoch().number == 2; })) << log_of(dir, 0);
  const auto recovered = Clock::now() - killed;
  EXPECT_EQ(decider->epoch().size(), 2);
  EXPECT_LT(recovered, 1000ms + 3s) << "the eviction timeout, then the survivors' joins";
  for (int i : {0, 1}) {
    ASSERT_TRUE(within(5s, [&] { return std::regex_search(log_of(dir, i), std::regex("epoch 2 rank [01] size 2")); }))
        << log_of(dir, i);
  }
  const size_t after = log_of(dir, 0).size();
  EXPECT_TRUE(within(5s, [&] { return log_of(dir, 0).find("commit", after) != std::string::npos; }))
      << "member 0 commits again:\n"
      << log_of(dir, 0);
  members.stop_all();
}

// SIGSTOP of one of three, past the eviction timeout: the others form epoch 2 without it.
// Continued, it commits nothing (it learns of its eviction before its lease is renewed),
// joins again, and the job grows back to three in epoch 3.
TEST_F(FtThreeMembers, AStoppedMemberCommitsNothingOnResumingAndRejoins) {
  ASSERT_NO_FATAL_FAILURE(start(1));
  ::kill(members[1], SIGSTOP);
  ASSERT_TRUE(within(10s, [&] { return decider->epoch().number == 2; }));
  EXPECT_EQ(decider->epoch().size(), 2);
  std::this_thread::sleep_for(500ms);
  const std::string before = log_of(dir, 1);
  ::kill(members[1], SIGCONT);
  ASSERT_TRUE(within(10s, [&] { return decider->epoch().number >= 3 && decider->epoch().size() == 3; }))
      << log_of(dir, 1);
  ASSERT_TRUE(within(5s, [&] { return log_of(dir, 1).find("epoch 3", before.size()) != std::string::npos; }));
  const std::string resumed = log_of(dir, 1).substr(before.size());
  EXPECT_EQ(resumed.rfind("rejoin, may commit 0", 0), 0u) << "its first act on resuming:\n" << resumed;
  EXPECT_LT(resumed.find("epoch 3"), resumed.find("\ncommit")) << "no commit before it is back:\n" << resumed;
  members.stop_all();
}

// The process that hosts the store and the decider (the launcher of node 0) is killed: the
// members' leases run out, and their join fails naming the store, within the quorum timeout.
TEST(FtMembershipProcess, WhenTheStoresHostDiesTheMembersStopWithTheReason) {
  const testing::TempDir temp("ft");
  const std::string& dir = temp.path();
  const pid_t host = detail::fork_child(
      [&] {
        const auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, kMembershipToken, 10s, ""});
        std::ofstream(dir + "/port.tmp") << server->port();
        ::rename((dir + "/port.tmp").c_str(), (dir + "/port").c_str());
        const Decider decider(connect_member(server->port()), "job", options(2));
        ::pause();
        return 0;
      },
      "store host");
  Members hosts(dir);
  hosts.adopt(host);
  ASSERT_TRUE(within(10s, [&] { return detail::exists(dir + "/port"); }));
  const auto port = static_cast<uint16_t>(std::stoi(read_text(dir + "/port")));
  Members members(dir);
  members.start(port, 0, 2);
  members.start(port, 1, 2);
  ASSERT_TRUE(within(10s, [&] { return log_of(dir, 1).find("commit 3") != std::string::npos; })) << log_of(dir, 1);
  ::kill(host, SIGKILL);
  hosts.wait(0, 5s);
  for (int i : {0, 1}) {
    const detail::ChildExit exit = members.wait(0, 20s);
    EXPECT_EQ(exit.exit_code, 3) << log_of(dir, i);
    EXPECT_NE(log_of(dir, i).find("cannot reach the job's store"), std::string::npos) << log_of(dir, i);
  }
}

}  // namespace
}  // namespace datapar::ft
