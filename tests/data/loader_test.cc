#include "datapar/data/loader.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "datapar/data/distributed_sampler.h"
#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Row i is (3i, 3i+1, 3i+2) with target i, so every batch shows which rows it holds.
std::shared_ptr<TensorDataset> rows(int64_t n) {
  return std::make_shared<TensorDataset>(at::arange(3 * n, at::kFloat).view({n, 3}), at::arange(n, at::kLong));
}

// Wraps a dataset: sleeps per batch (longer for even batches, so that workers finish out
// of order), counts calls, and can throw for the batch that starts at fail_at.
class SlowDataset : public Dataset {
 public:
  SlowDataset(std::shared_ptr<const Dataset> inner, std::chrono::milliseconds delay, bool uneven = true)
      : inner_(std::move(inner)), delay_(delay), uneven_(uneven) {}
  int64_t size() const override { return inner_->size(); }
  Batch get_batch(const at::Tensor& indices) const override {
    ++calls;
    const int64_t first = indices[0].item<int64_t>();
    if (first == fail_at) throw std::runtime_error("bad record at index " + std::to_string(first));
    std::this_thread::sleep_for(uneven_ && first % 2 == 0 ? 3 * delay_ : delay_);
    return inner_->get_batch(indices);
  }
  mutable std::atomic<int64_t> calls{0};
  std::atomic<int64_t> fail_at{-1};

 private:
  std::shared_ptr<const Dataset> inner_;
  std::chrono::milliseconds delay_;
  bool uneven_;
};

DataLoaderOptions opts(int64_t batch_size, int64_t num_workers, int64_t prefetch_factor = 2) {
  DataLoaderOptions o;
  o.batch_size = batch_size;
  o.num_workers = num_workers;
  o.prefetch_factor = prefetch_factor;
  return o;
}

std::vector<Batch> drain(DataLoader& loader) {
  std::vector<Batch> out;
  while (auto batch = loader.next()) out.push_back(*batch);
  return out;
}

int64_t thread_count() {
  int64_t n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

TEST(DataLoader, BatchesEqualDirectSlicesInOrder) {
  auto data = rows(23);
  for (int64_t workers : {0, 1, 3}) {
    DataLoader loader(data, opts(5, workers));
    loader.start_epoch();
    EXPECT_EQ(loader.num_batches(), 5);
    const std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), 5u) << workers;
    for (int64_t k = 0; k < 5; ++k) {
      const int64_t end = std::min<int64_t>(23, 5 * k + 5);
      EXPECT_TRUE(at::equal(batches[k].data, data->data().slice(0, 5 * k, end))) << "workers " << workers;
      EXPECT_TRUE(at::equal(batches[k].target, at::arange(5 * k, end, at::kLong)));
      EXPECT_TRUE(at::equal(batches[k].indices, at::arange(5 * k, end, at::kLong)));
      EXPECT_FALSE(batches[k].is_padding.any().item<bool>());
    }
    EXPECT_EQ(batches.back().size(), 3);
    EXPECT_FALSE(loader.next().has_value());  // stays at the end
    EXPECT_EQ(loader.stats().batches, 5);
  }
  DataLoaderOptions o = opts(5, 2);
  o.drop_last = true;
  DataLoader dropping(data, o);
  dropping.start_epoch();
  EXPECT_EQ(drain(dropping).size(), 4u);
}

TEST(DataLoader, OrderDoesNotDependOnWorkersOrTheirSpeed) {
  auto slow = std::make_shared<SlowDataset>(rows(40), 2ms);
  std::vector<std::vector<Batch>> runs;
  for (int64_t workers : {1, 3}) {
    DataLoaderOptions o = opts(4, workers, 1);
    o.shuffle = true;
    o.seed = 3;
    DataLoader loader(slow, o);
    loader.start_epoch(2);
    runs.push_back(drain(loader));
  }
  ASSERT_EQ(runs[0].size(), 10u);
  ASSERT_EQ(runs[1].size(), 10u);
  std::vector<at::Tensor> all;
  for (size_t k = 0; k < 10; ++k) {
    EXPECT_TRUE(at::equal(runs[0][k].indices, runs[1][k].indices)) << k;
    EXPECT_TRUE(at::equal(runs[0][k].data, runs[1][k].data)) << k;
    EXPECT_TRUE(at::equal(runs[1][k].target, runs[1][k].indices));  // rows match their indices
    all.push_back(runs[0][k].indices);
  }
  const at::Tensor order = at::cat(all);
  EXPECT_TRUE(at::equal(std::get<0>(order.sort()), at::arange(40, at::kLong)));  // a permutation...
  EXPECT_FALSE(at::equal(order, at::arange(40, at::kLong)));               // ...not the identity
}

