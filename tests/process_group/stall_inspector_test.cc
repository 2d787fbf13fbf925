// The stall inspector of a process group: a collective pending past the wait gets one
// warning through the warning sink, naming the ranks that have not issued it yet.
#include "process_group/stall_inspector.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "datapar/process_group/gloo.h"
#include "datapar/warning.h"
#include "process_group/work_completion.h"
#include "testing/captured_warnings.h"
#include "testing/gloo_ranks.h"
#include "testing/ports.h"

namespace datapar::detail {
namespace {

using namespace std::chrono_literals;

using testing::CapturedWarnings;

// Waits up to 10 s until `rank` has published `count` issued collectives.
void wait_for_count(Store& store, int rank, int count) {
  const std::string key = "issued/" + std::to_string(rank);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(store.check({key}) && store.get_string(key) == std::to_string(count))) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank " << rank << " never published " << count;
    std::this_thread::sleep_for(5ms);
  }
}

std::shared_ptr<Work> done_work(const std::string& what) {
  auto work = std::make_shared<Work>(what);
  WorkCompletion::finish(*work);
  return work;
}

TEST(StallInspector, NamesTheRanksThatHaveNotIssuedTheStalledCollective) {
  CapturedWarnings warnings;
  testing::ThreadJobStore job(10s);
  auto store0 = job.join(0);
  auto store1 = job.join(1);
  auto store2 = job.join(2);
  StallInspector rank0(store0, 0, 3, 100ms);
  StallInspector rank1(store1, 1, 3, 0ms);  // publishes its progress, never warns
  StallInspector rank2(store2, 2, 3, 0ms);
  // Ranks 0 and 2 issue two collectives, rank 1 only the first: rank 0's second hangs.
  rank1.issued(done_work("barrier on rank 1 of 3 (test)"));
  rank2.issued(done_work("barrier on rank 2 of 3 (test)"));
  rank2.issued(done_work("all_reduce(sum) on rank 2 of 3 (test)"));
  // Counts are published from a thread, up to a period late (Note [Stall inspection]): the
  // warning is only exact once theirs are in, which a loaded machine can delay past 100 ms.
  wait_for_count(*store0, 1, 1);
  wait_for_count(*store0, 2, 2);
  rank0.issued(done_work("barrier on rank 0 of 3 (test)"));
  auto stuck = std::make_shared<Work>("all_reduce(sum) on rank 0 of 3 (test)");
  rank0.issued(stuck);

  const std::vector<std::string> seen = warnings.wait_for(1, 10s);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_NE(seen[0].find("all_reduce(sum) on rank 0 of 3 (test), collective 2 of this group, has not completed"),
            std::string::npos)
      << seen[0];
  EXPECT_NE(seen[0].find("rank(s) 1 (at 1) have not issued it yet"), std::string::npos) << seen[0];
  // Once per collective, however long it stays stuck.
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(warnings.messages().size(), 1u);
  WorkCompletion::finish(*stuck);
}

TEST(StallInspector, CompletedCollectivesAndAZeroWaitNeverWarn) {
  CapturedWarnings warnings;
  testing::ThreadJobStore job(10s);
  auto store0 = job.join(0);
  auto store1 = job.join(1);
  StallInspector rank0(store0, 0, 2, 20ms);
  StallInspector rank1(store1, 1, 2, 20ms);
  for (int i = 0; i < 5; ++i) {
    rank0.issued(done_work("barrier on rank 0 of 2 (test)"));
    rank1.issued(done_work("barrier on rank 1 of 2 (test)"));
  }
  auto stuck = std::make_shared<Work>("barrier on rank 1 of 2 (test)");
  rank1.set_warn_after(0ms);
  rank1.issued(stuck);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(warnings.messages().empty()) << warnings.messages()[0];
  // Turned back on, the pending one is reported; every rank has issued its 5 before it.
  wait_for_count(*store1, 0, 5);
  rank1.set_warn_after(20ms);
  const std::vector<std::string> seen = warnings.wait_for(1, 10s);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_NE(seen[0].find("collective 6 of this group"), std::string::npos) << seen[0];
  EXPECT_NE(seen[0].find("rank(s) 0 (at 5) have not issued it yet"), std::string::npos) << seen[0];
  WorkCompletion::finish(*stuck);
}


// A group made by the public factory (new_gloo_process_group) inspects its stalls: the
// assembly every backend's factory calls adds the inspector (process_group/assembly.h).
// Rank 1 comes late to an all_reduce: rank 0's warning names it.
TEST(StallInspector, AGroupFromNewGlooProcessGroupWarnsOnAStall) {
  CapturedWarnings warnings;
  testing::run_gloo_ranks_with_options(
      2, [](int) { return GlooOptions{"127.0.0.1", 30s, /*shared_memory=*/true, /*stall_warning=*/200ms}; },
      [&](int rank, std::shared_ptr<ProcessGroup> group) {
        if (rank == 1) {
          ASSERT_FALSE(warnings.wait_for(1, 10s).empty()) << "no warning while rank 1 waited";
        }
        at::Tensor t = at::ones({4});
        group->all_reduce(t)->wait();
        EXPECT_EQ(t[0].item<float>(), 2.0f);
      });
  const std::vector<std::string> seen = warnings.messages();
  ASSERT_FALSE(seen.empty());
  EXPECT_NE(seen[0].find("all_reduce(sum) on rank 0 of 2"), std::string::npos) << seen[0];
  EXPECT_NE(seen[0].find("rank(s) 1 (at "), std::string::npos) << seen[0];
}

}  // namespace
}  // namespace datapar::detail
