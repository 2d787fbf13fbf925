// SliceGradients: the gradient of a global batch with the same bits whoever is alive (Note
// [Gradients that do not depend on who is alive] in src/ft/slice_gradients.cc). A global
// batch is cut into a fixed number of slices, the same in every membership; each member
// trains its slices one by one, keeping each one's gradient, and reduce() sums them in slice
// order into every parameter's .grad. ShardedSliceGradients does the same for FSDP, where
// each member keeps only its shard of the sum (and the previous rank's).
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
  // A pass that only keeps the collectives in step (FaultTolerantFsdp: a member with fewer
  // slices than another trains one of its own again, its gradient dropped): train it as
  // usual but count nothing of it.
  bool shadow = false;
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
// The most slices one member of `size` trains.
int most_slices_of(int size, int slices);

namespace detail {

// sum = the sum over slices i, in order, of (rows[i] / sum of rows) * grads[i], elementwise,
// with the same bits wherever a tensor is cut (Note [Gradients that do not depend on who is
// alive]); `scaled`: a buffer of sum's size.
void sum_in_slice_order(at::Tensor& sum, at::Tensor& scaled, const std::vector<at::Tensor>& grads,
                        const std::vector<double>& rows);

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

// For FSDP: the model's parameters whole (FSDP's units gathered, their gradients kept
// unsharded under no_sync) give each slice's gradient; every member's slice of a round is
// all-gathered unit by unit, and each member keeps only its shard of it and the previous
// rank's (FsdpTwoCopies's). reduce() sums the kept parts in slice order.
class ShardedSliceGradients {
 public:
  // One FSDP unit: its parameters, where each starts in the unit's flat buffer, the flat's
  // elements (unpadded) and one rank's shard of it (the flat padded to `shard` times the
  // group's size).
  struct Unit {
    std::vector<at::Tensor> params;
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    int64_t shard = 0;
  };
  // The units of one membership epoch's FSDP, over a group of `size`, in shard order;
  // `options`: the shards' dtype and device. `shard_size` 0: the units are sharded over the
  // whole group, and each member keeps the previous rank's shard too (FsdpTwoCopies);
  // else over replica groups of `shard_size` consecutive ranks (HSDP), and each member
  // keeps only the shard of its index in its group (rank % shard_size).
  ShardedSliceGradients(std::vector<Unit> units, const at::TensorOptions& options, int rank, int size,
                        int shard_size = 0);

  // A step starts: this member trains slices_of(rank, size, slices), in most_slices_of()
  // passes (the last ones shadows when it has fewer).
  void begin(int slices);
  // Collective, after the backward of this member's next pass (`rows`: its slice's; ignored
  // for a shadow): every member's pass, unit by unit; keeps this rank's shard (and the
  // previous rank's) of each slice trained, and releases the parameters' gradients. In
  // replica groups, with `shard_group` (this member's replica group) and `replicate_group`
  // (the members of its index in every group, in group order): each unit's gradients go
  // whole within the replica group, and across groups only the pieces of each index (a
  // shard_size-th of the bytes over the links between machines).
  void exchange(ProcessGroup& group, int64_t rows, ProcessGroup* shard_group = nullptr,
                ProcessGroup* replicate_group = nullptr);
  // After every pass: `own[u]`'s .grad (this rank's shard of unit u) becomes the sum over
  // slices, in order, weighted by rows (an alias of a buffer kept here, valid until the
  // next begin()); `previous` (the previous rank's shards side by side, undefined in a
  // group of one and in replica groups) is set to its part of the sum.
  void reduce(std::vector<at::Tensor>& own, const at::Tensor& previous);

 private:
  std::vector<Unit> units_;
  at::TensorOptions options_;
  int rank_ = 0, size_ = 1, slices_ = 1;
  int shard_size_ = 1;   // ranks the units are sharded over
  int copies_ = 1;       // 2: the previous rank's shard kept too
  int passes_ = 0;       // passes exchanged since begin()
  int64_t total_ = 0;    // elements of one rank's shards, all units
  at::Tensor kept_;      // [slices, copies_ * total_]: this rank's shards, then the previous rank's
  std::vector<double> rows_;
  at::Tensor sum_, scaled_;  // [copies_ * total_]

  // Of `unit`'s gradient `mine` ([numel + 1], its rows last), every member's piece of this
  // rank's index ([size, shard + 1], rows last), gathered within the replica group and then
  // across the groups.
  at::Tensor gather_pieces(const Unit& unit, const at::Tensor& mine, ProcessGroup& shard_group,
                           ProcessGroup& replicate_group) const;
};

}  // namespace detail
}  // namespace datapar::ft
