// nccl_probe's scenarios with groups of their own: world1 (issue 25), what NCCL's CUDA paths
// do, shown on ONE GPU (each check returns "" or what failed); two_groups (issue 26).
// Compiled only where datapar has the nccl backend.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/rank_balancer.h"
#include "datapar/parallel/data_parallel.h"
#include "datapar/error.h"
#include "datapar/process_group/nccl.h"
#include "datapar/rendezvous/file_store.h"
#include "testing/captured_warnings.h"
#include "gpu/nccl_groups.h"

namespace datapar::testing {
namespace {

using namespace std::chrono_literals;

bool same(const at::Tensor& got, const at::Tensor& want) {
  return at::equal(got.cpu().to(at::kDouble), want.cpu().to(at::kDouble));
}

// Every collective on every dtype NCCL takes: with one rank each is the identity (or a copy),
// so the values must come back exactly.
std::string every_collective_and_dtype(ProcessGroup& group, const at::Device& gpu) {
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kLong}) {
    const std::string name = c10::toString(dtype);
    const at::TensorOptions on_gpu = at::TensorOptions(gpu).dtype(dtype);
    const at::Tensor values = at::arange(0, 24, at::TensorOptions(gpu).dtype(at::kLong)).remainder(100).to(dtype);
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
      at::Tensor t = values.clone();
      group.all_reduce(t, op)->wait();
      if (!same(t, values)) return "all_reduce(" + std::string(to_string(op)) + ") of " + name;
    }
    at::Tensor t = values.clone();
    group.broadcast(t, 0)->wait();
    if (!same(t, values)) return "broadcast of " + name;
    t = values.clone();
    group.reduce(t, 0)->wait();
    if (!same(t, values)) return "reduce of " + name;
    std::vector<at::Tensor> gathered{at::zeros({24}, on_gpu)};
    group.all_gather(gathered, values)->wait();
    if (!same(gathered[0], values)) return "all_gather of " + name;
    at::Tensor out = at::zeros({24}, on_gpu);
    group.reduce_scatter(out, {values}, ReduceOp::kSum)->wait();
    if (!same(out, values)) return "reduce_scatter of " + name;
    out = at::zeros({24}, on_gpu);
    group.all_to_all_single(out, values)->wait();
    if (!same(out, values)) return "all_to_all_single of " + name;
    std::vector<at::Tensor> several{values.clone(), values.narrow(0, 0, 5).clone()};
    group.all_reduce_coalesced(several)->wait();
    if (!same(several[0], values) || !same(several[1], values.narrow(0, 0, 5))) return "all_reduce_coalesced of " + name;
    group.broadcast_coalesced(several, 0)->wait();
    if (!same(several[0], values)) return "broadcast_coalesced of " + name;
  }
  group.barrier()->wait();
  return "";
}

// A non-contiguous tensor (a transposed view) gets its result through a contiguous copy, back
// into the view's own elements; the rest of its storage is untouched.
std::string non_contiguous(ProcessGroup& group, const at::Device& gpu) {
  const at::Tensor whole = at::arange(0, 40, at::TensorOptions(gpu).dtype(at::kFloat)).view({4, 10});
  at::Tensor view = whole.narrow(1, 0, 5).t();  // (5, 4), strides (1, 10)
  const at::Tensor before = whole.clone();
  group.all_reduce(view, ReduceOp::kAvg)->wait();
  if (view.is_contiguous()) return "the view became contiguous";
  if (!same(whole, before)) return "all_reduce of a transposed view changed its values or its storage's others";
  std::vector<at::Tensor> outputs{at::zeros({10, 4}, at::TensorOptions(gpu)).t()};  // (4, 10), non-contiguous
  group.all_gather(outputs, whole)->wait();
  if (!same(outputs[0], whole)) return "all_gather into a non-contiguous output";
  return "";
}

// The caller on a stream of its own, busy for a while: the collective runs after what that
// stream queued before it (it reads 5, not the 1 the tensor held when the call returned on
// the host), and work queued there after wait() sees its result.
std::string callers_stream(ProcessGroup& group, const at::Device& gpu) {
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, gpu.index());
  const c10::cuda::CUDAStreamGuard on_side(side);
  at::Tensor t = at::ones({1 << 20}, at::TensorOptions(gpu));
  at::cuda::sleep(200'000'000);  // about 0.1 s of the GPU on this stream
  t.fill_(5);
  std::vector<at::Tensor> gathered{at::zeros({1 << 20}, at::TensorOptions(gpu))};
  group.all_gather(gathered, t)->wait();
  const at::Tensor doubled = gathered[0] * 2;  // on the side stream, after wait()
  if (!same(doubled, at::full({1 << 20}, 10.0))) return "all_gather on the caller's stream did not see its input";
  return "";
}

