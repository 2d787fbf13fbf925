// One conformance suite for every backend: expect_* functions that drive a ProcessGroup's
// collectives and check what they give against closed forms of the rank and world size.
// Every member calls each with the same arguments in the same order, so the collectives
// pair up. Run on Gloo over TCP (gloo_process_group_test), the shared-memory layer over
// Gloo (shared_memory_test), MPI with and without that layer (mpi_process_group_test) and
// NCCL (gpu/nccl_conformance.cc, on one GPU and on two); what a backend does beyond this
// (sizes past a slot, the ring, failures) stays in its own test file.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::testing {

inline const std::vector<at::ScalarType> kReducibleDtypes = {at::kFloat, at::kDouble, at::kInt,
                                                             at::kLong,  at::kHalf,   at::kBFloat16};

inline at::Tensor filled(const ProcessGroup& g, at::IntArrayRef shape, double value, at::ScalarType dtype) {
  return at::full(shape, value, g.options(dtype));
}

// all_reduce: the sum of rank ids for every reducible dtype and each of `counts` elements;
// every op on rank + 1 (avg for floating types); a non-contiguous tensor, reduced in place.
inline void expect_all_reduce(ProcessGroup& g, const std::vector<int64_t>& counts = {0, 1, 7, 1025}) {
  const int n = g.size(), rank = g.rank();
  int factorial = 1;
  for (int i = 2; i <= n; ++i) factorial *= i;
  for (at::ScalarType dtype : kReducibleDtypes) {
    for (int64_t count : counts) {
      at::Tensor t = filled(g, {count}, rank, dtype);
      g.all_reduce(t)->wait();
      EXPECT_TRUE(at::equal(t, filled(g, {count}, n * (n - 1) / 2, dtype))) << dtype << " x " << count << " at n=" << n;
    }
    auto value = [&](ReduceOp op) {
      at::Tensor t = filled(g, {3}, rank + 1, dtype);
      g.all_reduce(t, op)->wait();
      return t[2].item<double>();
    };
    EXPECT_EQ(value(ReduceOp::kSum), n * (n + 1) / 2) << dtype;
    if (at::isFloatingType(dtype)) EXPECT_EQ(value(ReduceOp::kAvg), (n + 1) / 2.0) << dtype;
    EXPECT_EQ(value(ReduceOp::kMin), 1) << dtype;
    EXPECT_EQ(value(ReduceOp::kMax), n) << dtype;
    EXPECT_EQ(value(ReduceOp::kProduct), factorial) << dtype;
  }
  at::Tensor base = filled(g, {4, 6}, rank + 1, at::kFloat);
  at::Tensor view = base.t();
  g.all_reduce(view)->wait();
  EXPECT_TRUE(at::equal(base, filled(g, {4, 6}, n * (n + 1) / 2, at::kFloat)));
}

// broadcast from every root, of every dtype a model's parameters and buffers may have.
inline void expect_broadcast(ProcessGroup& g) {
  const int n = g.size(), rank = g.rank();
  for (int root = 0; root < n; ++root) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kHalf, at::kBFloat16, at::kBool,
                                 at::kByte, at::kChar, at::kShort}) {
      const at::Tensor expected = at::arange(9).remainder(2).to(g.options(dtype));
      at::Tensor t = rank == root ? expected.clone() : at::zeros({9}, g.options(dtype));
      g.broadcast(t, root)->wait();
      EXPECT_TRUE(at::equal(t, expected)) << dtype << " from " << root;
    }
  }
}

