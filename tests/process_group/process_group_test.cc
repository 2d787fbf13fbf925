// What ProcessGroup's public operations do for every backend before and around the
// backend's own part: argument checks, operation names, one error translation, one
// timeout. A backend made for the test records what reaches it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/sync_batch_norm.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/error.h"
#include "datapar/process_group/process_group.h"
#include "process_group/work_completion.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Completes every operation at once and remembers its name; `throw_engine_error` makes it
// fail as a transport library would, with its own exception type.
class RecordingGroup : public ProcessGroup {
 public:
  RecordingGroup(int rank, int size, std::chrono::milliseconds timeout = kDefaultTimeout)
      : ProcessGroup(rank, size, timeout) {}
  std::string backend() const override { return "recording"; }

  std::vector<std::string> reached;
  std::vector<size_t> list_sizes;  // gather's outputs, scatter's inputs, as they arrived
  bool throw_engine_error = false;
  bool stall = false;  // hand out Works that never complete: a peer that never answers

 protected:
  std::shared_ptr<Work> done(const std::string& what) {
    reached.push_back(what);
    if (throw_engine_error) throw std::runtime_error("Connection reset by peer");
    auto work = std::make_shared<Work>(describe(what));
    if (!stall) detail::WorkCompletion::finish(*work);
    return work;
  }
  std::shared_ptr<Work> do_all_reduce(const std::string& what, at::Tensor, ReduceOp) override { return done(what); }
  std::shared_ptr<Work> do_broadcast(const std::string& what, at::Tensor, int) override { return done(what); }
  std::shared_ptr<Work> do_reduce(const std::string& what, at::Tensor, int, ReduceOp) override { return done(what); }
  std::shared_ptr<Work> do_all_gather(const std::string& what, std::vector<at::Tensor>, at::Tensor) override {
    return done(what);
  }
  std::shared_ptr<Work> do_gather(const std::string& what, std::vector<at::Tensor> outputs, at::Tensor,
                                  int) override {
    list_sizes.push_back(outputs.size());
    return done(what);
  }
  std::shared_ptr<Work> do_scatter(const std::string& what, at::Tensor, std::vector<at::Tensor> inputs,
                                   int) override {
    list_sizes.push_back(inputs.size());
    return done(what);
  }
  std::shared_ptr<Work> do_reduce_scatter(const std::string& what, at::Tensor, std::vector<at::Tensor>,
                                          ReduceOp) override {
    return done(what);
  }
  std::shared_ptr<Work> do_all_to_all_single(const std::string& what, at::Tensor, at::Tensor) override {
    return done(what);
  }
  std::shared_ptr<Work> do_barrier(const std::string& what) override { return done(what); }
  std::shared_ptr<Work> do_all_reduce_coalesced(const std::string& what, std::vector<at::Tensor>, ReduceOp) override {
    return done(what);
  }
  std::shared_ptr<Work> do_broadcast_coalesced(const std::string& what, std::vector<at::Tensor>, int) override {
    return done(what);
  }
  std::shared_ptr<Work> do_send(const std::string& what, at::Tensor, int, int) override { return done(what); }
  std::shared_ptr<Work> do_recv(const std::string& what, at::Tensor, int, int) override { return done(what); }
};

