#include "datapar/parallel/chunk_sizes.h"

#include <gtest/gtest.h>

#include <numeric>

#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using Sizes = std::vector<int64_t>;

TEST(ChunkSizes, FollowTorchChunk) {
  EXPECT_EQ(chunk_sizes(30, 4), (Sizes{8, 8, 8, 6}));   // tutorial, 4 devices
  EXPECT_EQ(chunk_sizes(10, 4), (Sizes{3, 3, 3, 1}));   // tutorial's last batch
  EXPECT_EQ(chunk_sizes(25, 4), (Sizes{7, 7, 7, 4}));   // batch 25
  EXPECT_EQ(chunk_sizes(30, 2), (Sizes{15, 15}));
  EXPECT_EQ(chunk_sizes(10, 2), (Sizes{5, 5}));
  EXPECT_EQ(chunk_sizes(30, 3), (Sizes{10, 10, 10}));
  EXPECT_EQ(chunk_sizes(16, 2), (Sizes{8, 8}));         // functional example
  EXPECT_EQ(chunk_sizes(15, 2), (Sizes{8, 7}));
  EXPECT_EQ(chunk_sizes(2, 4), (Sizes{1, 1}));           // only two replicas run
  EXPECT_EQ(chunk_sizes(1, 8), (Sizes{1}));
  EXPECT_EQ(chunk_sizes(7, 1), (Sizes{7}));
  // torch.chunk may give fewer chunks than asked even when n >= k: 5 over 4 -> 2,2,1.
  EXPECT_EQ(chunk_sizes(5, 4), (Sizes{2, 2, 1}));
}

TEST(ChunkSizes, AlwaysSumToTheBatch) {
  for (int64_t n = 1; n <= 70; ++n) {
    for (int64_t k = 1; k <= 9; ++k) {
      const Sizes sizes = chunk_sizes(n, k);
      EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), n) << n << " over " << k;
      EXPECT_LE(static_cast<int64_t>(sizes.size()), k);
      for (int64_t s : sizes) EXPECT_GE(s, 1);
    }
  }
}

TEST(ChunkSizes, RejectsEmptyBatchesAndNoDevices) {
  EXPECT_THROW_MSG(chunk_sizes(0, 2), InvalidArgumentError, "at least one row");
  EXPECT_THROW_MSG(chunk_sizes(4, 0), InvalidArgumentError, "at least one device");
}

TEST(WeightedChunkSizes, SplitInProportion) {
  EXPECT_EQ(weighted_chunk_sizes(30, {1, 1}), (Sizes{15, 15}));
  EXPECT_EQ(weighted_chunk_sizes(34, {1, 3}), (Sizes{9, 25}));  // a 3x faster second device
  // "Balanced" DataParallel: the gathering device gets half a share.
  EXPECT_EQ(weighted_chunk_sizes(35, {0.5, 1, 1, 1}), (Sizes{5, 10, 10, 10}));
  EXPECT_EQ(weighted_chunk_sizes(10, {1, 1, 1}), (Sizes{4, 3, 3}));
  // Every device gets a row while there are enough rows, whatever its weight.
  EXPECT_EQ(weighted_chunk_sizes(4, {0, 1, 1, 1}), (Sizes{1, 1, 1, 1}));
  // Fewer rows than devices: the first ones get one each, as torch.chunk.
  EXPECT_EQ(weighted_chunk_sizes(2, {1, 5, 1}), (Sizes{1, 1}));
  for (int64_t n = 3; n < 50; ++n) {
    const Sizes s = weighted_chunk_sizes(n, {0.3, 1.7, 1});
    EXPECT_EQ(std::accumulate(s.begin(), s.end(), int64_t{0}), n);
  }
}

TEST(WeightedChunkSizes, RejectsBadWeights) {
  EXPECT_THROW_MSG(weighted_chunk_sizes(10, {}), InvalidArgumentError, "one weight per device");
  EXPECT_THROW_MSG(weighted_chunk_sizes(10, {1, -1}), InvalidArgumentError, "finite and >= 0");
  EXPECT_THROW_MSG(weighted_chunk_sizes(10, {0, 0}), InvalidArgumentError, "every device weight is 0");
}

TEST(CheckChunkSizes, SaysWhatDoesNotAddUp) {
  EXPECT_NO_THROW(check_chunk_sizes({3, 7}, 10, 2));
  EXPECT_THROW_MSG(check_chunk_sizes({3, 6}, 10, 2), InvalidArgumentError, "add up to 9 but the input has 10 rows");
  EXPECT_THROW_MSG(check_chunk_sizes({3, 3, 4}, 10, 2), InvalidArgumentError, "3 chunk sizes for 2 devices");
  EXPECT_THROW_MSG(check_chunk_sizes({0, 10}, 10, 2), InvalidArgumentError, "at least one row");
}

}  // namespace
}  // namespace datapar
