// A rank of a DDP test job: ddp_probe SCENARIO INIT_METHOD RANK WORLD_SIZE OUT_FILE [DEVICE]
// Trains the scenario (tests/testing/ddp_scenarios.h) under DistributedDataParallel on the
// Gloo backend, with the model and batches on DEVICE (default cpu; cuda:0: CUDA tensors
// staged through the gloo group), and saves the final parameters to OUT_FILE, on the CPU
// (zero_* scenarios: under ZeroRedundancyOptimizer, see train_zero). Special scenarios:
//   mismatch  rank 1 builds a different model: exits 0 if construction fails on this rank
//             with the error naming the difference
//   kill      the last rank SIGKILLs itself in its second backward: the others exit 0 if
//             backward fails with a datapar error instead of hanging
//   stall     rank 1 sleeps 3 s before its second backward (stall warning after 1 s)
//   eval_on_rank0  a model with buffers; rank 0 alone evaluates it through the wrapper
//             (no grad) between two training steps: exits 0 when nobody hangs and the
//             ranks end with the same parameters and buffers
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <thread>

#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/state_dict.h"
#include "datapar/train/checkpoint.h"
#include "file_system.h"
#include "testing/crash_report.h"
#include "testing/ddp_scenarios.h"
#include "testing/tf32.h"