// Issue 26: a DDP step never waits for the GPU (Note [No host sync in a step] in reducer.cc).
// Averaging by samples, inside join(), on the default group: forward and backward return to
// the host while a kernel of about a second, queued before them, still runs.
std::string ddp_step_leaves_the_gpu_working(const at::Device& gpu) {
  torch::manual_seed(0);
  torch::nn::Linear model(64, 8);
  model->to(gpu);
  DdpOptions options;
  options.average_by_samples = true;
  DistributedDataParallel<torch::nn::LinearImpl> ddp(model, nullptr, options);
  const at::Tensor x = at::randn({32, 64}, at::TensorOptions(gpu));
  const at::Tensor y = at::zeros({32}, at::TensorOptions(gpu).dtype(at::kLong));
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(gpu.index());
  std::string problem;
  ddp.join([&] {
    for (int step = 0; step < 5; ++step) {
      if (step == 4) {
        stream.synchronize();  // warm caches (device and page-locked memory) all free
        at::cuda::sleep(2'000'000'000);
      }
      const auto start = std::chrono::steady_clock::now();
      at::cross_entropy_loss(ddp.forward(x), y).backward();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step == 4 && stream.query()) problem = "the GPU was idle when backward returned: the step waited for it";
      if (step == 4 && problem.empty() && seconds > 0.5) {
        problem = "forward and backward took " + std::to_string(seconds) + " s behind a long kernel";
      }
    }
  });
  stream.synchronize();
  return problem;
}

// A communication hook whose all_reduce starts only after about 0.2 s of GPU work on a
// stream of its own (a slow link, or a slow peer): backward's stream waits for it at the
// end of backward, the host does not.
class SlowCommunication final : public CommHook {
 public:
  std::shared_ptr<Work> run(ProcessGroup& group, GradBucket& bucket) override {
    const c10::DeviceIndex device = bucket.buffer.device().index();
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
    at::cuda::CUDAEvent gradients_ready;
    gradients_ready.record(c10::cuda::getCurrentCUDAStream(device));
    gradients_ready.block(side);
    const c10::cuda::CUDAStreamGuard on_side(side);
    at::cuda::sleep(400'000'000);
    return group.all_reduce(bucket.buffer);  // on nccl: behind what the side stream queued
  }
};

// Issue 26: DDP's exposed wait on a GPU is the time the model's stream waited for the
// buckets, from CUDA events; a host clock reads about 0 on nccl, whose wait() returns at once.
std::string exposed_wait_is_timed_on_the_gpu(const at::Device& gpu) {
  torch::manual_seed(0);
  torch::nn::Linear model(64, 8);
  model->to(gpu);
  DistributedDataParallel<torch::nn::LinearImpl> ddp(model);
  ddp.register_comm_hook(std::make_shared<SlowCommunication>());
  const at::Tensor x = at::randn({32, 64}, at::TensorOptions(gpu));
  const at::Tensor y = at::zeros({32}, at::TensorOptions(gpu).dtype(at::kLong));
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) at::cross_entropy_loss(ddp.forward(x), y).backward();
  const CommunicationStats stats = ddp.communication_stats();
  const double per_pass = std::chrono::duration<double>(stats.exposed_wait).count() / kSteps;
  std::cout << "        exposed wait per pass " << per_pass * 1e3 << " ms behind about 200 ms of slow communication\n";
  if (stats.synchronised_passes != kSteps) return "synchronised passes " + std::to_string(stats.synchronised_passes);
  if (per_pass < 0.1) return "exposed wait " + std::to_string(per_pass) + " s per pass: the stream's wait was not timed";
  return "";
}