TEST(DataLoader, FollowsTheSamplerAndResumesMidEpoch) {
  auto data = rows(10);
  DistributedSampler sampler(DistributedSamplerOptions{10, 4, 3, true, 5, false});
  sampler.set_epoch(1);
  DataLoader loader(data, opts(2, 2));
  loader.start_epoch(sampler);
  std::vector<Batch> full = drain(loader);
  ASSERT_EQ(full.size(), 2u);  // 3 samples per rank: batches of 2 and 1
  EXPECT_TRUE(at::equal(at::cat({full[0].indices, full[1].indices}), sampler.indices()));
  // Rank 3 of 4 over 10 samples: its third position (global 11) is padding.
  EXPECT_TRUE(at::equal(full[1].is_padding, at::ones({1}, at::kBool)));
  EXPECT_EQ(sampler.position(), 3);

  // Interrupt after one batch, save, and resume in a new sampler and loader.
  DistributedSampler first(DistributedSamplerOptions{10, 4, 3, true, 5, false});
  first.set_epoch(1);
  DataLoader interrupted(data, opts(2, 2));
  interrupted.start_epoch(first);
  ASSERT_TRUE(interrupted.next().has_value());
  const SamplerState saved = first.state();
  EXPECT_EQ(saved.consumed, 2);
  DistributedSampler second(DistributedSamplerOptions{10, 4, 3, true, 0, false});
  second.load_state(saved);
  DataLoader resumed(data, opts(2, 3));
  resumed.start_epoch(second);
  std::vector<Batch> rest = drain(resumed);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_TRUE(at::equal(rest[0].indices, full[1].indices));
  EXPECT_TRUE(at::equal(rest[0].is_padding, full[1].is_padding));
}

TEST(DataLoader, PrefetchIsBoundedAndHidesLoadingTime) {
  // 2 workers x prefetch 2: after taking one batch and pausing, at most 1 + 4 loads began.
  auto slow = std::make_shared<SlowDataset>(rows(100), 1ms, false);
  DataLoader loader(slow, opts(2, 2, 2));
  loader.start_epoch();
  ASSERT_TRUE(loader.next().has_value());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(slow->calls.load(), 5);

  // Loading takes 20 ms a batch and a step 40 ms: with 2 workers the consumer waits only
  // for the first batch; loading on the calling thread, it waits for all of them.
  auto slower = std::make_shared<SlowDataset>(rows(20), 20ms, false);
  for (int64_t workers : {0, 2}) {
    DataLoader timed(slower, opts(2, workers));
    timed.start_epoch();
    while (timed.next()) std::this_thread::sleep_for(40ms);
    const auto wait = timed.stats().wait;
    EXPECT_EQ(timed.stats().batches, 10);
    if (workers == 0) {
      EXPECT_GE(wait, 200ms);
    } else {
      EXPECT_LT(wait, 100ms) << "consumer waited " << wait.count() / 1e6 << " ms with prefetch";
    }
  }
}

