// Flattening for the *_coalesced collectives (src/tensor/coalesce.h): a copy where the
// tensors are apart, their own memory where they lie back to back, and no copy at all for a
// buffer the collective overwrites.
#include "tensor/coalesce.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace datapar::detail {
namespace {

TEST(Coalesce, TensorsApartAreCopiedByDtypeAndCopiedBack) {
  std::vector<at::Tensor> tensors{at::arange(6, at::kFloat).view({2, 3}), at::arange(3, at::kLong),
                                  at::full({4}, 7.0f)};
  const std::vector<FlatGroup> groups = flatten_by_dtype(tensors);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FALSE(groups[0].aliases);
  EXPECT_EQ(groups[0].members, (std::vector<size_t>{0, 2}));
  EXPECT_TRUE(at::equal(groups[0].flat, at::cat({at::arange(6, at::kFloat), at::full({4}, 7.0f)})));
  EXPECT_EQ(groups[1].members, (std::vector<size_t>{1}));

  groups[0].flat.mul_(2);  // what a collective would leave in the buffer
  unflatten_into(groups[0], groups[0].flat, tensors);
  EXPECT_TRUE(at::equal(tensors[0], at::arange(6, at::kFloat).view({2, 3}) * 2));
  EXPECT_TRUE(at::equal(tensors[2], at::full({4}, 14.0f)));
}

TEST(Coalesce, TensorsBackToBackAreTheirOwnFlatBuffer) {
  const at::Tensor storage = at::arange(10, at::kFloat);
  std::vector<at::Tensor> tensors{storage.narrow(0, 0, 6).view({3, 2}), storage.narrow(0, 6, 4)};
  const std::vector<FlatGroup> groups = flatten_by_dtype(tensors);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_TRUE(groups[0].aliases);
  EXPECT_EQ(groups[0].flat.data_ptr(), storage.data_ptr());
  EXPECT_EQ(groups[0].flat.numel(), 10);
  groups[0].flat.add_(1);  // in place: the tensors see it, with nothing copied back
  unflatten_into(groups[0], groups[0].flat, tensors);
  EXPECT_TRUE(at::equal(tensors[1], at::arange(6, 10, at::kFloat) + 1));

  // A same-sized replacement (a widened copy) is copied back even so.
  const at::Tensor replacement = at::zeros({10});
  unflatten_into(groups[0], replacement, tensors);
  EXPECT_TRUE(at::equal(storage, at::zeros({10})));
}

TEST(Coalesce, OutOfOrderGappedOrStridedTensorsAreCopied) {
  const at::Tensor storage = at::arange(12, at::kFloat);
  const std::vector<std::vector<at::Tensor>> cases{
      {storage.narrow(0, 6, 6), storage.narrow(0, 0, 6)},   // out of order
      {storage.narrow(0, 0, 5), storage.narrow(0, 6, 6)},   // a gap
      {storage.view({3, 4}).t(), storage.narrow(0, 0, 0)},  // not contiguous
      {storage.narrow(0, 0, 6), storage.narrow(0, 0, 6)},   // the same memory twice
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<FlatGroup> groups = flatten_by_dtype(cases[c]);
    ASSERT_EQ(groups.size(), 1u);
    EXPECT_FALSE(groups[0].aliases) << "case " << c;
    EXPECT_NE(groups[0].flat.data_ptr(), storage.data_ptr()) << "case " << c;
  }
}

TEST(Coalesce, ABufferToBeOverwrittenIsNotFilled) {
  std::vector<at::Tensor> tensors{at::ones({3}), at::ones({5})};
  const std::vector<FlatGroup> groups = flatten_by_dtype(tensors, /*copy_values=*/false);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_FALSE(groups[0].aliases);
  EXPECT_EQ(groups[0].flat.numel(), 8);
  groups[0].flat.fill_(3);  // what a broadcast's receiver gets
  unflatten_into(groups[0], groups[0].flat, tensors);
  EXPECT_TRUE(at::equal(tensors[1], at::full({5}, 3.0f)));
}

}  // namespace
}  // namespace datapar::detail
