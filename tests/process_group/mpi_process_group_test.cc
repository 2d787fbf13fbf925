// The MPI backend, run by CTest under mpirun with 1, 2, 3 and 4 processes
// (tests/CMakeLists.txt). Every process runs every test, in the same order, so the
// collectives pair up; expected values are closed forms of the rank and world size.
// Rank 0 prints the usual report; other ranks print only their failures.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/nn/modules/linear.h>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/process_group/mpi.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/prefix_store.h"
#include "testing/captured_warnings.h"
#include "testing/conformance.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Options as init_process_group passes them: shared memory unless DATAPAR_MPI_SHM=0 (the
// ring runs in tests/CMakeLists.txt set it), resolved once.
MpiOptions options(std::chrono::milliseconds timeout = MpiOptions{}.timeout) {
  static const bool shared_memory = resolve_job_config().mpi_shared_memory;
  return MpiOptions{timeout, shared_memory};
}

// The whole job, made once (MPI is initialised then) and kept to the end.
ProcessGroup& world() {
  static const std::shared_ptr<ProcessGroup> group = new_mpi_process_group({}, options(60s));
  return *group;
}

const std::vector<at::ScalarType> kReducible = {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kHalf, at::kBFloat16};

at::Tensor full(at::IntArrayRef shape, double value, at::ScalarType dtype) {
  return at::full(shape, value, at::TensorOptions().dtype(dtype));
}

TEST(MpiProcessGroup, WorldMatchesTheLauncher) {
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) EXPECT_EQ(world().size(), std::atoi(size));
}

// The conformance suite (testing/conformance.h), with and without MPI's shared memory
// (CTest runs this file both ways).
TEST(MpiProcessGroup, PassesTheConformanceSuite) { testing::expect_conformance(world()); }

// On one machine an all_reduce goes through the shared-memory layer
// (src/process_group/shared_memory_group.h); without it, past 256 KiB, around the ring
// (src/process_group/mpi/ring.cc). CTest runs this file both ways (DATAPAR_MPI_SHM=0 for the ring). Sizes not divisible by the world size, the ring's
// segment or the shared memory's round, every reducible dtype and op, values that differ by
// position.
TEST(MpiProcessGroup, LargeAllReduces) {
  const int n = world().size(), rank = world().rank();
  for (const int64_t count : {int64_t{3 * 65536 + 7}, int64_t{2 * 524288 + 13}}) {  // float32: 0.75 and 4 MiB
    const at::Tensor position = at::arange(count, at::kLong).remainder(7);
    for (at::ScalarType dtype : kReducible) {
      at::Tensor t = (position + rank).to(dtype);
      world().all_reduce(t)->wait();
      EXPECT_TRUE(at::equal(t, (position * n + n * (n - 1) / 2).to(dtype))) << dtype << " at n=" << n << ", " << count;
    }
  }
  const int64_t count = 3 * 65536 + 7;
  const at::Tensor position = at::arange(count, at::kLong).remainder(7);
  const auto base = [&](int r) { return (position.remainder(3) + r + 1).to(at::kDouble); };  // 1 .. n + 2
  at::Tensor sum = base(0), product = base(0), low = base(0), high = base(0);
  for (int r = 1; r < n; ++r) {
    sum = sum + base(r), product = product * base(r);
    low = at::minimum(low, base(r)), high = at::maximum(high, base(r));
  }
  for (auto [op, expected] : {std::pair{ReduceOp::kSum, sum}, std::pair{ReduceOp::kAvg, sum / n},
                              std::pair{ReduceOp::kProduct, product}, std::pair{ReduceOp::kMin, low},
                              std::pair{ReduceOp::kMax, high}}) {
    at::Tensor t = base(rank);
    world().all_reduce(t, op)->wait();
    EXPECT_TRUE(at::allclose(t, expected)) << to_string(op) << " at n=" << n;
  }
  at::Tensor strided = at::zeros({count, 2}, at::kFloat);  // a non-contiguous column
  strided.select(1, 1).fill_(rank);
  world().all_reduce(strided.select(1, 1))->wait();
  EXPECT_EQ(strided.select(1, 1).sum().item<double>(), static_cast<double>(count) * n * (n - 1) / 2);
  EXPECT_EQ(strided.select(1, 0).abs().sum().item<double>(), 0.0);
}