TEST(ProcessGroup, BadCallsNeverReachTheBackend) {
  RecordingGroup group(1, 3);
  const at::Tensor t = at::ones({6});
  const std::vector<at::Tensor> three{t, t, t};
  EXPECT_THROW_MSG(group.all_reduce(at::Tensor()), InvalidArgumentError, "all_reduce: the tensor is undefined");
  EXPECT_THROW_MSG(group.all_reduce(at::ones({2}, at::kInt), ReduceOp::kAvg), InvalidArgumentError,
                   "all_reduce: avg needs a floating-point tensor, not Int");
  EXPECT_THROW_MSG(group.all_reduce(t.to_sparse()), InvalidArgumentError, "takes dense tensors");
  EXPECT_THROW_MSG(group.broadcast(t, 3), InvalidArgumentError, "broadcast: root 3 is outside [0, 3)");
  EXPECT_THROW_MSG(group.reduce(t, -1), InvalidArgumentError, "reduce: root -1 is outside [0, 3)");
  EXPECT_THROW_MSG(group.all_gather({t, t}, t), InvalidArgumentError, "all_gather: 2 outputs for 3 processes");
  EXPECT_THROW_MSG(group.all_gather({t, t, at::ones({5})}, t), InvalidArgumentError,
                   "outputs[2] must be a CPU tensor of shape [6] and type Float, not cpu [5] Float");
  EXPECT_THROW_MSG(group.reduce_scatter(at::ones({6}, at::kDouble), three), InvalidArgumentError,
                   "inputs[0] must be a CPU tensor of shape [6] and type Double");
  EXPECT_THROW_MSG(group.all_to_all_single(at::ones({6}), at::ones({7})), InvalidArgumentError, "must match input");
  EXPECT_THROW_MSG(group.all_to_all_single(at::ones({4}), at::ones({4})), InvalidArgumentError,
                   "split into 3 equal chunks");
  EXPECT_THROW_MSG(group.gather({t}, t, 1), InvalidArgumentError, "1 outputs on the root for 3 processes");
  EXPECT_THROW_MSG(group.scatter(t, {}, 1), InvalidArgumentError, "0 inputs on the root for 3 processes");
  EXPECT_THROW_MSG(group.all_reduce_coalesced({t, at::ones({1}, at::kLong)}, ReduceOp::kAvg), InvalidArgumentError,
                   "avg needs floating-point tensors");
  EXPECT_THROW_MSG(group.broadcast_coalesced({t}, 7), InvalidArgumentError, "root 7 is outside");
  EXPECT_THROW_MSG(group.send(t, 1), InvalidArgumentError, "rank 1 is the peer itself");
  EXPECT_THROW_MSG(group.recv(t, 3), InvalidArgumentError, "peer rank 3 is outside [0, 3)");
  EXPECT_THROW_MSG(group.send(t, 0, -2), InvalidArgumentError, "tag -2 must not be negative");
  EXPECT_TRUE(group.reached.empty());
}

TEST(ProcessGroup, NamesEachOperationForTheBackend) {
  RecordingGroup group(0, 2);
  const at::Tensor t = at::ones({4});
  group.all_reduce(t, ReduceOp::kMax)->wait();
  group.reduce(t, 1, ReduceOp::kAvg)->wait();
  group.broadcast_coalesced({t, t, t}, 1)->wait();
  group.all_to_all_single(t, t)->wait();
  group.recv(t, 1, 5)->wait();
  EXPECT_EQ(group.reached, (std::vector<std::string>{"all_reduce(max)", "reduce(avg, root 1)",
                                                     "broadcast_coalesced(root 1, 3 tensors)", "all_to_all_single",
                                                     "recv(from 1, tag 5)"}));
}

TEST(ProcessGroup, ListsOffTheRootAreIgnored) {
  RecordingGroup group(0, 2);
  const at::Tensor t = at::ones({4});
  group.gather({at::Tensor(), t.to(at::kInt)}, t, 1)->wait();  // not the root: not checked, not passed on
  group.scatter(t, {t}, 1)->wait();
  group.gather({t, t}, t, 0)->wait();
  EXPECT_EQ(group.list_sizes, (std::vector<size_t>{0, 0, 2}));
}

TEST(ProcessGroup, AnEngineErrorBecomesACommErrorNamingTheOperation) {
  RecordingGroup group(1, 2);
  group.throw_engine_error = true;
  EXPECT_THROW_MSG(group.all_reduce(at::ones({2})), CommError,
                   "all_reduce(sum) on rank 1 of 2 (recording) failed: Connection reset by peer");
  EXPECT_THROW_MSG(group.barrier(), CommError, "barrier on rank 1 of 2 (recording) failed");
}

// A Work whose results still have to reach a device (gloo's staged CUDA tensors): every
// wait() and synchronize() that finds it done hands the waiter the results (deliver), and one
// that finds it failed throws instead.
class DeliveringWork : public Work {
 public:
  using Work::Work;
  int delivered = 0;

 protected:
  void deliver() override { ++delivered; }
};

