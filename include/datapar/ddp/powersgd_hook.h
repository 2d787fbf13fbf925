// PowerSGD (Vogels et al., 2019): DistributedDataParallel's gradients compressed to low rank
// before they cross the network, as PyTorch's powerSGD_hook and batched_powerSGD_hook.
//
// Each gradient viewed as an n x m matrix M (its first dimension by the rest) is sent as two
// thin matrices: P = M Q (n x r), all-reduced and orthonormalized, then Q = M^T P (m x r),
// all-reduced; M is replaced by P Q^T. That is (n + m) r values instead of n m. Gradients
// that compression would not shrink by min_compression_rate (biases, small layers) are
// all-reduced as they are. With error feedback each rank adds what compression lost of its
// gradient last time before compressing again; with warm start each step's Q starts from
// the last one instead of random values. The first start_iter steps are plain all-reduces
// (DDP sizes its buckets in the first ones, and the model moves most then).
//
//   datapar::PowerSgdOptions options;
//   options.matrix_approximation_rank = 4;
//   auto powersgd = datapar::powersgd_hook(options);
//   ddp.register_comm_hook(powersgd);
//   ... train ...
//   save_state_dict(powersgd->state_dict(), path);  // a resumed run continues exactly
//
// Batched (batched_powerSGD_hook): each bucket as one square matrix, padded with zeros:
// fewer, larger products; for buckets of many small layers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "datapar/ddp/comm_hook.h"
#include "datapar/state_dict.h"

namespace datapar {

// PyTorch's PowerSGDState options, with its defaults.
struct PowerSgdOptions {
  int matrix_approximation_rank = 1;
  // Steps of plain all-reduce first (start_powerSGD_iter); more than 1 with error feedback
  // or warm start.
  int64_t start_iter = 1000;
  // A matrix is compressed only if (n + m) r * min_compression_rate < n m.
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  // Added to each column's norm when orthonormalizing (0: none; a zero column gives zeros).
  double orthogonalization_epsilon = 0;
  // The random initial Qs, the same on every rank.
  uint64_t random_seed = 0;
  // batched_powerSGD_hook: each bucket one square matrix.
  bool batched = false;
};

class PowerSgdHook : public CommHook {
 public:
  explicit PowerSgdHook(PowerSgdOptions options);
  ~PowerSgdHook() override;

  std::shared_ptr<Work> run(ProcessGroup& group, GradBucket& bucket) override;
  void finish(GradBucket& bucket) override;

  const PowerSgdOptions& options() const { return options_; }
  // Steps (backward passes) seen so far.
  int64_t iterations() const { return iterations_; }
  // Gradient elements before and after compression, over every compressed step so far.
  int64_t numel_before() const { return numel_before_; }
  int64_t numel_after() const { return numel_after_; }

  // The state a resumed run needs to continue exactly: the step count, the random draws
  // made, each parameter's error and warm-start P and Q (by its place among DDP's
  // parameters: the same however DDP buckets them), and under `batched` each bucket's.
  // load_state_dict() before the first step.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  // What is kept of one parameter (per layer), or of one bucket (batched): what compression
  // lost of this rank's last gradient, and the last P and Q (warm start).
  struct Kept {
    at::Tensor error, p, q;
  };
  // One compressed matrix of this step: a view of the bucket's input, and its P and Q.
  struct Matrix {
    at::Tensor m;
    Kept* kept;
  };
  struct Step {
    at::Tensor input;   // the gradient with the error added (padded to a square, batched)
    at::Tensor before;  // `input` before the reduction (error feedback)
    at::Tensor qs;      // every matrix's Q side by side, in flight
    at::Tensor first;   // a bucket with nothing compressed: its gradients, in flight
    std::vector<at::Tensor> uncompressed;  // and where they go back
    std::vector<Matrix> matrices;
    int world = 1;
    bool compressing = false;
  };

  // This step's matrices of `bucket` (per layer, or the bucket as one square), with their
  // kept P and Q (random and new when there are none of the right size); the others in
  // `uncompressed`.
  void plan(GradBucket& bucket, Step& step, std::vector<at::Tensor>& uncompressed);
  // The Kept of `bucket`'s parameter `i`, or of the bucket itself (batched).
  Kept& kept_of(const GradBucket& bucket, size_t i);
  // Fills `q` with random values, the same on every rank (the n-th draw of the seed).
  void randomize(at::Tensor& q);
  // Adds, or takes, each kept error to or from `flat` (the bucket's input).
  void add_errors(const GradBucket& bucket, at::Tensor& flat);
  void keep_errors(const GradBucket& bucket, const at::Tensor& flat);

  PowerSgdOptions options_;
  int64_t iterations_ = 0;
  int64_t draws_ = 0;
  int64_t numel_before_ = 0, numel_after_ = 0;
  std::map<size_t, Kept> params_;   // per layer: by parameter index
  std::map<size_t, Kept> batched_;  // batched: by bucket index
  std::map<size_t, Step> steps_;    // by bucket index, between run() and finish()
};

std::shared_ptr<PowerSgdHook> powersgd_hook(PowerSgdOptions options = {});

}  // namespace datapar
