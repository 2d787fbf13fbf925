// Datasets as the loader sees them: something with a size that returns a batch for a list
// of indices. TensorDataset holds all samples in two tensors (inputs and targets), which is
// what Fashion-MNIST, MNIST and the synthetic images are once loaded.
//
// This is not libtorch's torch::data::Dataset: that one returns a vector of single
// examples that are then stacked, while a batch here is one index_select per tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace datapar {

// One batch. data and target come from the dataset; indices and is_padding are filled in
// by the loader.
struct Batch {
  at::Tensor data;        // (B, ...) inputs, e.g. (B, 1, 28, 28) float
  at::Tensor target;      // (B,) int64 class labels
  at::Tensor indices;     // (B,) int64 dataset indices of the rows
  at::Tensor is_padding;  // (B,) bool: rows that repeat a sample for even rank sizes; metrics skip them

  int64_t size() const { return data.defined() ? data.size(0) : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of samples.
  virtual int64_t size() const = 0;

  // The samples at `indices` ((B,) int64, each in [0, size())), in that order; fills data
  // and target. Called from several loader threads at once: must be thread-safe.
  virtual Batch get_batch(const at::Tensor& indices) const = 0;
};

// All samples in memory: data (N, ...) and target (N,). Thread-safe (reads only).
class TensorDataset : public Dataset {
 public:
  // REQUIRES: data.size(0) == target.size(0). Throws InvalidArgumentError otherwise.
  TensorDataset(at::Tensor data, at::Tensor target);

  int64_t size() const override { return data_.size(0); }
  Batch get_batch(const at::Tensor& indices) const override;

  const at::Tensor& data() const { return data_; }
  const at::Tensor& target() const { return target_; }

 private:
  at::Tensor data_;
  at::Tensor target_;
};

}  // namespace datapar
