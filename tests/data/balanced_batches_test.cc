#include "datapar/data/balanced_batches.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "datapar/data/distributed_sampler.h"
#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

BalancedBatches make_batches(int64_t n, int64_t batch, int64_t world, int64_t rank, uint64_t seed = 5) {
  return BalancedBatches({n, batch, world, rank, /*shuffle=*/true, seed});
}

TEST(BalancedBatches, EveryStepIsOneGlobalBatchSplitByTheWeights) {
  const std::vector<double> weights{2, 1, 1};
  std::vector<std::vector<at::Tensor>> of_rank;
  for (int64_t r = 0; r < 3; ++r) {
    BalancedBatches b = make_batches(100, 32, 3, r);
    b.set_epoch(4);
    ASSERT_EQ(b.num_steps(), 4);  // 32, 32, 32, 4
    of_rank.push_back(b.batches(0, weights));
  }
  // The epoch's order, as DistributedSampler with one rank (PyTorch's randperm) draws it.
  DistributedSamplerOptions one_rank{100, 1, 0};
  one_rank.seed = 5;
  DistributedSampler sampler(one_rank);
  sampler.set_epoch(4);
  const at::Tensor order = sampler.indices();
  BalancedBatches any_rank = make_batches(100, 32, 3, 1);
  any_rank.set_epoch(4);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 4; ++step) {
    const std::vector<int64_t> want = step < 3 ? std::vector<int64_t>{16, 8, 8} : std::vector<int64_t>{2, 1, 1};
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(of_rank[r][step].numel(), want[r]) << "step " << step << " rank " << r;
      parts.push_back(of_rank[r][step]);
    }
    // Rank after rank, the pieces are the global batch: positions [32 s, 32 s + rows).
    const at::Tensor global = at::cat(parts);
    EXPECT_TRUE(at::equal(global, order.slice(0, 32 * step, 32 * step + global.numel()))) << "step " << step;
    // global_batch() is all of it, on any rank (issue 46: the fault-tolerant loop took rank
    // 0's share under weights {1, 0, 0}, and every rank still gets a row: 2 of 48 lost).
    EXPECT_TRUE(at::equal(global, any_rank.global_batch(step))) << "step " << step;
    for (int64_t i : std::vector<int64_t>(global.data_ptr<int64_t>(), global.data_ptr<int64_t>() + global.numel())) {
      EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " read twice";
    }
  }
  EXPECT_EQ(seen.size(), 100u);  // every sample once, no padding
}

TEST(BalancedBatches, ATinyLastBatchJoinsTheOneBefore) {
  // 65 samples, batch 32, 2 ranks: the last batch of 1 row cannot feed 2 ranks.
  BalancedBatches b = make_batches(65, 32, 2, 1);
  EXPECT_EQ(b.num_steps(), 2);
  EXPECT_EQ(b.global_rows(1), 33);
  EXPECT_EQ(b.rank_rows(1, {3, 1}), (std::vector<int64_t>{24, 9}));  // 1 each, then 31 by largest remainder
  int64_t total = 0;
  for (const at::Tensor& t : b.batches(0, {1, 1})) total += t.numel();
  EXPECT_EQ(total, 16 + 16);  // rank 1's halves: 16 of 32, 16 of 33 (rank 0 takes 17)
}

TEST(BalancedBatches, TheRestOfAnEpochUnderNewWeights) {
  BalancedBatches b = make_batches(96, 32, 2, 0);
  const std::vector<at::Tensor> before = b.batches(0, {1, 1});
  const std::vector<at::Tensor> after = b.batches(1, {3, 1});
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].numel(), 24);
  EXPECT_TRUE(at::equal(after[0].slice(0, 0, 16), before[1]));  // the same global batch, more of it
}

TEST(BalancedBatches, RejectsWhatCannotGiveEveryRankARow) {
  EXPECT_THROW_MSG(make_batches(100, 2, 3, 0), InvalidArgumentError, "a global batch of 2 rows cannot give each of 3 ranks");
  EXPECT_THROW_MSG(make_batches(2, 32, 3, 0), InvalidArgumentError, "2 samples cannot give each of 3 ranks");
  EXPECT_THROW_MSG(make_batches(100, 32, 2, 2), InvalidArgumentError, "rank 2 is outside [0, 2)");
  BalancedBatches b = make_batches(100, 32, 2, 0);
  EXPECT_THROW_MSG(b.rank_rows(0, {1}), InvalidArgumentError, "1 weights for 2 ranks");
  EXPECT_THROW_MSG(b.batches(5, {1, 1}), InvalidArgumentError, "first step 5 is outside [0, 4]");
}

}  // namespace
}  // namespace datapar