namespace {

using namespace datapar;
using namespace datapar::testing;
using namespace std::chrono_literals;

c10::Device device(c10::kCPU);  // where this rank trains (DEVICE)

// A batch on this rank's device.
std::pair<at::Tensor, at::Tensor> on_device(const std::pair<at::Tensor, at::Tensor>& batch) {
  return {batch.first.to(device), batch.second.to(device)};
}

// What OUT_FILE holds: the state on the CPU, wherever it was trained.
void save_on_cpu(const StateDict& state, const std::string& out) {
  StateDict cpu;
  for (const auto& item : state) cpu.insert(item.key(), item.value().cpu());
  save_state_dict(cpu, out);
}

// Evaluation without grad on rank 0 alone, between training steps: it must issue no
// collective (buffers are broadcast in training forwards only, as in PyTorch's DDP).
int eval_on_rank0(const DdpScenario& s, int rank) {
  torch::manual_seed(1);
  SyncBnNet model;  // SyncBatchNorm: buffers; in eval mode it uses them and moves nothing
  convert_sync_batchnorm(*model);
  model->to(device);
  DistributedDataParallel ddp(model.ptr(), nullptr, s.options);
  auto sgd = make_sgd(ddp.parameters());
  for (int step = 0; step < 2; ++step) {
    const auto data = on_device(step_data(s, step, 0)[rank]);
    sgd.zero_grad();
    at::cross_entropy_loss(ddp.forward(data.first, true), data.second).backward();
    sgd.step();
    if (step == 0 && rank == 0) {
      model->eval();
      at::NoGradGuard no_grad;
      (void)ddp.forward(data.first, true);
      model->train();
    }
  }
  // Everyone's parameters and buffers against rank 0's.
  for (const auto& item : ddp.state_dict()) {
    at::Tensor mine = item.value().detach().clone();
    at::Tensor rank0 = mine.clone();
    default_group()->broadcast(rank0, 0)->wait();
    if (!at::equal(mine, rank0)) {
      std::cerr << "rank " << rank << ": " << item.key() << " differs from rank 0's\n";
      return 12;
    }
  }
  return 0;
}

int run_special(const std::string& name, int rank, int world) {
  if (name == "mismatch") {
    torch::manual_seed(1);
    ProbeNet model(rank == 1 ? 33 : 32);
    try {
      DistributedDataParallel ddp(model.ptr());
      std::cerr << "rank " << rank << ": construction succeeded\n";
      return 10;
    } catch (const InvalidArgumentError& e) {
      std::cerr << e.what() << "\n";
      const std::string what = e.what();
      return what.find("differs between ranks") != std::string::npos && what.find("rank 1 has 'fc1.weight [33, 20]") !=
             std::string::npos ? 0 : 11;
    }
  }
  DdpScenario s = scenario("even", world);
  if (name == "eval_on_rank0") return eval_on_rank0(s, rank);
  default_group()->set_stall_warning(1s);
  torch::manual_seed(1);
  ProbeNet model;
  model->to(device);
  DistributedDataParallel ddp(model.ptr(), nullptr, s.options);
  auto sgd = make_sgd(ddp.parameters());
  for (int step = 0; step < 3; ++step) {
    const auto data = on_device(step_data(s, step, 0)[rank]);
    sgd.zero_grad();
    at::Tensor loss = at::cross_entropy_loss(ddp.forward(data.first, true), data.second);
    if (step == 1 && name == "kill" && rank == world - 1) {
      loss.register_hook([](at::Tensor g) {
        ::raise(SIGKILL);
        return g;
      });
    }
    if (step == 1 && name == "stall" && rank == 1) std::this_thread::sleep_for(3s);
    if (name == "kill" && step == 1) {
      try {
        loss.backward();
        return 20;  // must not succeed with a rank gone
      } catch (const datapar::Error& e) {
        std::cerr << "rank " << rank << ": " << e.what() << "\n";
        return 0;
      }
    }
    loss.backward();
    sgd.step();
  }
  const CommunicationStats stats = ddp.communication_stats();
  std::cout << "synchronised passes " << stats.synchronised_passes << ", exposed wait "
            << std::chrono::duration_cast<std::chrono::milliseconds>(stats.exposed_wait).count() << " ms\n";
  return 0;
}

template <typename Net>
int train(const DdpScenario& s, const std::string& name, int rank, const std::string& out);
int train_zero(const DdpScenario& s, int rank, const std::string& out);

int run(const std::string& name, const std::string& init, int rank, int world, const std::string& out) {
  init_process_group("gloo", init, rank, world, 30s);
  if (name == "mismatch" || name == "kill" || name == "stall" || name == "eval_on_rank0") {
    const int code = run_special(name, rank, world);
    if (name != "kill") destroy_process_group();
    return code;
  }
  const DdpScenario s = scenario(name, world);
  if (s.zero) return train_zero(s, rank, out);
  return s.sync_bn ? train<SyncBnNet>(s, name, rank, out) : train<ProbeNet>(s, name, rank, out);
}

// A zero_* scenario: DDP with ZeroRedundancyOptimizer. Prints this rank's optimizer state
// bytes; rank 0 writes the consolidated optimizer into a checkpoint, zero.ckpt beside
// OUT_FILE. With
// resume_after: the checkpoint is written then, and every rank goes on from it.
int train_zero(const DdpScenario& s, int rank, const std::string& out) {
  torch::manual_seed(rank + 1);
  ProbeNet model;
  model->to(device);
  DistributedDataParallel ddp(model.ptr(), nullptr, s.options);
  auto make = [&](std::vector<at::Tensor> params) { return make_optimizer(s.optimizer, params); };
  auto zero = std::make_unique<ZeroRedundancyOptimizer>(ddp.parameters(), make);
  std::unique_ptr<torch::optim::Optimizer> plain;  // resume_plain: after the checkpoint
  const std::string checkpoint = datapar::detail::parent_directory(out) + "/zero.ckpt";  // one for all
  auto save = [&](int64_t steps) {
    std::unique_ptr<torch::optim::Optimizer> full = zero->consolidate(0);
    if (rank == 0) train::save_checkpoint(train::make_checkpoint(*model, *full, steps), checkpoint, 0);
    default_group()->barrier()->wait();  // written before anyone reads it
  };
  for (size_t step = 0; step < s.rows.size(); ++step) {
    if (static_cast<int>(step) == s.resume_after) {
      save(static_cast<int64_t>(step));
      // Every rank from the file: the model and a whole optimizer, then its shard of it.
      const train::Checkpoint c = train::load_checkpoint(checkpoint);
      std::unique_ptr<torch::optim::Optimizer> full = make(ddp.parameters());
      train::restore_checkpoint(c, *model, *full);
      if (s.resume_plain) {
        plain = std::move(full);
      } else {
        zero = std::make_unique<ZeroRedundancyOptimizer>(ddp.parameters(), make);
        zero->load_full_state(*full);
      }
    }
    const auto data = on_device(step_data(s, static_cast<int>(step), 0)[rank]);
    if (plain) {
      plain->zero_grad();
    } else {
      zero->zero_grad();
    }
    at::cross_entropy_loss(ddp.forward(data.first, true), data.second).backward();
    if (plain) {
      plain->step();
    } else {
      zero->step();
    }
  }
  std::cout << "state bytes " << zero->state_bytes() << "\n";
  if (s.resume_after < 0) save(static_cast<int64_t>(s.rows.size()));
  save_on_cpu(ddp.state_dict(), out);
  destroy_process_group();
  return 0;
}

template <typename Net>
int train(const DdpScenario& s, const std::string& name, int rank, const std::string& out) {
  torch::manual_seed(rank + 1);  // different on every rank: DDP must broadcast rank 0's
  Net model;
  if (s.sync_bn) convert_sync_batchnorm(*model);
  model->to(device);
  DistributedDataParallel ddp(model.ptr(), nullptr, s.options);
  if (name == "bf16") ddp.register_comm_hook(bf16_compress_hook());
  if (name == "fp16" || name == "fp16_8192") ddp.register_comm_hook(fp16_compress_hook());
  auto sgd = make_sgd(ddp.parameters());
  const bool extra = uses_extra(s, rank);
  // Host reads of metadata in this rank's own steps from the third on (the second's forward
  // rebuilds the buckets, a read): none without find_unused_parameters.
  int64_t reads_from = -1, reads = 0;
  auto train = [&] {
    for (size_t step = 0; step < s.rows.size() && s.rows[step][rank] > 0; ++step) {
      if (step == 2) reads_from = datapar::detail::metadata_host_reads();
      sgd.zero_grad();
      if (s.micro_batches) {
        const auto first = on_device(step_data(s, static_cast<int>(step), 0)[rank]);
        auto guard = ddp.no_sync();
        at::cross_entropy_loss(ddp.forward(first.first, extra), first.second).backward();
      }
      const auto data = on_device(step_data(s, static_cast<int>(step), s.micro_batches ? 1 : 0)[rank]);
      (at::cross_entropy_loss(ddp.forward(data.first, extra), data.second) * s.loss_scale).backward();
      sgd.step();
    }
    if (reads_from >= 0) reads = datapar::detail::metadata_host_reads() - reads_from;
  };
  if (s.join) {
    ddp.join(train);
  } else {
    train();
  }
  save_on_cpu(ddp.state_dict(), out);
  std::cout << "buckets " << ddp.bucket_indices().size() << "\n";
  std::cout << "synchronised passes " << ddp.communication_stats().synchronised_passes << "\n";
  if (reads_from >= 0) std::cout << "host reads from step 3: " << reads << "\n";
  destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  datapar::testing::install_crash_report();
  if (argc != 6 && argc != 7) {
    std::cerr << "usage: ddp_probe SCENARIO INIT_METHOD RANK WORLD_SIZE OUT_FILE [DEVICE]\n";
    return 2;
  }
  try {
    if (argc == 7) device = c10::Device(argv[6]);
    if (device.is_cuda()) datapar::testing::turn_off_tf32();
    return run(argv[1], argv[2], std::stoi(argv[3]), std::stoi(argv[4]), argv[5]);
  } catch (const std::exception& e) {
    std::cerr << "ddp_probe rank " << argv[3] << ": " << e.what() << "\n";
    return 1;
  }
}
