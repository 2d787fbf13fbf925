// The four data-parallel primitives used by hand, as in PyTorch's functional
// torch.nn.parallel.data_parallel: replicate, scatter, parallel_apply, gather.
//
// A Linear(10, 20) on two devices: 16 rows split 8 + 8 and gathered back to [16, 20], then
// 15 rows split 8 + 7. Backward goes through all four and the master's gradients equal
// those of the plain module on the whole batch.
//
//   build/bin/functional_data_parallel                       # 2 CUDA devices, else cpu:0,cpu:1
//   build/bin/functional_data_parallel --devices cpu:0,cpu:1,cpu:2
#include <CLI/CLI.hpp>                   // command-line options
#include <torch/utils.h>               // torch::manual_seed
#include <torch/nn/modules/linear.h>     // torch::nn::Linear

#include <iostream>
#include <sstream>

#include "datapar/datapar.h"             // replicate, scatter, parallel_apply, gather

namespace {

std::string shapes(const std::vector<at::Tensor>& tensors, const std::vector<datapar::Device>& devices) {
  std::ostringstream out;
  for (size_t i = 0; i < tensors.size(); ++i) out << (i ? ", " : "") << tensors[i].sizes() << " on " << devices[i];
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"replicate / scatter / parallel_apply / gather by hand"};
  std::string device_list;
  app.add_option("--devices", device_list, "Devices (default: 2 CUDA devices if there are, else cpu:0,cpu:1)");
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<datapar::Device> devices;
    if (!device_list.empty()) {
      devices = datapar::parse_devices(device_list);
    } else if (datapar::cuda_devices().size() >= 2) {
      devices = {datapar::Device::cuda(0), datapar::Device::cuda(1)};
    } else {
      devices = datapar::cpu_devices(2);
    }
    torch::manual_seed(0);
    const datapar::Device output_device = devices.front();

    torch::nn::Linear module(10, 20);                 // the master module
    module->to(output_device.torch_device());
    std::cout << "devices: " << datapar::to_string(devices) << "\n";

    // 1. replicate: one copy per device, kept in step with the master.
    auto replicas = datapar::replicate(module, devices);
    std::cout << "replicate: " << replicas.size() << " replicas of " << *module << "\n";

    for (int64_t rows : {16, 15}) {
      const at::Tensor input = torch::randn({rows, 10}, output_device.torch_device());
      std::cout << "\ninput: " << input.sizes() << "\n";

      // 2. scatter: split the batch along dim 0, one chunk per device.
      const std::vector<at::Tensor> chunks = datapar::scatter(input, devices);
      std::cout << "scatter: " << shapes(chunks, devices) << "\n";

      // 3. parallel_apply: replica i runs on chunk i, all at once.
      const std::vector<at::Tensor> outputs = datapar::parallel_apply(replicas, chunks, devices);
      std::cout << "parallel_apply: " << shapes(outputs, devices) << "\n";

      // 4. gather: concatenate the outputs on the output device.
      const at::Tensor output = datapar::gather(outputs, output_device);
      std::cout << "gather: " << output.sizes() << " on " << output_device << "\n";

      // Backward through all four reaches the master's parameters.
      module->zero_grad();
      output.pow(2).sum().backward();
      const at::Tensor grad = module->weight.grad().clone();
      module->zero_grad();
      module(input).pow(2).sum().backward();
      const double diff = (grad - module->weight.grad()).abs().max().item<double>();
      std::cout << "backward: master weight grad " << grad.sizes() << ", max difference to the plain module "
                << diff << "\n";
    }
    return 0;
  } catch (const datapar::Error& e) {
    std::cerr << "functional_data_parallel: " << e.what() << "\n";
    return 2;
  }
}
