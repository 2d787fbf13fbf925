// DataLoader: batches of a Dataset, loaded ahead on background threads so that the
// training step does not wait for data (PyTorch's DataLoader with num_workers and
// prefetch_factor, in threads rather than processes).
//
// An epoch is a list of dataset indices, from a DistributedSampler (its remaining
// indices: a resumed sampler continues mid-epoch), from a plain list, or sequential /
// shuffled over the whole dataset. The list is cut into batches of batch_size in order;
// workers load them concurrently, but next() hands them out strictly in list order, so
// the batches are the same whatever the number of workers.
//
// Bounded: at most num_workers * prefetch_factor batches are loaded or waiting at any
// time. The consumer's time blocked in next() is recorded (stats()), so a benchmark can
// report data waiting as a share of an epoch.
//
// Errors: an exception thrown by Dataset::get_batch on a worker is rethrown, unchanged, by
// the next() that would have returned that batch (batches before it arrive normally);
// the epoch then stays failed (next() rethrows) until the next start_epoch.
//
// Threads: workers start with each epoch and stop at its end, at start_epoch, or in the
// destructor, which wakes and joins them even mid-epoch (a worker inside get_batch
// finishes that batch first). A DataLoader is used from one thread (the training loop).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "datapar/data/dataset.h"
#include "datapar/data/distributed_sampler.h"

namespace datapar {

struct DataLoaderOptions {
  // Rows per batch; the last batch of an epoch may be smaller. REQUIRES: >= 1.
  int64_t batch_size = 64;
  // Background loading threads; 0 loads each batch in next() on the calling thread.
  int64_t num_workers = 2;
  // Batches loaded ahead per worker (PyTorch's prefetch_factor). REQUIRES: >= 1.
  int64_t prefetch_factor = 2;
  // Leave out a last batch smaller than batch_size.
  bool drop_last = false;
  // For start_epoch(epoch): shuffle with a permutation drawn from seed + epoch.
  bool shuffle = false;
  uint64_t seed = 0;
  // Put batches in page-locked memory for faster, asynchronous copies to a GPU. Has an
  // effect only in a CUDA build with a CUDA device present; ignored otherwise.
  bool pin_memory = false;
};

// Counts for the current epoch (reset by start_epoch).
struct DataLoaderStats {
  int64_t batches = 0;                 // batches returned by next()
  std::chrono::nanoseconds wait{0};    // time the consumer spent blocked in next()
};

class DataLoader {
 public:
  // Throws InvalidArgumentError for options outside the REQUIRES above. No threads start
  // until an epoch does.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // Stops and joins the workers, mid-epoch too.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts an epoch over the sampler's remaining() indices. As each batch reaches the
  // consumer, the sampler advances by its rows, so sampler.state() saved after a step
  // resumes right after that step; batches carry the sampler's is_padding marks. A whole
  // epoch leaves the sampler at its end: call sampler.set_epoch() before the next one (an
  // evaluation sampler too, or the next epoch over it is empty).
  // REQUIRES: the sampler outlives the epoch, and its dataset_size is this dataset's size.
  void start_epoch(DistributedSampler& sampler);
  // Starts an epoch over `indices` ((n,) int64, in this order); `is_padding` ((n,) bool)
  // marks rows for metrics to skip, all false when undefined.
  void start_epoch(const at::Tensor& indices, const at::Tensor& is_padding = {});
  // Starts an epoch over the whole dataset: 0..n-1, or shuffled by seed + epoch when
  // options.shuffle is set.
  void start_epoch(int64_t epoch = 0);
  // Starts an epoch over these batches as given ((rows,) int64 indices each, rows >= 1;
  // their sizes may differ): e.g. BalancedBatches' shares. batch_size and drop_last do not
  // apply.
  void start_epoch(std::vector<at::Tensor> batches);

  // The next batch of the epoch, or nullopt at its end (also before any epoch). Blocks
  // until the batch is loaded. Rethrows a worker's exception for that batch.
  std::optional<Batch> next();

  // Batches in the current epoch.
  int64_t num_batches() const { return static_cast<int64_t>(batches_.size()); }
  DataLoaderStats stats() const { return stats_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  void stop_workers();
  // Starts the epoch over batches_ and padding_, as set by a start_epoch.
  void start_batches();
  void worker_loop();
  Slot load(int64_t k) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;

  // The epoch. batches_[k]: (B,) int64 indices; padding_[k]: (B,) bool.
  std::vector<at::Tensor> batches_;
  std::vector<at::Tensor> padding_;
  DistributedSampler* sampler_ = nullptr;
  int64_t delivered_ = 0;  // batches returned by next(); only the consumer writes it
  std::exception_ptr failed_;
  DataLoaderStats stats_;

  // Shared with the workers, under mutex_.
  std::mutex mutex_;
  std::condition_variable work_cv_;   // workers: a batch may be claimed, or stop
  std::condition_variable ready_cv_;  // consumer: a batch was finished
  int64_t next_claim_ = 0;            // the next batch a worker takes
  int64_t window_end_ = 0;            // workers claim only batches below this (bounded prefetch)
  std::map<int64_t, Slot> ready_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace datapar