// DDP relies on every rank holding the same parameters: the reduced floats must be the
// same bits everywhere, whatever the order of the additions.
TEST(MpiProcessGroup, LargeAllReducesGiveEveryRankTheSameBits) {
  const int rank = world().rank();
  at::Tensor t = at::randn({3 * 524288 + 5}, at::TensorOptions().dtype(at::kFloat)) * (rank + 1) + rank;
  world().all_reduce(t)->wait();
  at::Tensor from_rank_0 = t.clone();
  world().broadcast(from_rank_0, 0)->wait();
  EXPECT_TRUE(at::equal(t, from_rank_0)) << "rank " << rank << " differs from rank 0";
}

// This process's mappings of MPI groups' shared memory: lines of /proc/self/maps.
std::vector<std::string> shared_memory_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> mapped;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/datapar-shm-") != std::string::npos) mapped.push_back(line);
  }
  return mapped;
}

// One member that cannot (here: will not) share memory sends the whole group around the
// ring, on every member, and no region is left mapped anywhere.
TEST(MpiProcessGroup, OneMemberWithoutSharedMemoryMakesTheGroupUseTheRing) {
  const int n = world().size(), rank = world().rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  const size_t before = shared_memory_mappings().size();
  auto group = new_mpi_process_group({}, MpiOptions{60s, /*shared_memory=*/rank != n - 1});
  EXPECT_EQ(shared_memory_mappings().size(), before) << "rank " << rank;
  at::Tensor t = at::full({3 * 524288 + 5}, rank + 1.0, at::kFloat);
  group->all_reduce(t)->wait();
  EXPECT_TRUE(at::equal(t, at::full_like(t, n * (n + 1) / 2.0))) << "rank " << rank;
}

// The shared memory of every MPI group of processes on one machine is mapped, and its name
// is already gone from /dev/shm: nothing is left there whatever happens to the job.
TEST(MpiProcessGroup, SharedMemoryIsMappedAndHasNoNameLeft) {
  const int n = world().size();
  const bool wanted = options().shared_memory;
  const std::vector<std::string> mapped = shared_memory_mappings();
  for (const std::string& line : mapped) EXPECT_NE(line.find("(deleted)"), std::string::npos) << "still named: " << line;
  if (n > 1 && wanted) {
    EXPECT_GE(mapped.size(), 1u) << "the world group of " << n << " processes on one machine has no shared memory";
  } else {
    EXPECT_TRUE(mapped.empty()) << (n == 1 ? "a group of one process needs no shared memory" : "DATAPAR_MPI_SHM=0");
  }
}

TEST(MpiProcessGroup, NonContiguousTensors) {
  const int n = world().size(), rank = world().rank();
  at::Tensor base = full({4, 6}, rank + 1, at::kFloat);
  world().all_reduce(base.t())->wait();  // a transposed view
  EXPECT_TRUE(at::equal(base, full({4, 6}, n * (n + 1) / 2, at::kFloat)));
  at::Tensor column = at::zeros({5, 3}, at::kLong);
  if (rank == n - 1) column.select(1, 1).copy_(at::arange(5, at::kLong));
  world().broadcast(column.select(1, 1), n - 1)->wait();  // stride 3
  EXPECT_TRUE(at::equal(column.select(1, 1), at::arange(5, at::kLong)));
  EXPECT_EQ(column.sum().item<int64_t>(), 10);  // the other columns untouched
  std::vector<at::Tensor> gathered;
  for (int i = 0; i < n; ++i) gathered.push_back(at::zeros({3, 2}, at::kDouble).t());
  world().all_gather(gathered, full({3, 2}, rank, at::kDouble).t())->wait();
  for (int i = 0; i < n; ++i) EXPECT_TRUE(at::equal(gathered[i], full({2, 3}, i, at::kDouble)));
}

TEST(MpiProcessGroup, BroadcastMovesComplexNumbers) {
  const int n = world().size(), rank = world().rank();
  for (int root = 0; root < n; ++root) {
    at::Tensor t = rank == root ? at::arange(9).remainder(2).to(at::kComplexDouble) : at::zeros({9}, at::kComplexDouble);
    world().broadcast(t, root)->wait();
    EXPECT_TRUE(at::equal(t, at::arange(9).remainder(2).to(at::kComplexDouble))) << "from " << root;
  }
}

