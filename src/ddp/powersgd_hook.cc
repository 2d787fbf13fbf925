// PowerSgdHook. See datapar/ddp/powersgd_hook.h.
//
// Note [PowerSGD on gradients DDP has scaled]
// PyTorch's hook gets each rank's gradient as it is and divides what it all-reduces by the
// world size; datapar's DDP hands a hook each rank's gradient already scaled (1/world, or
// its share of the global batch) and wants the sum. The products are linear and the
// orthonormalization ignores scale, so the result is the same: P Q^T of the scaled
// gradients is the average's approximation. The error kept is in the scaled units too: the
// input minus this rank's part of the result (the result over the world size), which is
// PyTorch's error over the world size, so the next step's scaled input is PyTorch's over
// the world size as well.
#include "datapar/ddp/powersgd_hook.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "datapar/error.h"

namespace datapar {
namespace {

using detail::str_cat;

// Gram-Schmidt on the columns of `matrix` (n x r), in place: orthonormal columns (PyTorch's
// _orthogonalize_gram_schmidt; its QR for r > 2 spans the same columns).
void orthogonalize(at::Tensor& matrix, double epsilon) {
  const int64_t columns = matrix.size(1);
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrix.narrow(1, i, 1);
    const at::Tensor norm = column.norm(2, {0}, /*keepdim=*/true);
    if (epsilon == 0) {
      column.div_(norm);
      column.nan_to_num_(0, 0, 0);  // an all-zero column stays zero
    } else {
      column.div_(norm + epsilon);
    }
    if (i + 1 < columns) {
      at::Tensor rest = matrix.narrow(1, i + 1, columns - i - 1);
      rest.sub_((column * rest).sum(0, /*keepdim=*/true) * column);
    }
  }
}

bool should_compress(int64_t n, int64_t m, int64_t rank, double min_rate) {
  return static_cast<double>((n + m) * rank) * min_rate < static_cast<double>(n * m);
}

}  // namespace

PowerSgdHook::PowerSgdHook(PowerSgdOptions options) : options_(options) {
  DATAPAR_CHECK(options_.matrix_approximation_rank >= 1, "powersgd_hook: the rank is ",
                options_.matrix_approximation_rank, "; use 1 or more (PyTorch's default 1, the paper's 2 to 4).");
  DATAPAR_CHECK(options_.start_iter > 1 || !(options_.use_error_feedback || options_.warm_start),
                "powersgd_hook: start_iter is ", options_.start_iter,
                "; with error feedback or warm start use more than 1 (DDP sizes its buckets in the first steps).");
  DATAPAR_CHECK(options_.min_compression_rate >= 0 && options_.orthogonalization_epsilon >= 0,
                "powersgd_hook: min_compression_rate and orthogonalization_epsilon are at least 0.");
}

PowerSgdHook::~PowerSgdHook() = default;

std::shared_ptr<PowerSgdHook> powersgd_hook(PowerSgdOptions options) {
  return std::make_shared<PowerSgdHook>(options);
}

void PowerSgdHook::randomize(at::Tensor& q) {
  // The n-th draw of the seed: every rank makes the same draws in the same order.
  at::Generator generator = at::detail::createCPUGenerator(options_.random_seed * 1000003 + draws_++);
  q.copy_(at::randn(q.sizes(), generator, q.options().device(at::kCPU)));
}

PowerSgdHook::Kept& PowerSgdHook::kept_of(const GradBucket& bucket, size_t i) {
  if (options_.batched) return batched_[bucket.index];
  return params_[bucket.parameter_indices.at(i)];
}

void PowerSgdHook::add_errors(const GradBucket& bucket, at::Tensor& flat) {
  if (options_.batched) {
    const Kept& k = kept_of(bucket, 0);
    if (k.error.defined() && k.error.numel() == flat.numel()) flat.add_(k.error);
    return;
  }
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    const Kept& k = kept_of(bucket, i);
    const int64_t numel = bucket.parameters[i].numel();
    if (k.error.defined() && k.error.numel() == numel) flat.narrow(0, bucket.offsets[i], numel).add_(k.error);
  }
}

void PowerSgdHook::keep_errors(const GradBucket& bucket, const at::Tensor& flat) {
  if (options_.batched) {
    kept_of(bucket, 0).error = flat;
    return;
  }
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    kept_of(bucket, i).error = flat.narrow(0, bucket.offsets[i], bucket.parameters[i].numel()).clone();
  }
}

