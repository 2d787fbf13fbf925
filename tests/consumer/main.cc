// Links datapar::datapar and datapar::datapar_train from an installed package: runs
// DataParallel on two CPU devices (the core) on a batch of synthetic images (the toolkit).
#include <datapar/datapar_train.h>
#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  datapar::SyntheticImagesOptions images;
  images.size = 6;
  const datapar::TensorDataset data = datapar::make_synthetic_images(images);  // datapar_train
  torch::nn::Linear model(28 * 28, 3);
  datapar::DataParallel dp(model, datapar::parse_devices("cpu:0,cpu:1"));  // datapar
  const at::Tensor out = dp(data.data().flatten(1));
  out.sum().backward();
  if (out.size(0) != 6 || !model->weight.grad().defined()) return 1;
  std::cout << "consumer ok: datapar " << DATAPAR_VERSION << ", chunks " << dp.last_chunk_sizes() << ", "
            << data.size() << " synthetic images\n";
  return 0;
}
