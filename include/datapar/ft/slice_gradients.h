// SliceGradients: the gradient of a global batch with the same bits whoever is alive (Note
// [Gradients that do not depend on who is alive] in src/ft/slice_gradients.cc). A global
// batch is cut into a fixed number of slices, the same in every membership; each member
// trains its slices one by one, keeping each one's gradient, and reduce() sums them in slice
// order into every parameter's .grad.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::ft {

// Slice `index` of `count` of a global batch: the rows a rank of a job of `count` ranks
// would train, whoever trains them now.
struct Slice {
  int index = 0;
  int count = 1;
  // Of a global batch of `rows` rows, this slice's first row and the row after its last.
  int64_t begin(int64_t rows) const { return rows * index / count; }
  int64_t end(int64_t rows) const { return rows * (index + 1) / count; }
};

// The slices member `rank` of `size` trains: [first, last). Contiguous, in rank order, as
// even as they divide; a member beyond `slices` trains none.
struct SliceRange {
  int first = 0, last = 0;
};
SliceRange slices_of(int rank, int size, int slices);

namespace detail {

class SliceGradients {
 public:
  // Over `params`: every one floating point, of one dtype and device.
  explicit SliceGradients(std::vector<at::Tensor> params);

  // A step starts: this member, `rank` of `size`, will train slices_of(rank, size, slices).
  void begin(int rank, int size, int slices);
  // After the backward of this member's next slice (trained on `rows` rows, its loss the mean
  // over them): keeps the parameters' gradients (zero where undefined) and zeroes them.
  void keep(int64_t rows);
  // Collective over `group` (begin()'s rank and size): every parameter's .grad becomes the sum
  // over slices i, in order, of (rows_i / rows) * g_i, the gradient of the whole global
  // batch (an alias of a buffer kept here, valid until the next begin()). Throws what the
  // group throws.
  void reduce(ProcessGroup& group);

 private:
  std::vector<at::Tensor> params_;
  int64_t numel_ = 0;
  int rank_ = 0, size_ = 1, slices_ = 1;
  int kept_ = 0;        // slices kept since begin()
  at::Tensor mine_;     // [most, numel_ + 1]: each slice kept here, its rows last
  at::Tensor gathered_;  // [size, most, numel_ + 1]: every member's
  at::Tensor sum_, scaled_;  // [numel_]
};

}  // namespace detail
}  // namespace datapar::ft