TEST(MpiProcessGroup, SendAndRecvAroundTheRingInBothDirections) {
  const int n = world().size(), rank = world().rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  for (int direction : {1, -1}) {
    const int to = direction > 0 ? next : previous, from = direction > 0 ? previous : next;
    // Everyone sends before receiving: 4 MiB, past any eager limit, so a blocking send
    // would deadlock here.
    at::Tensor out = at::arange(1 << 20, at::kFloat) + rank;
    at::Tensor in = at::zeros({1 << 20});
    auto sent = world().send(out, to, direction > 0 ? 1 : 2);
    auto received = world().recv(in, from, direction > 0 ? 1 : 2);
    received->wait(20s);
    sent->wait(20s);
    EXPECT_TRUE(at::equal(in, at::arange(1 << 20, at::kFloat) + from));
  }
  // Tags keep streams apart, each stream is in order, and a non-contiguous recv works.
  if (rank == 0) {
    world().send(full({3}, 1.0, at::kFloat), 1, 7)->wait();
    world().send(full({3}, 2.0, at::kFloat), 1, 7)->wait();
    world().send(full({3}, 9.0, at::kFloat), 1, 3)->wait();
  } else if (rank == 1) {
    at::Tensor a = at::zeros({3}), b = at::zeros({3}), c = at::zeros({3, 2}).select(1, 0);
    auto wc = world().recv(c, 0, 3);
    auto wa = world().recv(a, 0, 7);
    auto wb = world().recv(b, 0, 7);
    wa->wait(20s), wb->wait(20s), wc->wait(20s);
    EXPECT_EQ(a[0].item<float>(), 1.0f);
    EXPECT_EQ(b[0].item<float>(), 2.0f);
    EXPECT_TRUE(at::equal(c, full({3}, 9.0, at::kFloat)));
  }
  at::Tensor t = at::ones({4});  // collectives still pair up after point-to-point traffic
  world().all_reduce(t)->wait();
  EXPECT_EQ(t[0].item<float>(), n);
}

TEST(MpiProcessGroup, SeveralOperationsInFlight) {
  const int n = world().size(), rank = world().rank();
  std::vector<at::Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 5; ++i) {
    tensors.push_back(full({100000}, rank * 10 + i, at::kFloat));
    works.push_back(world().all_reduce(tensors.back()));
  }
  at::Tensor b = rank == 0 ? at::arange(6, at::kLong) : at::zeros({6}, at::kLong);
  works.push_back(world().broadcast(b, 0));
  works.push_back(world().barrier());
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait(30s);  // any order
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tensors[i][99999].item<float>(), 10 * n * (n - 1) / 2 + n * i);
  EXPECT_TRUE(at::equal(b, at::arange(6, at::kLong)));
  EXPECT_TRUE(works[0]->is_completed());
}

TEST(MpiProcessGroup, ArgumentErrorsAsGloo) {
  ProcessGroup& g = world();
  const int n = g.size(), rank = g.rank();
  const at::Tensor t = at::ones({3});
  EXPECT_THROW_MSG(g.all_gather({}, t), InvalidArgumentError, "0 outputs for " + std::to_string(n) + " processes");
  const at::Tensor uneven = n == 1 ? at::ones({}) : at::ones({n + 1});  // a 0-dim tensor has no dim 0
  EXPECT_THROW_MSG(g.all_to_all_single(uneven, uneven), InvalidArgumentError,
                   "split into " + std::to_string(n) + " equal chunks");
  EXPECT_THROW_MSG(g.reduce(t, n), InvalidArgumentError, "root " + std::to_string(n) + " is outside [0, ");
  EXPECT_THROW_MSG(g.all_reduce(at::ones({2}, at::kInt), ReduceOp::kAvg), InvalidArgumentError,
                   "avg needs a floating-point");
  EXPECT_THROW_MSG(g.all_reduce(at::ones({2}, at::kBool)), InvalidArgumentError, "not supported");
  EXPECT_THROW_MSG(g.all_reduce(at::Tensor()), InvalidArgumentError, "all_reduce: the tensor is undefined");
  EXPECT_THROW_MSG(g.send(t, n), InvalidArgumentError, "peer rank " + std::to_string(n) + " is outside");
  EXPECT_THROW_MSG(g.recv(t, rank), InvalidArgumentError, "is the peer itself");
  if (n > 1) {
    EXPECT_THROW_MSG(g.send(t, 1 - rank % 2, -1), InvalidArgumentError, "tag -1 must not be negative");
  }
  EXPECT_THROW_MSG(new_mpi_process_group({0, n}), InvalidArgumentError, "outside MPI_COMM_WORLD's [0, ");
  EXPECT_THROW_MSG(new_mpi_process_group({0, 0}), InvalidArgumentError, "listed twice");
}