TEST(Work, WaitAndSynchronizeDeliverOnlyWhatSucceeded) {
  auto ok = std::make_shared<DeliveringWork>("all_reduce(sum)");
  EXPECT_THROW_MSG(ok->wait(std::chrono::milliseconds(10)), TimeoutError, "all_reduce(sum): not finished");
  EXPECT_EQ(ok->delivered, 0);
  detail::WorkCompletion::finish(*ok);
  ok->wait();
  ok->synchronize();
  EXPECT_EQ(ok->delivered, 2);

  auto failed = std::make_shared<DeliveringWork>("broadcast(root 0)");
  detail::WorkCompletion::fail(*failed, std::make_exception_ptr(std::runtime_error("Connection reset by peer")));
  EXPECT_THROW_MSG(failed->wait(), CommError, "broadcast(root 0) failed: Connection reset by peer");
  EXPECT_THROW(failed->synchronize(), CommError);
  EXPECT_EQ(failed->delivered, 0);
}

// Host groups refuse CUDA tensors unless they say they take them (takes_cuda_tensors: gloo's
// staging in CUDA builds); lists must be on the device of the tensor they go with.
TEST(ProcessGroup, ACpuGroupNamesTheDeviceOfAListThatStrays) {
  RecordingGroup group(0, 2);
  EXPECT_FALSE(group.takes_cuda_tensors());
  EXPECT_THROW_MSG(group.all_gather({at::ones({2}), at::ones({2}).to(at::kDouble)}, at::ones({2})),
                   InvalidArgumentError, "outputs[1] must be a CPU tensor of shape [2] and type Float");
}

TEST(ProcessGroup, RankAndSizeAreChecked) {
  EXPECT_THROW_MSG(RecordingGroup(2, 2), InvalidArgumentError, "rank 2 is outside [0, 2)");
  EXPECT_THROW_MSG(RecordingGroup(0, 0), InvalidArgumentError, "size 0 must be at least 1");
  EXPECT_THROW_MSG(RecordingGroup(0, 1, 0ms), InvalidArgumentError, "the timeout must be positive");
}

// What `body` threw within 30 s ("" for nothing); "hung" if it was still running then (its
// thread is left behind: the test has failed anyway).
template <typename Body>
std::string error_within_30s(Body body) {
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  std::thread([done, body]() mutable {
    try {
      body();
      done->set_value("");
    } catch (const std::exception& e) {
      done->set_value(e.what());
    }
  }).detach();
  return result.wait_for(30s) == std::future_status::ready ? result.get() : "hung";
}

// Issue 28: one timeout, owned by the group. Over a group made with a 300 ms timeout whose
// peer never answers (and whose backend, unlike the real ones, never fails the operation
// itself), DDP (at its model check), SyncBatchNorm and ZeRO fail within it plus
// kWaitGrace, as does a plain wait(). DDP waited its own 5 minutes before, whatever the
// group said, and SyncBatchNorm and ZeRO a year (Work::wait()'s default then).
TEST(ProcessGroup, EverythingBuiltOnAGroupWaitsWithinItsTimeout) {
  auto group = std::make_shared<RecordingGroup>(0, 2, 300ms);
  group->stall = true;
  EXPECT_EQ(group->timeout(), 300ms);
  const std::string not_finished = "not finished after 0.6 s";  // the timeout and as much grace
  EXPECT_NE(error_within_30s([&] { group->barrier()->wait(); }).find(not_finished), std::string::npos);
  EXPECT_NE(error_within_30s([&] { group->barrier()->synchronize(); }).find(not_finished), std::string::npos);
  EXPECT_NE(error_within_30s([&] {
              torch::nn::Linear model(3, 2);
              DistributedDataParallel ddp(model.ptr(), group);
            }).find(not_finished),
            std::string::npos);
  EXPECT_NE(error_within_30s([&] {
              SyncBatchNorm norm(SyncBatchNormOptions(4));
              norm->set_process_group(group);
              norm->train();
              norm->forward(at::randn({8, 4}));
            }).find(not_finished),
            std::string::npos);
  EXPECT_NE(error_within_30s([&] {
              torch::nn::Linear model(3, 2);
              ZeroRedundancyOptimizer zero(model->parameters(), [](std::vector<at::Tensor> shard) {
                return std::make_unique<torch::optim::SGD>(shard, torch::optim::SGDOptions(0.1));
              }, group);
              for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
              zero.step();
            }).find(not_finished),
            std::string::npos);
}

}  // namespace
}  // namespace datapar
