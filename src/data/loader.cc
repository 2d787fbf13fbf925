// DataLoader. See loader.h.
//
// Note [Loader window]
// Batches are numbered 0..n-1 in epoch order. Workers claim the lowest unclaimed number,
// load it, and file the result under its number; the consumer takes numbers in order.
// A worker may claim batch k only while k < window_end_ = delivered + num_workers *
// prefetch_factor, which bounds the batches in memory, and the batch the consumer waits
// for is always inside the window, so it is claimed or being loaded: the wait ends.
// Results carry their number, so the order never depends on which worker was faster.
#include "datapar/data/loader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>

#include "datapar/config.h"
#include "datapar/error.h"

namespace datapar {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  DATAPAR_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null.");
  DATAPAR_CHECK(options_.batch_size >= 1, "DataLoader: batch_size is ", options_.batch_size, "; it must be >= 1.");
  DATAPAR_CHECK(options_.num_workers >= 0, "DataLoader: num_workers is ", options_.num_workers,
                "; use 0 to load on the calling thread, or more for background threads.");
  DATAPAR_CHECK(options_.prefetch_factor >= 1, "DataLoader: prefetch_factor is ", options_.prefetch_factor,
                "; each worker must be allowed at least 1 batch ahead.");
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::start_epoch(DistributedSampler& sampler) {
  DATAPAR_CHECK_EQ(sampler.options().dataset_size, dataset_->size(),
                   "DataLoader: the sampler was made for another dataset size");
  start_epoch(sampler.remaining(), sampler.padding_mask(sampler.position(), sampler.num_samples()));
  sampler_ = &sampler;
}

void DataLoader::start_epoch(int64_t epoch) {
  DATAPAR_CHECK(epoch >= 0, "DataLoader::start_epoch: epoch is ", epoch, "; epochs count from 0.");
  const int64_t n = dataset_->size();
  if (!options_.shuffle) {
    start_epoch(at::arange(n, at::TensorOptions(at::kLong)));
    return;
  }
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch));
  start_epoch(at::randperm(n, generator, at::TensorOptions(at::kLong)));
}

void DataLoader::start_epoch(const at::Tensor& indices, const at::Tensor& is_padding) {
  stop_workers();
  DATAPAR_CHECK(indices.defined() && indices.dim() == 1 && indices.scalar_type() == at::kLong,
                "DataLoader::start_epoch: indices must be a 1-D int64 tensor.");
  const int64_t n = indices.numel();
  if (n > 0) {
    const int64_t lo = indices.min().item<int64_t>();
    const int64_t hi = indices.max().item<int64_t>();
    DATAPAR_CHECK(lo >= 0 && hi < dataset_->size(), "DataLoader::start_epoch: index ", lo < 0 ? lo : hi,
                  " is outside the dataset [0, ", dataset_->size(), ").");
  }
  at::Tensor padding = is_padding.defined() ? is_padding : at::zeros({n}, at::TensorOptions(at::kBool));
  DATAPAR_CHECK(padding.dim() == 1 && padding.numel() == n && padding.scalar_type() == at::kBool,
                "DataLoader::start_epoch: is_padding must be a (", n, ",) bool tensor, one flag per index.");

  const at::Tensor all = indices.contiguous();
  // split() of an empty tensor gives one empty piece; an empty epoch has no batches.
  batches_ = n == 0 ? std::vector<at::Tensor>{} : all.split(options_.batch_size);
  padding_ = n == 0 ? std::vector<at::Tensor>{} : padding.contiguous().split(options_.batch_size);
  if (options_.drop_last && !batches_.empty() && batches_.back().numel() < options_.batch_size) {
    batches_.pop_back();
    padding_.pop_back();
  }
  start_batches();
}

void DataLoader::start_epoch(std::vector<at::Tensor> batches) {
  stop_workers();
  for (size_t k = 0; k < batches.size(); ++k) {
    const at::Tensor& b = batches[k];
    DATAPAR_CHECK(b.defined() && b.dim() == 1 && b.scalar_type() == at::kLong && b.numel() >= 1,
                  "DataLoader::start_epoch: batch ", k, " must be a non-empty 1-D int64 tensor of indices.");
    const int64_t lo = b.min().item<int64_t>();
    const int64_t hi = b.max().item<int64_t>();
    DATAPAR_CHECK(lo >= 0 && hi < dataset_->size(), "DataLoader::start_epoch: batch ", k, " holds index ",
                  lo < 0 ? lo : hi, ", outside the dataset [0, ", dataset_->size(), ").");
  }
  padding_.clear();
  for (at::Tensor& b : batches) {
    b = b.contiguous();
    padding_.push_back(at::zeros({b.numel()}, at::TensorOptions(at::kBool)));
  }
  batches_ = std::move(batches);
  start_batches();
}

void DataLoader::start_batches() {
  sampler_ = nullptr;
  delivered_ = 0;
  failed_ = nullptr;
  stats_ = {};

  const int64_t count = num_batches();
  if (options_.num_workers == 0 || count == 0) return;
  next_claim_ = 0;
  window_end_ = std::min(count, options_.num_workers * options_.prefetch_factor);
  const int64_t threads = std::min(options_.num_workers, count);
  for (int64_t i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

std::optional<Batch> DataLoader::next() {
  if (failed_) std::rethrow_exception(failed_);
  const int64_t count = num_batches();
  if (delivered_ >= count) return std::nullopt;

  const auto start = std::chrono::steady_clock::now();
  Slot slot;
  if (workers_.empty()) {
    slot = load(delivered_);  // num_workers == 0: the consumer loads, and that is its wait
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_cv_.wait(lock, [&] { return ready_.count(delivered_) != 0; });
    auto it = ready_.find(delivered_);
    slot = std::move(it->second);
    ready_.erase(it);
    window_end_ = std::min(count, delivered_ + 1 + options_.num_workers * options_.prefetch_factor);
    lock.unlock();
    work_cv_.notify_all();
  }
  stats_.wait += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);

  if (slot.error) {
    failed_ = slot.error;
    stop_workers();
    std::rethrow_exception(failed_);
  }
  ++delivered_;
  ++stats_.batches;
  if (sampler_ != nullptr) sampler_->advance(slot.batch.size());
  if (delivered_ == count) stop_workers();  // they have exited or are about to; reap them now
  return std::move(slot.batch);
}

DataLoader::Slot DataLoader::load(int64_t k) const {
  Slot slot;
  try {
    slot.batch = dataset_->get_batch(batches_[k]);
    slot.batch.indices = batches_[k];
    slot.batch.is_padding = padding_[k];
#if DATAPAR_HAVE_CUDA
    // Page-locked memory only helps (and only exists) with a CUDA device to copy to.
    if (options_.pin_memory && at::hasCUDA()) {
      slot.batch.data = slot.batch.data.pin_memory();
      slot.batch.target = slot.batch.target.pin_memory();
    }
#endif
  } catch (...) {
    slot.error = std::current_exception();
  }
  return slot;
}

void DataLoader::worker_loop() {
  // See Note [Loader window].
  const int64_t count = num_batches();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || next_claim_ >= count || next_claim_ < window_end_; });
    if (stop_ || next_claim_ >= count) return;
    const int64_t k = next_claim_++;
    lock.unlock();
    Slot slot = load(k);
    lock.lock();
    ready_.emplace(k, std::move(slot));
    ready_cv_.notify_one();
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  stop_ = false;
  ready_.clear();
}

}  // namespace datapar