void PowerSgdHook::plan(GradBucket& bucket, Step& step, std::vector<at::Tensor>& uncompressed) {
  const int64_t rank = options_.matrix_approximation_rank;
  const auto add = [&](const at::Tensor& m, int64_t r, Kept& k) {
    const int64_t n = m.size(0), cols = m.size(1);
    const bool warm = options_.warm_start && k.p.defined() && k.p.size(0) == n && k.q.defined() &&
                      k.q.size(0) == cols && k.q.size(1) == r;
    if (!warm) {
      k.p = at::empty({n, r}, m.options());
      k.q = at::empty({cols, r}, m.options());
      randomize(k.q);
    }
    step.matrices.push_back(Matrix{m, &k});
  };
  step.matrices.clear();
  if (options_.batched) {
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(step.input.numel()))));
    const int64_t r = std::min(side, rank);
    add(step.input.view({side, side}), r, kept_of(bucket, 0));
    numel_before_ += bucket.buffer.numel();
    numel_after_ += 2 * side * r;
    return;
  }
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    const at::Tensor& param = bucket.parameters[i];
    const int64_t numel = param.numel();
    const at::Tensor flat = step.input.narrow(0, bucket.offsets[i], numel);
    const int64_t n = param.dim() == 0 ? 1 : param.size(0), m = numel / std::max<int64_t>(n, 1);
    const int64_t r = std::min({n, m, rank});
    numel_before_ += numel;
    if (numel > 0 && should_compress(n, m, r, options_.min_compression_rate)) {
      add(flat.view({n, m}), r, kept_of(bucket, i));
      numel_after_ += (n + m) * r;
    } else {
      uncompressed.push_back(flat);
      numel_after_ += numel;
    }
  }
}

std::shared_ptr<Work> PowerSgdHook::run(ProcessGroup& group, GradBucket& bucket) {
  Step& step = steps_[bucket.index];
  step.compressing = iterations_ >= options_.start_iter;
  if (!step.compressing) return group.all_reduce(bucket.buffer, ReduceOp::kSum);
  const torch::NoGradGuard no_grad;
  step.world = group.size();
  const int64_t length = bucket.buffer.numel();
  int64_t padded = length;
  if (options_.batched) {
    const auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(length))));
    padded = side * side;
  }
  step.input = at::zeros({padded}, bucket.buffer.options());
  step.input.narrow(0, 0, length).copy_(bucket.buffer);
  if (options_.use_error_feedback) {
    add_errors(bucket, step.input);
    step.before = step.input.clone();  // the error is measured against this
  }
  std::vector<at::Tensor> uncompressed;
  plan(bucket, step, uncompressed);
  for (Matrix& x : step.matrices) {
    orthogonalize(x.kept->q, options_.orthogonalization_epsilon);
    at::matmul_out(x.kept->p, x.m, x.kept->q);
  }
  // The uncompressed gradients and the Ps in one all-reduce; the Qs need the Ps first.
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : uncompressed) parts.push_back(t.reshape({-1}));
  for (const Matrix& x : step.matrices) parts.push_back(x.kept->p.reshape({-1}));
  at::Tensor first = at::cat(parts);  // a bucket holds a parameter at least
  if (step.matrices.empty()) {  // nothing of this bucket pays to compress: one all-reduce, left in flight
    step.first = first;
    step.uncompressed = std::move(uncompressed);
    return group.all_reduce(step.first, ReduceOp::kSum);
  }
  group.all_reduce(first, ReduceOp::kSum)->wait();
  int64_t at = 0;
  for (at::Tensor& t : uncompressed) {
    t.copy_(first.narrow(0, at, t.numel()));
    at += t.numel();
  }
  std::vector<at::Tensor> qs;
  for (Matrix& x : step.matrices) {
    at::Tensor& p = x.kept->p;
    p.copy_(first.narrow(0, at, p.numel()).view(p.sizes()));
    at += p.numel();
    orthogonalize(p, options_.orthogonalization_epsilon);
    at::matmul_out(x.kept->q, x.m.t(), p);
    qs.push_back(x.kept->q.reshape({-1}));
  }
  step.qs = at::cat(qs);
  return group.all_reduce(step.qs, ReduceOp::kSum);
}