// all_gather, gather, scatter, reduce, reduce_scatter (sum and avg) and all_to_all_single,
// for every reducible dtype.
inline void expect_gathers_and_scatters(ProcessGroup& g) {
  const int n = g.size(), rank = g.rank();
  const int root = n - 1;
  for (at::ScalarType dtype : kReducibleDtypes) {
    const auto like = [&](double v) { return filled(g, {2, 3}, v, dtype); };
    std::vector<at::Tensor> gathered;  // all_gather: outputs[i] holds rank i's input
    for (int i = 0; i < n; ++i) gathered.push_back(like(-1));
    g.all_gather(gathered, like(rank))->wait();
    for (int i = 0; i < n; ++i) EXPECT_TRUE(at::equal(gathered[i], like(i))) << "all_gather " << i << " " << dtype;
    std::vector<at::Tensor> at_root;  // gather to the last rank
    if (rank == root) {
      for (int i = 0; i < n; ++i) at_root.push_back(like(-1));
    }
    g.gather(at_root, like(rank * 2), root)->wait();
    for (int i = 0; i < static_cast<int>(at_root.size()); ++i) EXPECT_TRUE(at::equal(at_root[i], like(i * 2))) << dtype;
    std::vector<at::Tensor> pieces;  // scatter from rank 0: rank i gets 10 * i
    if (rank == 0) {
      for (int i = 0; i < n; ++i) pieces.push_back(like(10 * i));
    }
    at::Tensor mine = like(-1);
    g.scatter(mine, pieces, 0)->wait();
    EXPECT_TRUE(at::equal(mine, like(10 * rank))) << dtype;
    at::Tensor r = like(rank);  // reduce to the last rank: the sum of rank ids
    g.reduce(r, root)->wait();
    if (rank == root) EXPECT_TRUE(at::equal(r, like(n * (n - 1) / 2))) << dtype;
    std::vector<at::Tensor> inputs;  // reduce_scatter: inputs[j] = rank + j, so rank j gets n*j + n(n-1)/2
    for (int j = 0; j < n; ++j) inputs.push_back(like(rank + j));
    at::Tensor out = like(-1);
    g.reduce_scatter(out, inputs)->wait();
    EXPECT_TRUE(at::equal(out, like(n * rank + n * (n - 1) / 2))) << dtype;
    // all_to_all_single: chunk j of rank i's input is 10*i + j; chunk i of the output comes from rank i.
    at::Tensor send = at::empty({2 * n, 3}, g.options(dtype));
    for (int j = 0; j < n; ++j) send.narrow(0, 2 * j, 2).fill_(10 * rank + j);
    at::Tensor receive = at::empty({2 * n, 3}, g.options(dtype));
    g.all_to_all_single(receive, send)->wait();
    for (int i = 0; i < n; ++i) EXPECT_EQ(receive[2 * i][1].item<double>(), 10 * i + rank) << dtype;
  }
  at::Tensor mean = at::empty({4}, g.options(at::kDouble));
  const std::vector<at::Tensor> same(static_cast<size_t>(n), filled(g, {4}, rank, at::kDouble));
  g.reduce_scatter(mean, same, ReduceOp::kAvg)->wait();
  EXPECT_EQ(mean[0].item<double>(), (n - 1) / 2.0);
}

// The coalesced forms, over lists of mixed dtypes and layouts.
inline void expect_coalesced(ProcessGroup& g) {
  const int n = g.size(), rank = g.rank();
  std::vector<at::Tensor> tensors = {filled(g, {5}, rank, at::kFloat),          filled(g, {2, 3}, rank + 1, at::kLong),
                                     filled(g, {3, 4}, 2 * rank, at::kDouble).t(), filled(g, {4}, rank, at::kBFloat16),
                                     filled(g, {1}, 1.0, at::kFloat),            filled(g, {2}, rank, at::kHalf)};
  g.all_reduce_coalesced(tensors)->wait();
  const int sum = n * (n - 1) / 2;
  EXPECT_TRUE(at::equal(tensors[0], filled(g, {5}, sum, at::kFloat)));
  EXPECT_TRUE(at::equal(tensors[1], filled(g, {2, 3}, sum + n, at::kLong)));
  EXPECT_TRUE(at::equal(tensors[2], filled(g, {4, 3}, 2 * sum, at::kDouble)));
  EXPECT_TRUE(at::equal(tensors[3], filled(g, {4}, sum, at::kBFloat16)));
  EXPECT_TRUE(at::equal(tensors[4], filled(g, {1}, n, at::kFloat)));
  EXPECT_TRUE(at::equal(tensors[5], filled(g, {2}, sum, at::kHalf)));
  std::vector<at::Tensor> params = {filled(g, {3}, rank, at::kFloat), filled(g, {2, 2}, -rank, at::kLong),
                                    filled(g, {7}, rank * 0.5, at::kFloat)};
  g.broadcast_coalesced(params, n - 1)->wait();
  EXPECT_TRUE(at::equal(params[0], filled(g, {3}, n - 1, at::kFloat)));
  EXPECT_TRUE(at::equal(params[1], filled(g, {2, 2}, 1 - n, at::kLong)));
  EXPECT_TRUE(at::equal(params[2], filled(g, {7}, (n - 1) * 0.5, at::kFloat)));
}

// The whole suite.
inline void expect_conformance(ProcessGroup& g) {
  expect_all_reduce(g);
  expect_broadcast(g);
  expect_gathers_and_scatters(g);
  expect_coalesced(g);
}

}  // namespace datapar::testing