TEST(MpiProcessGroup, WaitWithATimeoutAndARecvThatTimesOut) {
  const int n = world().size(), rank = world().rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  // The caller's own limit: the Work is still pending after it, and completes later.
  at::Tensor in = at::zeros({4});
  if (rank == 0) {
    auto pending = world().recv(in, 1, 5);
    EXPECT_THROW_MSG(pending->wait(10ms), TimeoutError, "recv(from 1, tag 5) on rank 0 of");
    world().send(at::ones({1}), 1, 6)->wait(20s);  // now rank 1 may send
    pending->wait(20s);
    EXPECT_EQ(in[3].item<float>(), 4.0f);
  } else if (rank == 1) {
    world().recv(at::zeros({1}), 0, 6)->wait(20s);
    world().send(full({4}, 4.0, at::kFloat), 0, 5)->wait(20s);
  }
  // The group's limit: a recv nobody answers fails by it, and the group stays usable.
  auto quick = new_mpi_process_group({}, options(1s));
  if (rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW_MSG(quick->recv(in, 1, 9)->wait(), TimeoutError, "recv(from 1, tag 9) on rank 0 of");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  }
  world().barrier()->wait(30s);
  at::Tensor t = at::ones({2});
  quick->all_reduce(t)->wait();
  EXPECT_EQ(t[0].item<float>(), n);
}

TEST(MpiProcessGroup, ACollectiveThatTimesOutBreaksOnlyItsGroup) {
  const int n = world().size(), rank = world().rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  auto quick = new_mpi_process_group({}, options(300ms));
  if (rank == 0) {
    EXPECT_THROW_MSG(quick->barrier()->wait(), TimeoutError, "barrier on rank 0 of");
    EXPECT_THROW_MSG(quick->all_reduce(at::ones({1}))->wait(), CommError, "unusable since an earlier collective");
  }
  world().barrier()->wait(30s);
  if (rank != 0) quick->barrier()->wait(30s);  // pairs with rank 0's abandoned barrier
  world().barrier()->wait(30s);
  // The same for a large all_reduce (shared memory, or the ring): rank 0 alone times out.
  auto ring = new_mpi_process_group({}, options(300ms));
  if (rank == 0) {
    EXPECT_THROW_MSG(ring->all_reduce(at::ones({1 << 20}))->wait(), TimeoutError, "all_reduce(sum) on rank 0 of");
    EXPECT_THROW_MSG(ring->barrier()->wait(), CommError, "unusable since an earlier collective");
  }
  world().barrier()->wait(30s);
}

// MPI cannot tell who is missing when a collective times out; the group's stall inspector
// can, also when the shared-memory layer handed the operation (here a reduce) to MPI.
TEST(MpiProcessGroup, ATimeoutNamesTheRanksThatDidNotIssueTheCollective) {
  const int n = world().size(), rank = world().rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  init_process_group("mpi");  // for the job's store
  auto quick = new_mpi_process_group({}, options(500ms));
  quick->inspect_stalls(std::make_shared<PrefixStore>("quick/stall", default_store()), 0ms);
  at::Tensor t = at::ones({3});
  if (rank == 0) {
    EXPECT_THROW_MSG(quick->reduce(t, 0)->wait(), TimeoutError, "rank(s) 1");
    EXPECT_THROW_MSG(quick->reduce(t, 0)->wait(), CommError, "unusable since an earlier collective");
  }
  // The others never pair with rank 0's abandoned reduce: it stays posted, and its
  // communicator is never freed (Communicator in src/process_group/mpi/process_group.cc).
  world().barrier()->wait(30s);
  destroy_process_group();
}

// A group made by the public factory with a store (MpiOptions::stall_store) warns on a
// stall, naming who is missing: the assembly every backend's factory calls adds the
// inspector (process_group/assembly.h). Before, only groups made through
// init_process_group had one.
TEST(MpiProcessGroup, AGroupGivenAStoreWarnsOnAStall) {
  const int n = world().size(), rank = world().rank();
  if (n == 1) GTEST_SKIP() << "needs a peer";
  init_process_group("mpi");  // for the job's store
  MpiOptions o = options();
  o.stall_store = std::make_shared<PrefixStore>("stall-test", default_store());
  o.stall_warning = 200ms;
  auto group = new_mpi_process_group({}, o);
  testing::CapturedWarnings warnings;
  at::Tensor t = at::ones({3});
  if (rank != 0) std::this_thread::sleep_for(2s);  // late: rank 0 waits, and is warned
  const std::shared_ptr<Work> work = group->all_reduce(t);
  if (rank == 0) {
    const std::vector<std::string> seen = warnings.wait_for(1, 10s);
    ASSERT_FALSE(seen.empty()) << "no stall warning";
    EXPECT_NE(seen[0].find("have not issued it yet"), std::string::npos) << seen[0];
    EXPECT_NE(seen[0].find("rank(s) 1 (at "), std::string::npos) << seen[0];
  }
  work->wait();
  EXPECT_EQ(t[0].item<float>(), static_cast<float>(n));
  world().barrier()->wait(30s);
  destroy_process_group();
}

