// TensorDataset. See dataset.h.
#include "datapar/data/dataset.h"

#include <ATen/ATen.h>

#include "datapar/error.h"

namespace datapar {

TensorDataset::TensorDataset(at::Tensor data, at::Tensor target) : data_(std::move(data)), target_(std::move(target)) {
  DATAPAR_CHECK(data_.defined() && target_.defined() && data_.dim() >= 1 && target_.dim() >= 1,
                "TensorDataset: data and target must be tensors with a sample dimension first.");
  DATAPAR_CHECK_EQ(data_.size(0), target_.size(0), "TensorDataset: data and target have different sample counts");
}

Batch TensorDataset::get_batch(const at::Tensor& indices) const {
  DATAPAR_CHECK(indices.scalar_type() == at::kLong && indices.dim() == 1,
                "TensorDataset::get_batch: indices must be a 1-D int64 tensor.");
  if (indices.numel() > 0) {
    const int64_t lo = indices.min().item<int64_t>();
    const int64_t hi = indices.max().item<int64_t>();
    DATAPAR_CHECK(lo >= 0 && hi < size(), "TensorDataset::get_batch: index ", lo < 0 ? lo : hi,
                  " is outside the dataset [0, ", size(), ").");
  }
  Batch batch;
  batch.data = data_.index_select(0, indices);
  batch.target = target_.index_select(0, indices);
  batch.indices = indices;
  return batch;
}

}  // namespace datapar
