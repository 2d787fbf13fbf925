// The C++ models against their PyTorch twins in python/datapar_models.py: the same
// state-dict keys, shapes and order, weights that load both ways, and, given the same
// weights and input, the same outputs (eval mode) within 1e-5.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/state_dict.h"
#include "testing/python.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

struct Twin {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  at::Tensor x;
};

std::vector<Twin> twins() {
  torch::manual_seed(7);
  auto mlp = models::Mlp();
  auto lenet = models::LeNet();
  auto resnet = models::ResNet18();
  return {
      {"mlp", mlp.ptr(), [mlp](const at::Tensor& x) mutable { return mlp->forward(x); }, at::rand({3, 1, 28, 28})},
      {"lenet", lenet.ptr(), [lenet](const at::Tensor& x) mutable { return lenet->forward(x); },
       at::rand({3, 1, 28, 28})},
      {"resnet18", resnet.ptr(), [resnet](const at::Tensor& x) mutable { return resnet->forward(x); },
       at::rand({2, 1, 28, 28})},
  };
}

// The text of a check script beside this file.
std::string check_script(const std::string& name) {
  std::ifstream file(DATAPAR_SOURCE_DIR "/tests/models/" + name);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_keys(const torch::nn::Module& module, const std::string& path) {
  std::ofstream out(path);
  for (const auto& item : state_dict(module)) {
    out << item.key() << " ";
    const auto sizes = item.value().sizes();
    for (size_t d = 0; d < sizes.size(); ++d) out << (d ? "," : "") << sizes[d];
    out << "\n";
  }
}

TEST(PythonModels, SameNamesShapesAndOutputsAsPyTorch) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  const testing::TempDir temp("twins");
  const std::string& dir = temp.path();
  std::vector<Twin> models = twins();
  std::string names;
  for (Twin& twin : models) {
    // One training-mode forward moves BatchNorm's running statistics off their defaults,
    // so that eval mode really tests them.
    {
      at::NoGradGuard no_grad;
      twin.module->train();
      twin.forward(at::rand({4, 1, 28, 28}));
      twin.module->eval();
    }
    write_keys(*twin.module, dir + "/" + twin.name + ".keys");
    save_state_dict(state_dict(*twin.module), dir + "/" + twin.name + ".pt");
    StateDict input;
    input.insert("x", twin.x);
    input.insert("unused", at::zeros({1}));  // see python_models_check.py: one-entry dicts
    save_state_dict(input, dir + "/" + twin.name + "_x.pt");
    names += " " + twin.name;
  }
  ASSERT_EQ(testing::run_python(dir, "check.py", check_script("python_models_check.py"), "'" + dir + "'" + names), 0)
      << "python_models_check.py found a difference (see its message above)";

  for (Twin& twin : models) {
    at::NoGradGuard no_grad;
    const at::Tensor ours = twin.forward(twin.x);
    const at::Tensor theirs = load_state_dict_file(dir + "/" + twin.name + "_y.pt")["y"];
    ASSERT_EQ(ours.sizes(), theirs.sizes()) << twin.name;
    const double diff = (ours - theirs).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << twin.name << ": outputs differ by " << diff;
    // The twin's own initial weights load here strictly (same keys and shapes), and then
    // the outputs differ: the weights really moved.
    load_state_dict(*twin.module, load_state_dict_file(dir + "/" + twin.name + "_py.pt"), /*strict=*/true);
    EXPECT_FALSE(at::allclose(twin.forward(twin.x), ours)) << twin.name;
  }
}

// A user who seeds both sides gets the same starting point: every layer draws its initial
// values in definition order, as PyTorch's do (not in the unspecified order in which a
// call's arguments are evaluated).
TEST(PythonModels, SameInitialValuesAsPyTorchAfterTheSameSeed) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  const testing::TempDir temp("seeded");
  const std::string& dir = temp.path();
  const int64_t seed = 20261122;
  const std::vector<std::pair<std::string, std::function<std::shared_ptr<torch::nn::Module>()>>> builders = {
      {"mlp", [] { return models::Mlp().ptr(); }},
      {"lenet", [] { return models::LeNet().ptr(); }},
      {"resnet18", [] { return models::ResNet18().ptr(); }},
  };
  std::string names;
  for (const auto& [name, build] : builders) {
    torch::manual_seed(seed);
    save_state_dict(state_dict(*build()), dir + "/" + name + "_seeded.pt");
    names += " " + name;
  }
  EXPECT_EQ(testing::run_python(dir, "check.py", check_script("python_seed_check.py"),
                                "'" + dir + "' " + std::to_string(seed) + names),
            0)
      << "python_seed_check.py found a difference (see its message above)";
}

}  // namespace
}  // namespace datapar
