// Links datapar::datapar and datapar::datapar_train from an installed package, in a project
// configured for C++14 (the exported targets raise it to what datapar needs).
//   consumer          DataParallel on two CPU devices (the core) on a batch of synthetic
//                     images (the toolkit)
//   consumer ranks    a rank of a job the installed `datapar launch` started: DDP's gradient
//                     average over the ranks
#include <datapar/datapar_train.h>
#include <torch/nn/modules/linear.h>

#include <iostream>
#include <string>

namespace {

int data_parallel() {
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

int ranks() {
  datapar::init_process_group("gloo");
  const int rank = datapar::default_group()->rank();
  torch::manual_seed(0);
  torch::nn::Linear model(2, 1);
  datapar::DistributedDataParallel ddp(model);
  // Rank r's loss is (r + 1) times the sum of its output: the averaged gradient of the bias
  // is the mean of 1 and 2 (two ranks).
  ddp.forward(at::zeros({1, 2})).sum().mul(rank + 1).backward();
  const double bias_grad = model->bias.grad().item<double>();
  std::cout << "consumer rank " << rank << " of " << datapar::default_group()->size() << ": bias gradient "
            << bias_grad << "\n";
  datapar::destroy_process_group();
  return bias_grad == 1.5 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "ranks") return ranks();
  return data_parallel();
}