TEST(MpiProcessGroup, SubgroupsByRankList) {
  const int n = world().size(), rank = world().rank();
  std::vector<int> reversed;
  for (int i = n - 1; i >= 0; i -= 2) reversed.push_back(i);  // the last rank, every second one down
  auto sub = new_mpi_process_group(reversed, options());
  const bool member = (n - 1 - rank) % 2 == 0;
  ASSERT_EQ(sub != nullptr, member);
  if (sub) {
    EXPECT_EQ(sub->rank(), (n - 1 - rank) / 2);
    EXPECT_EQ(sub->size(), static_cast<int>(reversed.size()));
    at::Tensor t = full({3}, rank, at::kLong);
    sub->all_reduce(t)->wait();
    int64_t sum = 0;
    for (int r : reversed) sum += r;
    EXPECT_EQ(t[0].item<int64_t>(), sum);
  }
}

TEST(MpiProcessGroup, InitProcessGroupTakesRankAndSizeFromMpi) {
  const int n = world().size(), rank = world().rank();
  EXPECT_THROW_MSG(init_process_group("mpi", "env://", rank, n + 1), InvalidArgumentError,
                   "says this process is rank " + std::to_string(rank) + " of " + std::to_string(n));
  EXPECT_THROW_MSG(init_process_group("mpi", "env://", (rank + 1) % (n + 1), -1), InvalidArgumentError,
                   "pass -1 (the default) for both");
  EXPECT_FALSE(is_initialized());
  init_process_group("mpi");  // env:// without MASTER_ADDR: MPI needs no init method
  EXPECT_EQ(get_rank(), rank);
  EXPECT_EQ(get_world_size(), n);
  EXPECT_EQ(default_group()->backend(), "mpi");
  at::Tensor t = full({4}, rank, at::kFloat);
  default_group()->all_reduce(t, ReduceOp::kAvg)->wait();
  EXPECT_EQ(t[0].item<float>(), (n - 1) / 2.0f);
  // The job's store, served by rank 0 and found through MPI (DDP's stall reports use it).
  default_store()->set("hello/" + std::to_string(rank), std::string("from ") + std::to_string(rank));
  EXPECT_EQ(default_store()->get_string("hello/" + std::to_string((rank + 1) % n)),
            "from " + std::to_string((rank + 1) % n));
  auto evens = new_group(n > 2 ? std::vector<int>{0, 2} : std::vector<int>{0});
  EXPECT_EQ(evens == nullptr, !(rank == 0 || (n > 2 && rank == 2)));
  if (evens) {
    at::Tensor e = full({2}, rank, at::kFloat);
    evens->all_reduce(e)->wait();
    EXPECT_EQ(e[0].item<float>(), n > 2 ? 2.0f : 0.0f);
  }
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
}

// DDP on the mpi default group (its stall reports go through the job's store): the
// gradient of sum(W x + b) over 2 rows of x = rank + 1 is 2 (rank + 1) per weight, so the
// average over ranks is n + 1; the bias gets 2 everywhere.
TEST(MpiProcessGroup, DistributedDataParallelAveragesTheGradients) {
  const int n = world().size(), rank = world().rank();
  init_process_group("mpi");
  auto model = torch::nn::Linear(4, 3);
  DistributedDataParallel ddp(model);
  ddp.forward(at::full({2, 4}, rank + 1.0)).sum().backward();
  EXPECT_TRUE(at::allclose(model->weight.grad(), at::full({3, 4}, n + 1.0)));
  EXPECT_TRUE(at::allclose(model->bias.grad(), at::full({3}, 2.0)));
  destroy_process_group();
}

// Run alone by the mpi_peer_death CTest test: rank 1 dies in the middle of the job, and
// mpirun must end the whole job instead of leaving rank 0 waiting (60 s timeout).
TEST(MpiProcessGroup, DISABLED_AKilledPeerEndsTheJob) {
  at::Tensor t = at::ones({16});
  world().all_reduce(t)->wait();
  if (world().rank() == 1) ::raise(SIGKILL);
  try {
    world().all_reduce(t)->wait();
    std::printf("rank %d: all_reduce returned without its peer\n", world().rank());
  } catch (const Error& e) {
    std::printf("rank %d: %s\n", world().rank(), e.what());
  }
  std::fflush(stdout);
}

// Prints a failed assertion with the rank, for ranks whose report is silenced.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace datapar

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = datapar::world().rank();  // initialises MPI
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new datapar::RankFailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