void PowerSgdHook::finish(GradBucket& bucket) {
  Step& step = steps_[bucket.index];
  if (!step.compressing) {
    if (bucket.is_last) ++iterations_;
    return;
  }
  const torch::NoGradGuard no_grad;
  // The result, where the input was; the error: the input minus this rank's part of the
  // result (Note [PowerSGD on gradients DDP has scaled]). As PyTorch's, it covers the
  // gradients all-reduced uncompressed too, whose errors sum to zero over the ranks.
  int64_t at = 0;
  for (at::Tensor& t : step.uncompressed) {  // the bucket's one all-reduce
    t.copy_(step.first.narrow(0, at, t.numel()));
    at += t.numel();
  }
  at = 0;
  for (Matrix& x : step.matrices) {
    at::Tensor& q = x.kept->q;
    q.copy_(step.qs.narrow(0, at, q.numel()).view(q.sizes()));
    at += q.numel();
    at::matmul_out(x.m, x.kept->p, q.t());
    if (!options_.warm_start) x.kept->p = x.kept->q = at::Tensor();
  }
  if (options_.use_error_feedback) keep_errors(bucket, step.before.sub_(step.input, 1.0 / step.world));
  bucket.buffer.copy_(step.input.narrow(0, 0, bucket.buffer.numel()));
  step = Step{};
  if (bucket.is_last) ++iterations_;
}

namespace {

// Whether `key` is "<kind>.<index>.<what>", and its index and what.
bool parse_kept_key(const std::string& key, const std::string& kind, size_t& index, std::string& what) {
  if (key.rfind(kind + ".", 0) != 0) return false;
  const size_t begin = kind.size() + 1, dot = key.find('.', begin);
  DATAPAR_CHECK(dot != std::string::npos && dot > begin && key.find_first_not_of("0123456789", begin) == dot &&
                    dot - begin <= 9,
                "PowerSgdHook::load_state_dict: \"", key, "\" is not a parameter's or bucket's state.");
  index = std::stoul(key.substr(begin, dot - begin));
  what = key.substr(dot + 1);
  return true;
}

}  // namespace

StateDict PowerSgdHook::state_dict() const {
  StateDict out;
  out.insert("iterations", at::tensor(iterations_, at::kLong));
  out.insert("draws", at::tensor(draws_, at::kLong));
  out.insert("numel", at::tensor(std::vector<int64_t>{numel_before_, numel_after_}, at::kLong));
  for (const auto& [kind, kept] : {std::make_pair("param", &params_), std::make_pair("bucket", &batched_)}) {
    for (const auto& [index, k] : *kept) {
      const std::string prefix = str_cat(kind, ".", index, ".");
      if (k.error.defined()) out.insert(prefix + "error", k.error);
      if (k.p.defined()) out.insert(prefix + "p", k.p);
      if (k.q.defined()) out.insert(prefix + "q", k.q);
    }
  }
  return out;
}

void PowerSgdHook::load_state_dict(const StateDict& state) {
  const auto count = [&](const char* key) {
    const at::Tensor* t = state.find(key);
    DATAPAR_CHECK(t != nullptr && t->numel() >= 1 && t->scalar_type() == at::kLong,
                  "PowerSgdHook::load_state_dict: no \"", key, "\" count in the state; is it a PowerSGD hook's?");
    return *t;
  };
  const at::Tensor numel = count("numel");
  const int64_t iterations = count("iterations").item<int64_t>(), draws = count("draws").item<int64_t>();
  DATAPAR_CHECK(numel.numel() == 2 && iterations >= 0 && draws >= 0,
                "PowerSgdHook::load_state_dict: malformed counts in the state.");
  std::map<size_t, Kept> params, batched;
  for (const auto& item : state) {
    size_t index = 0;
    std::string what;
    std::map<size_t, Kept>* into = nullptr;
    if (parse_kept_key(item.key(), "param", index, what)) into = &params;
    if (parse_kept_key(item.key(), "bucket", index, what)) into = &batched;
    if (into == nullptr) continue;
    Kept& k = (*into)[index];
    at::Tensor* slot = what == "error" ? &k.error : what == "p" ? &k.p : what == "q" ? &k.q : nullptr;
    DATAPAR_CHECK(slot != nullptr, "PowerSgdHook::load_state_dict: \"", item.key(),
                  "\" is not a parameter's or bucket's state.");
    DATAPAR_CHECK(at::isFloatingType(item.value().scalar_type()) && item.value().dim() >= 1 && item.value().dim() <= 2,
                  "PowerSgdHook::load_state_dict: \"", item.key(), "\" is a ", item.value().scalar_type(), " tensor of ",
                  item.value().dim(), " dimensions, not a floating-point vector or matrix.");
    *slot = item.value().clone();
  }
  iterations_ = iterations;
  draws_ = draws;
  numel_before_ = numel[0].item<int64_t>();
  numel_after_ = numel[1].item<int64_t>();
  params_ = std::move(params);
  batched_ = std::move(batched);
  steps_.clear();
}

}  // namespace datapar
