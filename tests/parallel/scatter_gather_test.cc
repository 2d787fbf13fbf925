#include "datapar/parallel/scatter_gather.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

std::vector<int64_t> rows(const std::vector<at::Tensor>& chunks, int64_t dim = 0) {
  std::vector<int64_t> out;
  for (const auto& c : chunks) out.push_back(c.size(dim));
  return out;
}

TEST(Scatter, SplitsLikeTorchChunk) {
  const auto x = at::randn({30, 5});
  EXPECT_EQ(rows(scatter(x, cpu_devices(4))), (std::vector<int64_t>{8, 8, 8, 6}));
  EXPECT_EQ(rows(scatter(x, cpu_devices(2))), (std::vector<int64_t>{15, 15}));
  EXPECT_EQ(rows(scatter(x, cpu_devices(3))), (std::vector<int64_t>{10, 10, 10}));
  EXPECT_EQ(rows(scatter(at::randn({25, 5}), cpu_devices(4))), (std::vector<int64_t>{7, 7, 7, 4}));
  EXPECT_EQ(rows(scatter(at::randn({10, 5}), cpu_devices(4))), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(rows(scatter(at::randn({15, 10}), cpu_devices(2))), (std::vector<int64_t>{8, 7}));
  EXPECT_EQ(rows(scatter(at::randn({2, 10}), cpu_devices(4))), (std::vector<int64_t>{1, 1}));
}

TEST(Scatter, ChunksHoldTheRightRowsOnAnyDim) {
  const auto x = at::arange(24).reshape({2, 12});
  auto chunks = scatter(x, cpu_devices(3), /*dim=*/1);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_TRUE(at::equal(chunks[1], x.narrow(1, 4, 4)));
  EXPECT_TRUE(at::equal(at::cat(chunks, 1), x));
  chunks = scatter(x, cpu_devices(3), /*dim=*/-1);
  EXPECT_EQ(rows(chunks, 1), (std::vector<int64_t>{4, 4, 4}));
  // CPU chunks are views of the input: no copy.
  EXPECT_EQ(chunks[0].data_ptr(), x.data_ptr());
}

TEST(Scatter, ExplicitSizesGiveUnevenSplits) {
  const auto x = at::arange(10);
  auto chunks = scatter(x, cpu_devices(2), 0, {3, 7});
  EXPECT_EQ(rows(chunks), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(chunks[1][0].item<int64_t>(), 3);
  EXPECT_THROW_MSG(scatter(x, cpu_devices(2), 0, {3, 6}), InvalidArgumentError, "add up to 9");
  EXPECT_THROW_MSG(scatter(x, cpu_devices(2), 0, {2, 3, 5}), InvalidArgumentError, "3 chunk sizes for 2 devices");
}

TEST(Scatter, RejectsWhatCannotBeSplit) {
  EXPECT_THROW_MSG(scatter(at::ones({}), cpu_devices(2)), InvalidArgumentError, "0-dim");
  EXPECT_THROW_MSG(scatter(at::ones({4, 2}), cpu_devices(2), 2), InvalidArgumentError, "out of range");
  EXPECT_THROW_MSG(scatter(at::ones({0, 2}), cpu_devices(2)), InvalidArgumentError, "at least one row");
  EXPECT_THROW_MSG(scatter(at::ones({4, 2}), std::vector<Device>{}), InvalidArgumentError, "no devices");
}

TEST(Scatter, NestedInputsKeepTheirShapeAndNonTensorsReachEveryChunk) {
  const auto a = at::randn({6, 3});
  const auto b = at::randn({6});
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("features", a);
  dict.insert("scale", 2.5);
  std::vector<c10::IValue> list_items{b, c10::IValue("tag")};
  c10::impl::GenericList list(c10::AnyType::get());
  for (auto& item : list_items) list.push_back(item);
  const c10::IValue input = c10::ivalue::Tuple::create({c10::IValue(dict), c10::IValue(list), c10::IValue(int64_t{7})});

  auto chunks = scatter(input, cpu_devices(4));
  ASSERT_EQ(chunks.size(), 3u);  // 6 rows over 4 devices: 2,2,2
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& tuple = chunks[i].toTupleRef().elements();
    auto d = tuple[0].toGenericDict();
    EXPECT_TRUE(at::equal(d.at("features").toTensor(), a.narrow(0, 2 * i, 2)));
    EXPECT_EQ(d.at("scale").toDouble(), 2.5);
    auto l = tuple[1].toList();
    EXPECT_TRUE(at::equal(l.get(0).toTensor(), b.narrow(0, 2 * i, 2)));
    EXPECT_EQ(l.get(1).toStringRef(), "tag");
    EXPECT_EQ(tuple[2].toInt(), 7);
  }
}

TEST(Scatter, TensorsThatDisagreeOnRowsAreAnError) {
  const c10::IValue input = c10::ivalue::Tuple::create({at::ones({6, 2}), at::ones({5, 2})});
  EXPECT_THROW_MSG(scatter(input, cpu_devices(2)), InvalidArgumentError, "has 5 rows along dim 0 but the batch has 6");
  EXPECT_THROW_MSG(scatter(c10::IValue(int64_t{3}), cpu_devices(2)), InvalidArgumentError, "no tensor");
}

TEST(Gather, ConcatenatesAndStacksScalars) {
  const auto x = at::randn({15, 4});
  auto chunks = scatter(x, cpu_devices(2));
  EXPECT_TRUE(at::equal(gather(chunks, Device::cpu()), x));
  auto by_cols = scatter(x, cpu_devices(2), 1);
  EXPECT_TRUE(at::equal(gather(by_cols, Device::cpu(), 1), x));
  const auto losses = gather(std::vector<at::Tensor>{at::scalar_tensor(1.0), at::scalar_tensor(2.0)}, Device::cpu());
  EXPECT_EQ(losses.sizes(), at::IntArrayRef({2}));
  EXPECT_THROW_MSG(gather(std::vector<at::Tensor>{}, Device::cpu()), InvalidArgumentError, "no outputs");
}

TEST(Gather, NestedOutputs) {
  std::vector<c10::IValue> outputs;
  for (int i = 0; i < 3; ++i) {
    outputs.push_back(c10::ivalue::Tuple::create({at::full({2, 2}, i), c10::IValue(std::vector<at::Tensor>{at::full({1}, i)})}));
  }
  const auto gathered = gather(outputs, Device::cpu());
  const auto& t = gathered.toTupleRef().elements();
  EXPECT_EQ(t[0].toTensor().sizes(), at::IntArrayRef({6, 2}));
  EXPECT_EQ(t[1].toTensorVector()[0].sizes(), at::IntArrayRef({3}));
  EXPECT_EQ(t[0].toTensor()[5][0].item<float>(), 2.0f);
  outputs.push_back(at::ones({1}));
  EXPECT_THROW_MSG(gather(outputs, Device::cpu()), InvalidArgumentError, "differ in type");
}

TEST(ScatterGather, GradientsFlowBackToTheInput) {
  const auto x = at::randn({9, 3}).requires_grad_();
  auto chunks = scatter(x, cpu_devices(4));
  std::vector<at::Tensor> doubled;
  for (const auto& c : chunks) doubled.push_back(c * 2);
  gather(doubled, Device::cpu()).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), at::full({9, 3}, 2.0)));
}

}  // namespace
}  // namespace datapar
