// SyncBatchNorm's numerics over 2 ranks (threads of one Gloo group) against BatchNorm on the
// concatenated batch in float64 (issue 26; testing/sync_batch_norm_check.h): a mean far
// larger than the spread, in float32 and bfloat16, uneven rows per rank and a rank with none.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "testing/sync_batch_norm_check.h"

namespace datapar {
namespace {

using testing::expect_matches_batch_norm_on_the_whole_batch;

TEST(SyncBatchNorm, AMeanFarAboveTheSpreadInFloat32) {
  expect_matches_batch_norm_on_the_whole_batch({at::kFloat, 1e4, 1e-2, {3, 5}});
  expect_matches_batch_norm_on_the_whole_batch({at::kFloat, 0, 1e-4, {6, 2}});
}

TEST(SyncBatchNorm, BFloat16StatisticsAreAccumulatedInFloat32) {
  expect_matches_batch_norm_on_the_whole_batch({at::kBFloat16, 100, 5e-2, {4, 4}});
}

TEST(SyncBatchNorm, ARankWithNoRowsAddsNothing) {
  expect_matches_batch_norm_on_the_whole_batch({at::kFloat, 10, 1e-3, {0, 7}});
}

}  // namespace
}  // namespace datapar
