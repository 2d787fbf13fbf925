// A rank of an NCCL test job (tests/gpu/gpu_test.cc), on cuda:RANK:
//   nccl_probe SCENARIO INIT_METHOD RANK WORLD_SIZE
// Scenarios (exit 0 when the check holds):
//   collectives  the backend conformance suite and what NCCL does beyond it (nccl_conformance.cc)
//   ddp          DDP over NCCL; rank 0 also trains the whole batch alone and compares
//   fsdp         FullyShardedDataParallel over NCCL (each Conv2d and Linear a unit), with
//                clipping; rank 0's reference trains the whole batch alone and compares;
//                then a sharded checkpoint (dcp) of the GPU shards saved over NCCL, loaded
//                into a whole model on the CPU and back into the shards
//   metadata     DDP with find_unused_parameters, average_by_samples, join over uneven
//                inputs and SyncBatchNorm: every metadata tensor on the GPU
//   kill         rank 1 SIGKILLs itself before its second all_reduce; rank 0 exits 0 when its
//                all_reduce fails with CommError (or TimeoutError) instead of hanging
//   world1       WORLD_SIZE 1: dtypes, non-contiguous tensors, the caller's stream, freed
//                inputs, the waits, destroying and aborting groups (nccl_groups.cc)
//   two_groups   two groups made on one store, one after the other (nccl_groups.cc)
//   stall        new_nccl_process_group's group warns when rank 1 is late (nccl_groups.cc)
//   balance      --balance auto's measurements with rank 1 slowed (nccl_groups.cc)
//   fail_after_wait[_handled]  WORLD_SIZE 1: a timeout after wait() returned (nccl_groups.cc)
// collectives, ddp, fsdp, metadata and zero_trace run at WORLD_SIZE 1 too.
#include <signal.h>
#include <unistd.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <string>
#include <thread>
#include <utility>

#include "datapar/config.h"
#include "datapar/datapar.h"
#include "datapar/dcp/checkpoint.h"
#include "datapar/dcp/fsdp_state.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/sync_batch_norm.h"
#include "datapar/distributed.h"
#include "datapar/state_dict.h"
#include "gpu/nccl_conformance.h"
#include "testing/crash_report.h"
#include "testing/models.h"
#include "testing/tf32.h"
#if DATAPAR_HAVE_NCCL
#include "gpu/nccl_groups.h"
#endif

