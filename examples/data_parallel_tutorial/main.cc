// PyTorch's "Optional: Data Parallelism" tutorial, in C++ with datapar.
//
// A dummy dataset of 100 random vectors of size 5, a shuffled loader with batch 30, and a
// Linear(5, 2) model that prints the size of what it sees. Wrapped in DataParallel, the
// model sees a slice of each batch on every device: with 4 devices the batches of 30 are
// split 8/8/8/6 and the last batch of 10 is split 3/3/3/1.
//
//   build/bin/data_parallel_tutorial                      # all CUDA devices, else 4 CPU devices
//   build/bin/data_parallel_tutorial --devices cpu:0,cpu:1 --batch-size 25
#include <CLI/CLI.hpp>                       // command-line options
#include <torch/utils.h>               // torch::manual_seed
#include <torch/nn/cloneable.h>              // Cloneable: DataParallel copies the model per device
#include <torch/nn/modules/linear.h>         // torch::nn::Linear

#include <iostream>
#include <mutex>
#include <sstream>

#include "datapar/datapar.h"                 // DataParallel, parse_devices, Device

namespace {

// Replicas print from their device's thread; one lock keeps each line whole.
std::mutex print_mutex;

std::string shape(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// The tutorial's model: a Linear layer that reports its input and output sizes.
class TutorialModelImpl : public torch::nn::Cloneable<TutorialModelImpl> {
 public:
  TutorialModelImpl(int64_t input_size, int64_t output_size)
      : input_size_(input_size), output_size_(output_size) {
    reset();
  }

  void reset() override { fc = register_module("fc", torch::nn::Linear(input_size_, output_size_)); }

  at::Tensor forward(const at::Tensor& input) {
    at::Tensor output = fc(input);
    std::lock_guard<std::mutex> lock(print_mutex);
    std::cout << "\tIn Model: input size " << shape(input) << " output size " << shape(output) << std::endl;
    return output;
  }

  torch::nn::Linear fc{nullptr};

 private:
  int64_t input_size_;
  int64_t output_size_;
};
TORCH_MODULE(TutorialModel);

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PyTorch's data-parallel tutorial on datapar's DataParallel"};
  std::string device_list;
  int64_t batch_size = 30;
  int64_t data_size = 100;
  int64_t input_size = 5;
  int64_t output_size = 2;
  uint64_t seed = 0;
  app.add_option("--devices", device_list, "Devices, e.g. cpu:0,cpu:1 or cuda (default: all CUDA devices, else 4 CPU devices)");
  app.add_option("--batch-size", batch_size, "Batch size (default 30)")->check(CLI::PositiveNumber);
  app.add_option("--data-size", data_size, "Samples in the dataset (default 100)")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Random seed (default 0)");
  CLI11_PARSE(app, argc, argv);

  try {
    // Devices: what was asked for, or every CUDA device, or 4 CPU devices.
    std::vector<datapar::Device> devices = device_list.empty() ? datapar::cuda_devices()
                                                               : datapar::parse_devices(device_list);
    if (devices.empty()) devices = datapar::cpu_devices(4);
    torch::manual_seed(seed);

    // The dataset: data_size random vectors of input_size.
    const at::Tensor data = torch::randn({data_size, input_size});

    // The model, on the first device, wrapped for data parallelism.
    TutorialModel model(input_size, output_size);
    model->to(devices.front().torch_device());
    std::cout << "Let's use " << devices.size() << " devices: " << datapar::to_string(devices) << "\n";
    datapar::DataParallel dp(model, devices);

    // One shuffled pass over the data, batch by batch.
    const at::Tensor order = torch::randperm(data_size);
    for (int64_t begin = 0; begin < data_size; begin += batch_size) {
      const int64_t rows = std::min(batch_size, data_size - begin);
      const at::Tensor input = data.index_select(0, order.narrow(0, begin, rows))
                                   .to(devices.front().torch_device());
      const at::Tensor output = dp(input);  // scatter, replicate, parallel_apply, gather
      std::lock_guard<std::mutex> lock(print_mutex);
      std::cout << "Outside: input size " << shape(input) << " output_size " << shape(output) << std::endl;
    }
    return 0;
  } catch (const datapar::Error& e) {
    std::cerr << "data_parallel_tutorial: " << e.what() << "\n";
    return 2;
  }
}
