// See outer_exchange.h.
//
// Note [A quantised average]
// An all-reduce cannot sum int8 (or bf16 without losing what it adds), so the quantised
// exchange is a reduce-scatter and an all-gather written out: each rank cuts its values
// into one chunk per rank, encodes them (bf16: a cast; int8: each block of kInt8Block
// elements scaled by its largest magnitude to [-127, 127], the scales in float32), and sends
// chunk j to rank j (all_to_all); rank j decodes the chunks it received, sums them in float32
// in rank order and divides by the ranks, encodes that mean and every rank gathers every
// rank's (all_gather) and decodes them. Each rank sends 2 (n - 1) / n of the values once each
// way, as a ring all-reduce does, in 1 or 2 bytes instead of 4; every rank decodes the same
// bytes, so the result is the same everywhere, which DiLoCo needs (the ranks' outer
// parameters must not drift apart).
#include "diloco/outer_exchange.h"

#include <ATen/ATen.h>

#include <vector>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

// Encoded values: the payload and, for int8, one scale per block.
struct Encoded {
  at::Tensor payload;
  at::Tensor scales;
};

Encoded encode(const at::Tensor& values, const std::string& dtype) {
  if (dtype == "bf16") return {values.to(at::kBFloat16), at::Tensor()};
  const at::Tensor blocks = values.view({-1, kInt8Block});
  const at::Tensor scales = blocks.abs().amax(1).div_(127.0).clamp_min_(1e-30);
  const at::Tensor q = blocks.div(scales.unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar);
  return {q.view({-1}), scales};
}

at::Tensor decode(const at::Tensor& payload, const at::Tensor& scales, const std::string& dtype) {
  if (dtype == "bf16") return payload.to(at::kFloat);
  return payload.to(at::kFloat).view({-1, kInt8Block}).mul_(scales.unsqueeze(1)).view({-1});
}

}  // namespace

at::Tensor outer_average(ProcessGroup& group, const at::Tensor& values, const std::string& dtype) {
  DATAPAR_CHECK(values.scalar_type() == at::kFloat && values.dim() == 1,
                "DiLoCo: the outer exchange takes flat float32 values, not ", values.scalar_type(), " ", values.sizes(),
                ".");
  const int n = group.size();
  if (dtype == "float32") {
    at::Tensor sum = values.clone();
    group.all_reduce(sum, ReduceOp::kSum)->wait();
    return sum.div_(n);
  }
  DATAPAR_CHECK(dtype == "bf16" || dtype == "int8", "DiLoCo: the outer dtype \"", dtype,
                "\" is not one of float32, bf16 and int8.");
  // One chunk per rank, each a whole number of int8 blocks.
  const int64_t numel = values.numel();
  const int64_t unit = static_cast<int64_t>(n) * kInt8Block;
  const int64_t padded = (numel + unit - 1) / unit * unit;
  const int64_t chunk = padded / n;
  at::Tensor whole = at::zeros({padded}, values.options());
  whole.narrow(0, 0, numel).copy_(values);

  const Encoded mine = encode(whole, dtype);
  at::Tensor received = at::empty_like(mine.payload);
  group.all_to_all_single(received, mine.payload)->wait();
  at::Tensor received_scales;
  if (mine.scales.defined()) {
    received_scales = at::empty_like(mine.scales);
    group.all_to_all_single(received_scales, mine.scales)->wait();
  }
  // This rank's chunk of the mean: the ranks' parts decoded and summed in rank order.
  const int64_t chunk_blocks = chunk / kInt8Block;
  at::Tensor mean = at::zeros({chunk}, values.options());
  for (int r = 0; r < n; ++r) {
    const at::Tensor scales =
        received_scales.defined() ? received_scales.narrow(0, r * chunk_blocks, chunk_blocks) : at::Tensor();
    mean.add_(decode(received.narrow(0, r * chunk, chunk), scales, dtype));
  }
  mean.div_(n);

  const Encoded part = encode(mean, dtype);
  at::Tensor gathered = at::empty({padded}, part.payload.options());
  group.all_gather(gathered.chunk(n), part.payload)->wait();
  at::Tensor gathered_scales;
  if (part.scales.defined()) {
    gathered_scales = at::empty({padded / kInt8Block}, part.scales.options());
    group.all_gather(gathered_scales.chunk(n), part.scales)->wait();
  }
  return decode(gathered, gathered_scales, dtype).narrow(0, 0, numel);
}

int64_t outer_average_bytes(int64_t numel, int ranks, const std::string& dtype) {
  if (ranks <= 1) return 0;
  if (dtype == "float32") return 2 * (ranks - 1) * numel * 4 / ranks;  // a ring all-reduce
  const int64_t unit = static_cast<int64_t>(ranks) * kInt8Block;
  const int64_t padded = (numel + unit - 1) / unit * unit;
  const int64_t element = dtype == "bf16" ? 2 : 1;
  const int64_t scales = dtype == "int8" ? padded / kInt8Block * 4 : 0;
  return 2 * (ranks - 1) * (padded * element + scales) / ranks;
}

}  // namespace datapar::detail