// Inputs dropped right after the call: their memory goes back to the caching allocator at
// once, but must not be handed out (and overwritten) before the group's stream read it
// (recordStream). Each all_gather must deliver the value its dropped input had.
std::string inputs_freed_after_launch(ProcessGroup& group, const at::Device& gpu) {
  std::vector<at::Tensor> outputs;
  std::vector<std::shared_ptr<Work>> works;
  at::cuda::sleep(100'000'000);  // the group's stream starts late: the inputs are gone by then
  for (int i = 0; i < 16; ++i) {
    outputs.push_back(at::zeros({1 << 18}, at::TensorOptions(gpu)));
    {
      const at::Tensor input = at::full({1 << 18}, double(i), at::TensorOptions(gpu));
      works.push_back(group.all_gather({outputs.back()}, input));
    }
    at::full({1 << 18}, -1.0, at::TensorOptions(gpu));  // would take the input's block
  }
  for (auto& w : works) w->wait();
  for (int i = 0; i < 16; ++i) {
    if (!same(outputs[i], at::full({1 << 18}, double(i)))) return "all_gather " + std::to_string(i) + " read a reused input";
  }
  return "";
}

// A group of its own on a fresh store namespace, rank 0 of 1.
std::shared_ptr<ProcessGroup> own_group(const std::string& dir, const std::string& name, NcclOptions options) {
  options.device = 0;
  return new_nccl_process_group(std::make_shared<FileStore>(dir + "/" + name), 0, 1, options);
}

// blocking_wait: wait() returns when the GPU has run the operation; synchronize() does on
// any group; and the default wait() returns before the GPU has (the host goes on).
std::string waits(ProcessGroup& group, const std::string& dir, const at::Device& gpu) {
  NcclOptions blocking;
  blocking.blocking_wait = true;
  const auto blocking_group = own_group(dir, "blocking", blocking);
  at::Tensor t = at::ones({1 << 20}, at::TensorOptions(gpu));
  at::cuda::sleep(200'000'000);
  auto work = blocking_group->all_reduce(t);
  work->wait();
  if (!work->is_completed()) return "blocking_wait: wait() returned before the operation completed";

  at::cuda::sleep(200'000'000);
  work = group.all_reduce(t);
  work->wait();
  const bool returned_early = !work->is_completed();
  work->synchronize();
  if (!work->is_completed()) return "synchronize() returned before the operation completed";
  if (!returned_early) return "the default wait() blocked the host until the GPU finished";
  return "";
}

// Destroying a group with operations still queued behind a busy stream returns (it waits
// for them, then finalizes) without a hang or a CUDA error.
std::string destroy_in_flight(const std::string& dir, const at::Device& gpu) {
  auto group = own_group(dir, "in-flight", {});
  at::Tensor t = at::ones({1 << 22}, at::TensorOptions(gpu));
  at::cuda::sleep(200'000'000);
  for (int i = 0; i < 8; ++i) group->all_reduce(t);
  const auto start = std::chrono::steady_clock::now();
  group.reset();
  if (std::chrono::steady_clock::now() - start > 60s) return "destroying a group with work in flight took over 60 s";
  if (!same(t, at::ones({1 << 22}))) return "the in-flight all_reduces of one rank changed the values";
  return "";
}

