// Links datapar::datapar from an installed package and runs DataParallel on two CPU devices.
#include <datapar/datapar.h>
#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  torch::nn::Linear model(4, 3);
  datapar::DataParallel dp(model, datapar::parse_devices("cpu:0,cpu:1"));
  const at::Tensor out = dp(at::randn({6, 4}));
  out.sum().backward();
  if (out.size(0) != 6 || !model->weight.grad().defined()) return 1;
  std::cout << "consumer ok: datapar " << DATAPAR_VERSION << ", chunks " << dp.last_chunk_sizes() << "\n";
  return 0;
}
