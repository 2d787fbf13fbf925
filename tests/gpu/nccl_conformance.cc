// See nccl_conformance.h. Each rank is a process of its own (one per GPU), so the tests are
// registered at run time around the job's group, in the same order on every rank.
#include "gpu/nccl_conformance.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <utility>

#include "datapar/error.h"
#include "testing/conformance.h"
#include "testing/expect_throw.h"

namespace datapar::testing {
namespace {

class OnTheGroup : public ::testing::Test {
 public:
  explicit OnTheGroup(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

void add(const char* name, std::function<void()> body) {
  ::testing::RegisterTest("NcclProcessGroup", name, nullptr, nullptr, __FILE__, __LINE__,
                          [body = std::move(body)]() -> ::testing::Test* { return new OnTheGroup(body); });
}

// NCCL pairs a send with the peer's next recv: a ring where even ranks send first and odd
// ones receive first. 64 MiB, past any eager buffer of NCCL's.
void expect_a_ring_of_large_messages(ProcessGroup& g) {
  const int n = g.size(), rank = g.rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  const at::Tensor out = at::full({16 << 20}, rank, g.options(at::kFloat));
  at::Tensor in = at::empty({16 << 20}, g.options(at::kFloat));
  if (rank % 2 == 0) {
    g.send(out, next)->wait();
    g.recv(in, previous)->wait();
  } else {
    g.recv(in, previous)->wait();
    g.send(out, next)->wait();
  }
  EXPECT_TRUE(at::equal(in, at::full_like(in, previous)));
  EXPECT_THROW_MSG(g.send(out, next, /*tag=*/3), InvalidArgumentError, "no message tags");
}

// Operations that only move data take every dtype, as bytes where NCCL has no such type;
// a reduction of a type NCCL cannot reduce is refused before anything is sent.
void expect_every_dtype_moves(ProcessGroup& g) {
  const int n = g.size(), rank = g.rank();
  for (at::ScalarType dtype : {at::kShort, at::kBool, at::kComplexFloat, at::kComplexDouble}) {
    const at::Tensor expected = at::arange(10).remainder(2).to(g.options(dtype));
    at::Tensor t = rank == 0 ? expected.clone() : at::zeros({10}, g.options(dtype));
    g.broadcast(t, 0)->wait();
    EXPECT_TRUE(at::equal(t, expected)) << dtype;
    std::vector<at::Tensor> gathered;
    for (int i = 0; i < n; ++i) gathered.push_back(at::zeros({10}, g.options(dtype)));
    g.all_gather(gathered, expected)->wait();
    for (int i = 0; i < n; ++i) EXPECT_TRUE(at::equal(gathered[i], expected)) << dtype << " from " << i;
  }
  EXPECT_THROW_MSG(g.all_reduce(at::ones({3}, g.options(at::kShort))), InvalidArgumentError,
                   "the nccl backend reduces float32/64");
}

}  // namespace

int nccl_collectives(ProcessGroup& group) {
  add("PassesTheConformanceSuite", [&group] { expect_conformance(group); });
  add("SendsAndReceivesLargeMessagesAroundARing", [&group] { expect_a_ring_of_large_messages(group); });
  add("MovesEveryDtype", [&group] { expect_every_dtype_moves(group); });
  int argc = 1;
  char name[] = "nccl_probe";
  char* argv[] = {name, nullptr};
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  group.barrier()->wait();
  return failed;
}

}  // namespace datapar::testing