// An operation past the group's timeout aborts the group (TimeoutError or CommError, and
// CommError for every later call); a group made afresh afterwards works.
std::string abort_and_again(const std::string& dir, const at::Device& gpu) {
  NcclOptions quick;
  quick.timeout = 5s;
  auto group = own_group(dir, "aborted", quick);
  at::Tensor t = at::ones({16}, at::TensorOptions(gpu));
  at::cuda::sleep(20'000'000'000LL);  // about 10 s of the GPU: past the timeout
  const auto late = group->all_reduce(t);
  bool failed = false;
  for (int i = 0; i < 100 && !failed; ++i) {  // bounded: 20 s and the barriers' timeouts
    std::this_thread::sleep_for(200ms);
    try {
      group->barrier()->wait();
    } catch (const CommError&) {
      failed = true;
    } catch (const TimeoutError&) {
      failed = true;
    }
  }
  if (!failed) return "an operation past the timeout did not abort the group";
  try {
    group->all_reduce(t)->wait();
    return "a call on an aborted group did not throw";
  } catch (const CommError&) {
  }
  c10::cuda::getCurrentCUDAStream(gpu.index()).synchronize();  // the sleep is over
  auto again = own_group(dir, "again", {});
  at::Tensor u = at::full({16}, 3.0, at::TensorOptions(gpu));
  again->all_reduce(u)->wait();
  if (!same(u, at::full({16}, 3.0))) return "a group made after an abort gave a wrong all_reduce";
  return "";
}

// ProcessGroup::abort() (issue 31: how a fault-tolerant job abandons a group): the
// operation in flight fails at once, not at the group's timeout, and later calls throw.
std::string user_abort(const std::string& dir, const at::Device& gpu) {
  NcclOptions patient;
  patient.timeout = 60s;
  auto group = own_group(dir, "user-aborted", patient);
  at::Tensor t = at::ones({16}, at::TensorOptions(gpu));
  at::cuda::sleep(4'000'000'000LL);  // about 2 s of the GPU: the all_reduce waits behind it
  const auto work = group->all_reduce(t);
  const auto aborted_at = std::chrono::steady_clock::now();
  group->abort();
  try {
    work->synchronize();
    return "the operation in flight completed after abort()";
  } catch (const CommError&) {
  }
  if (std::chrono::steady_clock::now() - aborted_at > 20s) return "the operation in flight failed late";
  try {
    group->barrier();
    return "a call after abort() did not throw";
  } catch (const CommError& e) {
    if (std::string(e.what()).find("the group was aborted") == std::string::npos) {
      return std::string("a call after abort() threw an unclear error: ") + e.what();
    }
  }
  c10::cuda::getCurrentCUDAStream(gpu.index()).synchronize();  // the sleep is over
  return "";
}

}  // namespace

int failure_after_wait(const std::string& dir, bool end_process) {
  const at::Device gpu(at::kCUDA, 0);
  NcclOptions quick;
  quick.timeout = 1s;
  quick.end_process_on_failure = end_process;
  auto group = own_group(dir, end_process ? "ends" : "handled", quick);
  at::Tensor t = at::ones({16}, at::TensorOptions(gpu));
  at::cuda::sleep(10'000'000'000LL);  // about 5 s of the GPU: the all_reduce starts past its timeout
  const auto work = group->all_reduce(t);
  work->wait();
  t.mul_(2);  // queued behind the all_reduce: it would see partial results
  std::cout << "wait() returned; the watchdog finds the timeout in about 1 s" << std::endl;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (!work->is_completed() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  if (end_process) {
    std::cerr << "FAILED: the process did not end after a failure behind a returned wait()\n";
    return 1;
  }
  std::string problem;
  try {
    work->synchronize();
    problem = "synchronize() of the timed-out all_reduce did not throw";
  } catch (const TimeoutError&) {
  } catch (const CommError&) {
  }
  try {
    group->all_reduce(t);
    if (problem.empty()) problem = "a call on the aborted group did not throw";
  } catch (const CommError&) {
  }
  c10::cuda::getCurrentCUDAStream(gpu.index()).synchronize();  // the sleep is over
  std::cout << (problem.empty() ? "ok      the failure surfaced in the program" : "FAILED  " + problem) << "\n";
  return problem.empty() ? 0 : 1;
}

int balance_slowed_rank(ProcessGroup& group) {
  const int rank = group.rank();
  const at::Device gpu(at::kCUDA, rank);
  torch::manual_seed(0);
  torch::nn::Linear model(256, 10);
  model->to(gpu);
  DistributedDataParallel<torch::nn::LinearImpl> ddp(model);
  RankBalancer balancer;
  const at::Tensor x = at::randn({64, 256}, at::TensorOptions(gpu));
  const at::Tensor y = at::zeros({64}, at::TensorOptions(gpu).dtype(at::kLong));
  for (int step = 0; step < 24; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const auto waited_before = ddp.communication_stats().exposed_wait;
    if (rank == 1) at::cuda::sleep(100'000'000);  // about 50 ms of compute
    at::cross_entropy_loss(ddp.forward(x), y).backward();
    const double waited = std::chrono::duration<double>(ddp.communication_stats().exposed_wait - waited_before).count();
    const double busy = detail::seconds_until_done(start, Device::cuda(rank)) - waited;
    balancer.step(x.size(0), std::max(0.0, busy));
  }
  const std::vector<double>& w = balancer.weights();
  std::cout << "rank " << rank << ": shares";
  for (double share : w) std::cout << " " << share;
  std::cout << "\n";
  for (int r = 0; r < group.size(); ++r) {
    if (r != 1 && !(w[1] < 0.7 * w[r])) {
      std::cerr << "rank " << rank << ": the slowed rank 1 got " << w[1] << ", not less than rank " << r << "'s " << w[r]
                << ": a rank waiting for it was measured as slow\n";
      return 1;
    }
  }
  return 0;
}

int world_one(ProcessGroup& group, const std::string& dir) {
  if (group.size() != 1) {
    std::cerr << "nccl_probe: world1 runs with WORLD_SIZE 1\n";
    return 1;
  }
  const at::Device gpu(at::kCUDA, 0);
  const std::vector<std::pair<std::string, std::function<std::string()>>> checks{
      {"a DDP step leaves the GPU working", [&] { return ddp_step_leaves_the_gpu_working(gpu); }},
      {"DDP's exposed wait timed on the GPU", [&] { return exposed_wait_is_timed_on_the_gpu(gpu); }},
      {"every collective and dtype", [&] { return every_collective_and_dtype(group, gpu); }},
      {"non-contiguous tensors", [&] { return non_contiguous(group, gpu); }},
      {"the caller's stream", [&] { return callers_stream(group, gpu); }},
      {"inputs freed after launch", [&] { return inputs_freed_after_launch(group, gpu); }},
      {"wait, blocking_wait, synchronize", [&] { return waits(group, dir, gpu); }},
      {"destroying a group with work in flight", [&] { return destroy_in_flight(dir, gpu); }},
      {"abort, then a new group", [&] { return abort_and_again(dir, gpu); }},
      {"ProcessGroup::abort() with work in flight", [&] { return user_abort(dir, gpu); }},
  };
  int failed = 0;
  for (const auto& [name, check] : checks) {
    std::string problem;
    try {
      problem = check();
    } catch (const std::exception& e) {
      problem = std::string("threw: ") + e.what();
    }
    std::cout << (problem.empty() ? "ok      " : "FAILED  ") << name << (problem.empty() ? "" : ": " + problem) << "\n";
    failed += !problem.empty();
  }
  return failed == 0 ? 0 : 1;
}

int two_groups(int rank, int world, const std::string& dir) {
  auto store = std::make_shared<FileStore>(dir + "/two-groups");
  NcclOptions options;
  options.device = rank;
  for (int made = 0; made < 2; ++made) {
    // Rank 0 is slow to make the second group: a rank that read the first group's id and
    // check-ins would start an NCCL init nobody else joins, and time out.
    if (made == 1 && rank == 0) std::this_thread::sleep_for(2s);
    options.timeout = 60s;
    const auto group = new_nccl_process_group(store, rank, world, options);
    at::Tensor t = at::full({8}, double(rank + 1 + made), at::TensorOptions(at::Device(at::kCUDA, rank)));
    group->all_reduce(t)->wait();
    const double want = world * (world + 1) / 2.0 + world * made;
    if (!same(t, at::full({8}, want))) {
      std::cerr << "nccl_probe: group " << made << " on rank " << rank << " summed to " << t[0].item<double>()
                << ", not " << want << "\n";
      return 1;
    }
  }
  return 0;
}

int stall_warning(int rank, int world, const std::string& dir) {
  auto store = std::make_shared<FileStore>(dir + "/stall");
  NcclOptions options;
  options.device = rank;
  options.timeout = 60s;
  options.stall_warning = 200ms;
  const auto group = new_nccl_process_group(store, rank, world, options);
  CapturedWarnings warnings;
  at::Tensor t = at::ones({8}, at::TensorOptions(at::Device(at::kCUDA, rank)));
  if (rank != 0) std::this_thread::sleep_for(2s);  // late: rank 0 waits, and is warned
  const std::shared_ptr<Work> work = group->all_reduce(t);
  if (rank == 0) {
    const std::vector<std::string> seen = warnings.wait_for(1, 10s);
    if (seen.empty() || seen[0].find("rank(s) 1 (at ") == std::string::npos) {
      std::cerr << "nccl_probe: rank 0 was not warned that rank 1 had not issued the all_reduce"
                << (seen.empty() ? std::string() : ": " + seen[0]) << "\n";
      return 1;
    }
  }
  work->synchronize();
  return same(t, at::full({8}, double(world))) ? 0 : 1;
}

}  // namespace datapar::testing