namespace {

using namespace datapar;
using namespace std::chrono_literals;

int fail(const std::string& what) {
  std::cerr << "nccl_probe: " << what << "\n";
  return 1;
}

bool near(const at::Tensor& got, const at::Tensor& want) { return at::allclose(got.cpu(), want.cpu(), 1e-5, 1e-6); }

// A ConvNet on the GPU and an identical one, the reference, which trains on every rank's
// rows at once as one process would.
struct ModelAndReference {
  testing::ConvNet model;
  testing::ConvNet reference;
};

ModelAndReference model_and_reference(const at::Device& gpu) {
  torch::manual_seed(5);
  ModelAndReference m;
  load_state_dict(*m.reference, state_dict(*m.model));
  m.model->to(gpu);
  m.reference->to(gpu);
  return m;
}

// Step `step`'s whole batch, the same on every rank: images and labels.
std::pair<at::Tensor, at::Tensor> whole_batch(int step, int64_t rows, const at::Device& gpu) {
  torch::manual_seed(100 + step);
  const at::Tensor x = at::randn({rows, 1, 12, 12}).to(gpu);
  const at::Tensor y = at::randint(0, 10, {rows}, at::kLong).to(gpu);
  return {x, y};
}

// The first parameter of `m.model` that differs from the reference's (relative error over
// 1e-5), or "" when none does.
std::string first_difference(const ModelAndReference& m) {
  const auto got = m.model->named_parameters();
  const auto want = m.reference->named_parameters();
  for (size_t j = 0; j < got.size(); ++j) {
    if (testing::relative_error(got[j].value(), want[j].value()) > 1e-5) return got[j].key();
  }
  return "";
}

int ddp(ProcessGroup& group, const at::Device& gpu) {
  const int rank = group.rank();
  const int world = group.size();
  ModelAndReference m = model_and_reference(gpu);
  DistributedDataParallel ddp_model(m.model.ptr());
  torch::optim::SGD sgd(m.model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_ref(m.reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int64_t per_rank = 8;
  for (int step = 0; step < 5; ++step) {
    const auto [x, y] = whole_batch(step, per_rank * world, gpu);
    sgd.zero_grad();
    at::cross_entropy_loss(ddp_model(x.narrow(0, rank * per_rank, per_rank)), y.narrow(0, rank * per_rank, per_rank))
        .backward();
    sgd.step();
    sgd_ref.zero_grad();
    at::cross_entropy_loss(m.reference(x), y).backward();
    sgd_ref.step();
  }
  const std::string differs = first_difference(m);
  if (!differs.empty()) {
    return fail("rank " + std::to_string(rank) + ": " + differs + " differs from single-process training");
  }
  return 0;
}

// A sharded checkpoint of FSDP's shards on the GPU, over NCCL (the plans exchanged as CUDA
// tensors, the shards copied to the host to be written): rank 0 loads it alone into a whole
// model on the CPU, which must equal the reference; then the shards, zeroed, and the
// momentum buffers load back over NCCL and the full state is the reference's again.
int fsdp_checkpoint(ProcessGroup& group, FullyShardedDataParallel<testing::ConvNetImpl>& sharded,
                    torch::optim::SGD& sgd, const testing::ConvNet& reference, const std::string& dir) {
  const std::string who = "rank " + std::to_string(group.rank()) + ": dcp: ";
  {
    dcp::State state;
    dcp::add_fsdp(state, "model", sharded);
    dcp::add_fsdp_optimizer(state, "optim", sharded, sgd);
    dcp::save(state, dir, group);
  }
  if (group.rank() == 0) {
    testing::ConvNet whole;
    for (auto& p : whole->parameters()) p.detach().zero_();
    dcp::State state;
    dcp::add_module(state, "model", *whole);
    dcp::load(state, dir);
    for (const auto& item : reference->named_parameters()) {
      if (testing::relative_error(whole->named_parameters()[item.key()], item.value().cpu()) > 1e-6) {
        return fail(who + item.key() + " loaded into a whole model on the CPU differs from the one saved");
      }
    }
  }
  for (const at::Tensor& shard : sharded.parameters()) shard.detach().zero_();
  for (auto& [key, state] : sgd.state()) {
    static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer().zero_();
  }
  dcp::State state;
  dcp::add_fsdp(state, "model", sharded);
  dcp::add_fsdp_optimizer(state, "optim", sharded, sgd);
  dcp::load(state, dir, group);
  dcp::apply_fsdp_optimizer(state, "optim", sharded, sgd);
  const StateDict back = sharded.full_state_dict();
  for (const auto& item : reference->named_parameters()) {
    if (!back[item.key()].is_cuda()) return fail(who + item.key() + " came back off the GPU");
    if (testing::relative_error(back[item.key()], item.value()) > 1e-6) {
      return fail(who + item.key() + " loaded back into the shards differs from the one saved");
    }
  }
  for (auto& [key, state] : sgd.state()) {
    if (static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer().abs().sum().item<double>() == 0) {
      return fail(who + "a momentum buffer stayed zero after the load");
    }
  }
  return 0;
}

// FSDP on NCCL: the units' storage freed and refilled on the GPU, all-gathers and
// reduce-scatters on NCCL's stream, the gradient clipped over the shards; 5 steps end where one
// process training the whole batch (clipped the same way) ends.
int fsdp(ProcessGroup& group, const at::Device& gpu, const std::string& dir) {
  const int rank = group.rank();
  const int world = group.size();
  ModelAndReference m = model_and_reference(gpu);
  fully_shard_each<torch::nn::LinearImpl, torch::nn::Conv2dImpl>(*m.model);
  FullyShardedDataParallel sharded(m.model.ptr());
  torch::optim::SGD sgd(sharded.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_ref(m.reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int64_t per_rank = 8;
  for (int step = 0; step < 5; ++step) {
    const auto [x, y] = whole_batch(step, per_rank * world, gpu);
    sgd.zero_grad();
    at::cross_entropy_loss(sharded(x.narrow(0, rank * per_rank, per_rank)), y.narrow(0, rank * per_rank, per_rank))
        .backward();
    const double norm = sharded.clip_grad_norm_(0.5);
    sgd.step();
    sgd_ref.zero_grad();
    at::cross_entropy_loss(m.reference(x), y).backward();
    const double want = torch::nn::utils::clip_grad_norm_(m.reference->parameters(), 0.5);
    sgd_ref.step();
    if (std::abs(norm - want) > 1e-4 * want) {
      return fail("step " + std::to_string(step) + ": the sharded gradient's norm is " + std::to_string(norm) +
                  ", the whole one's " + std::to_string(want));
    }
  }
  const StateDict got = sharded.full_state_dict();
  for (const auto& item : m.reference->named_parameters()) {
    if (testing::relative_error(got[item.key()], item.value()) > 1e-5) {
      return fail("rank " + std::to_string(rank) + ": " + item.key() + " differs from single-process training");
    }
  }
  return fsdp_checkpoint(group, sharded, sgd, m.reference, dir + "/dcp");
}

// ZeRO-1 and the timeline on NCCL: DDP with Adam sharded over the ranks ends where one
// process with the whole Adam ends, the consolidated state covers every parameter, and the
// timeline holds each bucket's all-reduce (recorded by the NCCL watchdog) and each owner's
// broadcast.
int zero_trace(ProcessGroup& group, const at::Device& gpu) {
  const int rank = group.rank();
  const int world = group.size();
  ModelAndReference m = model_and_reference(gpu);
  DdpOptions options;
  options.first_bucket_cap_mb = 0.001;  // several buckets
  options.bucket_cap_mb = 0.002;
  DistributedDataParallel ddp_model(m.model.ptr(), nullptr, options);
  auto make = [](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(0.01));
  };
  ZeroRedundancyOptimizer zero(ddp_model.parameters(), make);
  torch::optim::Adam adam_ref(m.reference->parameters(), torch::optim::AdamOptions(0.01));
  trace::start();
  const int64_t per_rank = 8;
  for (int step = 0; step < 3; ++step) {
    trace::set_step(step);
    const auto [x, y] = whole_batch(step, per_rank * world, gpu);
    zero.zero_grad();
    at::cross_entropy_loss(ddp_model(x.narrow(0, rank * per_rank, per_rank)), y.narrow(0, rank * per_rank, per_rank))
        .backward();
    zero.step();
    adam_ref.zero_grad();
    at::cross_entropy_loss(m.reference(x), y).backward();
    adam_ref.step();
  }
  const std::string timeline = trace::stop_to_json(rank);
  const std::string differs = first_difference(m);
  if (!differs.empty()) {
    return fail("rank " + std::to_string(rank) + ": " + differs + " differs from single-process Adam");
  }
  const std::unique_ptr<torch::optim::Optimizer> whole = zero.consolidate(0);
  const size_t parameters = m.model->parameters().size();
  if (rank == 0 && whole->state().size() != parameters) {
    return fail("consolidated state covers " + std::to_string(whole->state().size()) + " of " +
                std::to_string(parameters) + " parameters");
  }
  for (size_t b = 0; b < ddp_model.bucket_indices().size(); ++b) {
    if (timeline.find("\"all_reduce(sum) bucket " + std::to_string(b) + "\"") == std::string::npos) {
      return fail("rank " + std::to_string(rank) + ": no all-reduce of bucket " + std::to_string(b) + " in the timeline");
    }
  }
  if (timeline.find("zero shard") == std::string::npos) return fail("no ZeRO broadcast in the timeline");
  return 0;
}

// Every path that exchanges metadata beside the gradients, on NCCL, which refuses host
// tensors: the model check and initial broadcast, the bucket order after the first pass,
// find_unused_parameters' and average_by_samples' flags, join's flags with uneven inputs
// (rank 1 has one batch fewer), and SyncBatchNorm's statistics. Each must get through
// without a hang or a host-tensor error, and every rank end with the same finite values.
class MetaNetImpl : public torch::nn::Cloneable<MetaNetImpl> {
 public:
  MetaNetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    bn = register_module("bn", SyncBatchNorm(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
    unused = register_module("unused", torch::nn::Linear(3, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
  SyncBatchNorm bn{nullptr};
};
TORCH_MODULE(MetaNet);

// With SyncBatchNorm every rank runs the same steps (its collectives are not shadowed by
// join, as in PyTorch); without it, rank 1 has one batch fewer.
int metadata_pass(ProcessGroup& group, const at::Device& gpu, bool sync_bn) {
  const int rank = group.rank();
  const int world = group.size();
  torch::manual_seed(9);
  MetaNet model;
  model->to(gpu);
  if (sync_bn) model->bn->set_process_group(default_group());
  DdpOptions options;
  options.find_unused_parameters = true;
  options.average_by_samples = true;
  DistributedDataParallel ddp_model(model.ptr(), nullptr, options);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  const int batches = !sync_bn && rank == 1 ? 2 : 3;
  ddp_model.join([&] {
    for (int step = 0; step < batches; ++step) {
      torch::manual_seed(200 + step * world + rank);
      const at::Tensor x = at::randn({4 + rank, 6}).to(gpu);
      const at::Tensor y = at::randint(0, 3, {4 + rank}, at::kLong).to(gpu);
      sgd.zero_grad();
      at::cross_entropy_loss(ddp_model(x), y).backward();
      sgd.step();
    }
  });
  // Every rank ends with the same parameters (join broadcasts from the rank that trained
  // longest), reached through NCCL only.
  for (const auto& p : model->named_parameters()) {
    at::Tensor mine = p.value().detach().clone();
    at::Tensor rank0 = mine.clone();
    group.broadcast(rank0, 0)->wait();
    if (!near(mine, rank0)) return fail("rank " + std::to_string(rank) + ": " + p.key() + " differs from rank 0");
    if (!at::isfinite(mine).all().item<bool>()) return fail(p.key() + " is not finite");
  }
  return 0;
}

int metadata(ProcessGroup& group, const at::Device& gpu) {
  if (const int failed = metadata_pass(group, gpu, /*sync_bn=*/true)) return failed;
  return metadata_pass(group, gpu, /*sync_bn=*/false);
}

// wait() does not block the host on nccl: the collective that never completes fails in
// the group's watchdog, which aborts the group; the next call then throws CommError (or
// wait() rethrows the failure once it is known). Bounded by a deadline of three timeouts
// (kKillTimeout) after the peer died, whatever each try costs.
constexpr std::chrono::seconds kKillTimeout{20};

int kill_scenario(ProcessGroup& group, const at::TensorOptions& on_gpu) {
  at::Tensor t = at::ones({1024}, on_gpu);
  group.all_reduce(t)->wait();
  if (group.rank() == 1) ::kill(::getpid(), SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + 3 * kKillTimeout;
  try {
    while (std::chrono::steady_clock::now() < deadline) {
      const auto work = group.all_reduce(t);
      work->wait();
      std::this_thread::sleep_for(100ms);
      if (work->is_completed()) work->wait();  // rethrows a failure
    }
  } catch (const CommError& e) {
    std::cerr << "rank 0: CommError as expected: " << e.what() << "\n";
    return 0;
  } catch (const TimeoutError& e) {
    std::cerr << "rank 0: TimeoutError as expected: " << e.what() << "\n";
    return 0;
  }
  return fail("rank 0: no error within three timeouts although its peer was dead");
}

}  // namespace

int main(int argc, char** argv) {
  testing::install_crash_report();
  if (argc != 5) return fail("usage: nccl_probe SCENARIO INIT_METHOD RANK WORLD_SIZE");
  const std::string scenario = argv[1];
  const int rank = std::stoi(argv[3]);
  const int world = std::stoi(argv[4]);
  try {
    ::setenv("LOCAL_RANK", argv[3], 1);
    init_process_group("nccl", argv[2], rank, world, scenario == "kill" ? std::chrono::milliseconds(kKillTimeout)
                                                                         : kDefaultTimeout);
    const at::Device gpu(at::kCUDA, rank);
    testing::turn_off_tf32();
    const auto on_gpu = at::TensorOptions(gpu).dtype(at::kFloat);
    ProcessGroup& group = *default_group();
    if (scenario == "collectives") return testing::nccl_collectives(group);
    if (scenario == "ddp") return ddp(group, gpu);
    if (scenario == "fsdp") {
      const std::string init = argv[2];  // file://DIR/rendezvous
      return fsdp(group, gpu, init.substr(7, init.rfind('/') - 7));
    }
    if (scenario == "kill") return kill_scenario(group, on_gpu);
    if (scenario == "metadata") return metadata(group, gpu);
    if (scenario == "zero_trace") return zero_trace(group, gpu);
#if DATAPAR_HAVE_NCCL
    if (scenario == "world1") {
      const std::string init = argv[2];  // file://DIR/rendezvous
      return testing::world_one(group, init.substr(7, init.rfind('/') - 7));
    }
    if (scenario == "fail_after_wait" || scenario == "fail_after_wait_handled") {
      const std::string init = argv[2];
      return testing::failure_after_wait(init.substr(7, init.rfind('/') - 7), scenario == "fail_after_wait");
    }
    if (scenario == "balance") return testing::balance_slowed_rank(group);
    if (scenario == "two_groups") {
      const std::string init = argv[2];
      return testing::two_groups(rank, world, init.substr(7, init.rfind('/') - 7));
    }
    if (scenario == "stall") {
      const std::string init = argv[2];
      return testing::stall_warning(rank, world, init.substr(7, init.rfind('/') - 7));
    }
#endif
    return fail("unknown scenario " + scenario);
  } catch (const std::exception& e) {
    return fail(std::string("rank ") + argv[3] + ": " + e.what());
  }
}