TEST(DataLoader, DestroyingMidEpochJoinsEveryWorker) {
  auto slow = std::make_shared<SlowDataset>(rows(200), 20ms);
  {  // warm-up: libtorch's own thread pools, created on first use, are not ours to count
    DataLoader warm(slow, opts(4, 3));
    warm.start_epoch(at::arange(24, at::kLong));
    drain(warm);
  }
  const int64_t baseline = thread_count();
  const auto start = std::chrono::steady_clock::now();
  {
    DataLoader loader(slow, opts(4, 3));
    loader.start_epoch();
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
    EXPECT_EQ(thread_count(), baseline + 3);
  }  // destructor: workers are loading or blocked on the full window
  {
    DataLoader idle(rows(200), opts(1, 3));
    idle.start_epoch();  // never consumed: workers stop at the window
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(thread_count(), baseline);
}

TEST(DataLoader, WorkerErrorsReachTheConsumerInOrder) {
  auto slow = std::make_shared<SlowDataset>(rows(30), 1ms);
  slow->fail_at = 12;  // the batch of rows 12..15, the fourth
  for (int64_t workers : {0, 3}) {
    DataLoader loader(slow, opts(4, workers));
    loader.start_epoch();
    for (int k = 0; k < 3; ++k) ASSERT_TRUE(loader.next().has_value()) << k;
    EXPECT_THROW_MSG(loader.next(), std::runtime_error, "bad record at index 12");
    EXPECT_THROW_MSG(loader.next(), std::runtime_error, "bad record at index 12");  // the epoch stays failed
    slow->fail_at = -1;
    loader.start_epoch();  // a new epoch starts clean
    EXPECT_EQ(drain(loader).size(), 8u);
    slow->fail_at = 12;
  }
}

TEST(DataLoader, ExplicitBatchesOfUnlikeSizesArriveAsGiven) {
  auto data = rows(20);
  const std::vector<at::Tensor> given{at::tensor({4, 2, 9}, at::kLong), at::tensor({0}, at::kLong),
                                      at::arange(10, 20, at::kLong)};
  for (int64_t workers : {0, 2}) {
    DataLoader loader(data, opts(5, workers));
    loader.start_epoch(given);
    ASSERT_EQ(loader.num_batches(), 3);
    const std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(at::equal(batches[k].target, given[k])) << "batch " << k << ", workers " << workers;
      EXPECT_FALSE(batches[k].is_padding.any().item<bool>());
    }
  }
  DataLoader loader(data, opts(5, 1));
  EXPECT_THROW_MSG(loader.start_epoch(std::vector<at::Tensor>{at::tensor({1, 20}, at::kLong)}), InvalidArgumentError,
                   "batch 0 holds index 20, outside the dataset [0, 20)");
  EXPECT_THROW_MSG(loader.start_epoch(std::vector<at::Tensor>{at::tensor({1}, at::kLong), at::zeros({0}, at::kLong)}),
                   InvalidArgumentError, "batch 1 must be a non-empty 1-D int64 tensor");
}

TEST(DataLoader, RejectsBadOptionsAndIndices) {
  auto data = rows(10);
  EXPECT_THROW_MSG(DataLoader(data, opts(0, 1)), InvalidArgumentError, "batch_size is 0");
  EXPECT_THROW_MSG(DataLoader(data, opts(2, -1)), InvalidArgumentError, "num_workers is -1");
  EXPECT_THROW_MSG(DataLoader(data, opts(2, 1, 0)), InvalidArgumentError, "prefetch_factor is 0");
  EXPECT_THROW_MSG(DataLoader(nullptr, opts(2, 1)), InvalidArgumentError, "dataset is null");
  DataLoader loader(data, opts(2, 1));
  EXPECT_FALSE(loader.next().has_value());  // before any epoch
  EXPECT_THROW_MSG(loader.start_epoch(at::tensor({1, 10}, at::kLong)), InvalidArgumentError,
                   "index 10 is outside the dataset [0, 10)");
  EXPECT_THROW_MSG(loader.start_epoch(at::tensor({1, 2}, at::kLong), at::zeros({1}, at::kBool)), InvalidArgumentError,
                   "is_padding must be a (2,) bool tensor");
  DistributedSampler other(DistributedSamplerOptions{11, 1, 0});
  EXPECT_THROW_MSG(loader.start_epoch(other), InvalidArgumentError, "the sampler was made for another dataset size");
  loader.start_epoch(at::zeros({0}, at::kLong));
  EXPECT_EQ(loader.num_batches(), 0);
  EXPECT_FALSE(loader.next().has_value());
}

}  // namespace
}  // namespace datapar
