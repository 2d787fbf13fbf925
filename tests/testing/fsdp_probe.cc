// A rank of a memory-limited training job (fsdp_memory_test):
//   fsdp_probe MODE INIT_METHOD RANK WORLD_SIZE BUDGET_MIB
// Joins a gloo job, then limits its own data segment (RLIMIT_DATA: heap and private
// mappings, where every tensor lives) to what it uses now plus BUDGET_MIB, and only then
// builds and trains, with Adam, a 32M-parameter MLP (eight Linear(2048, 2048) layers; 128 MiB
// of float32 parameters, so 512 MiB of parameters, gradients and Adam's two moments when
// whole). MODE: fsdp (each layer a unit) or ddp (whole). Prints "trained N steps, peak
// data M MiB" and exits 0, or prints the error and exits 1.
#include <malloc.h>
#include <sys/resource.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/distributed.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "testing/crash_report.h"

namespace {

using namespace datapar;

// A line of /proc/self/status, in KiB ("VmData", "VmHWM").
long status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

torch::nn::Sequential model() {
  torch::manual_seed(0);
  torch::nn::Sequential layers;
  for (int i = 0; i < 8; ++i) {
    layers->push_back(torch::nn::Linear(2048, 2048));
    layers->push_back(torch::nn::Tanh());
  }
  return layers;
}

template <typename Wrapper>
void train(Wrapper& wrapper, std::vector<at::Tensor> parameters, int rank, int steps) {
  torch::optim::Adam adam(parameters, torch::optim::AdamOptions(1e-4));
  for (int step = 0; step < steps; ++step) {
    adam.zero_grad();
    const at::Tensor x = at::randn({8, 2048});
    wrapper.forward(x).pow(2).mean().backward();
    adam.step();
  }
  std::cout << "rank " << rank << ": trained " << steps << " steps, peak data " << status_kib("VmData") / 1024
            << " MiB\n";
}

int run(const std::string& mode, const std::string& init, int rank, int world, long budget_mib) {
  // Large blocks straight from and back to the kernel: the data segment then follows the
  // live tensors, not what glibc keeps of freed ones (its threshold otherwise grows to 32 MiB).
  ::mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  init_process_group("gloo", init, rank, world, std::chrono::seconds(60));
  // OpenBLAS takes its work buffers (128 MiB) at the first matrix product, and spins forever
  // when that fails: take them before the limit, which then measures the training alone.
  at::set_num_threads(1);
  (void)at::mm(at::ones({8, 2048}), at::ones({2048, 2048}));
  const long now = status_kib("VmData") * 1024;
  const rlim_t limit = static_cast<rlim_t>(now + budget_mib * 1024 * 1024);
  const rlimit data{limit, limit};
  if (::setrlimit(RLIMIT_DATA, &data) != 0) {
    std::cerr << "setrlimit(RLIMIT_DATA) failed\n";
    return 3;
  }
  torch::nn::Sequential net = model();
  if (mode == "fsdp") {
    fully_shard_each<torch::nn::LinearImpl>(*net);
    FullyShardedDataParallel fsdp(net);
    train(fsdp, fsdp.parameters(), rank, 3);
  } else {
    DistributedDataParallel ddp(net);
    train(ddp, ddp.parameters(), rank, 3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  datapar::testing::install_crash_report();
  if (argc != 6) {
    std::cerr << "usage: fsdp_probe fsdp|ddp INIT_METHOD RANK WORLD_SIZE BUDGET_MIB\n";
    return 2;
  }
  try {
    return run(argv[1], argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stol(argv[5]));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::cerr << "fsdp_probe rank " << argv[3] << ": " << what.substr(0, what.find('\n')) << "\n";
    return 1;
  }
}
