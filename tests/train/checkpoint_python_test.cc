// Python interop, both ways, against the Python of testing/python.h (Debian's torch 1.13 or pip's 2.x):
//  (a) Python's torch.load (with weights_only=True where it exists) reads datapar's
//      checkpoints; the model loads strictly into the equivalent PyTorch module and gives
//      the same outputs; the optimizer state loads into torch.optim and its next step
//      matches datapar's; the RNG state gives the same draws.
//  (b) datapar reads what Python's torch.save writes: model.state_dict() (an OrderedDict
//      with _metadata), a DataParallel state dict ("module." keys), and a checkpoint with
//      Python's own optimizer.state_dict().
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include "datapar/models/mlp.h"
#include "datapar/state_dict.h"
#include "datapar/train/checkpoint.h"
#include "testing/python.h"
#include "testing/temp_dir.h"

namespace datapar::train {
namespace {

using models::Mlp;

// The PyTorch twin of datapar::models::Mlp (src/models/mlp.cc): same names, same order.
const std::string kPythonMlp = R"(
import inspect, sys, torch
class Mlp(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(torch.nn.ReLU())
        self.layers = torch.nn.Sequential(*layers)
    def forward(self, x):
        return self.layers(x.flatten(1))
def loss(m, x, y):
    return torch.nn.functional.nll_loss(torch.log_softmax(m(x), 1), y)
d = sys.argv[1]
)";

int run_python(const std::string& dir, const std::string& name, const std::string& body) {
  return testing::run_python(dir, name, kPythonMlp + body, dir);
}

void sgd_step(Mlp& m, torch::optim::Optimizer& opt, const at::Tensor& x, const at::Tensor& y) {
  opt.zero_grad();
  at::nll_loss(at::log_softmax(m->forward(x), 1), y).backward();
  opt.step();
}

TEST(CheckpointPython, PythonLoadsOurCheckpointsModelOptimizerAndRng) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  const testing::TempDir temp("to_python");
  const std::string& dir = temp.path();
  for (const std::string name : {"sgd", "adam"}) {
    torch::manual_seed(3);
    Mlp model(std::vector<int64_t>{6, 8, 3});
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (name == "adam") {
      opt = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01).weight_decay(1e-3));
    } else {
      opt = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3));
    }
    const at::Tensor x = at::randn({5, 6});
    const at::Tensor y = at::randint(0, 3, {5}, at::kLong);
    sgd_step(model, *opt, x, y);
    sgd_step(model, *opt, x, y);
    save_checkpoint(make_checkpoint(*model, *opt, 5, {{"seed", 7}, {"consumed_samples", 96}}), dir + "/ck_" + name + ".pt", 0);
    StateDict expected;
    expected.insert("draw", at::randn({3}));  // the first draw after the saved RNG state
    expected.insert("x", x);
    expected.insert("y", y);
    expected.insert("out", model->forward(x).detach());
    sgd_step(model, *opt, x, y);
    for (const auto& p : model->named_parameters()) expected.insert("after." + p.key(), p.value().detach().clone());
    save_state_dict(expected, dir + "/expected_" + name + ".pt");
  }
  ASSERT_EQ(run_python(dir, "read_ours.py", R"(
# weights_only (PyTorch's restricted unpickler; the default from 2.6) reads tensors-only
# files in 1.13, and floats too from 2.0.
tensors_only = {"weights_only": True} if "weights_only" in inspect.signature(torch.load).parameters else {}
anything = tensors_only if int(torch.__version__.split(".")[0]) >= 2 else {}
for name in ("sgd", "adam"):
    ck = torch.load(f"{d}/ck_{name}.pt", **anything)
    ref = torch.load(f"{d}/expected_{name}.pt", **tensors_only)
    assert ck["format"] == "datapar.checkpoint/1", ck["format"]
    assert ck["epoch"] == 5 and ck["progress"] == {"seed": 7, "consumed_samples": 96}, (ck["epoch"], ck["progress"])
    m = Mlp([6, 8, 3])
    m.load_state_dict(ck["model"], strict=True)
    assert list(ck["model"].keys()) == list(m.state_dict().keys()), list(ck["model"].keys())
    with torch.no_grad():
        assert torch.allclose(m(ref["x"]), ref["out"], atol=1e-6)
    # Deliberately other hyperparameters: the checkpoint's must replace them.
    opt = torch.optim.SGD(m.parameters(), lr=1.0, momentum=0.5) if name == "sgd" else torch.optim.Adam(m.parameters(), lr=1.0)
    opt.load_state_dict(ck["optimizer"])
    opt.zero_grad()
    loss(m, ref["x"], ref["y"]).backward()
    opt.step()
    for n, p in m.named_parameters():
        assert torch.allclose(p, ref["after." + n], atol=1e-6), (name, n, (p - ref["after." + n]).abs().max())
    torch.set_rng_state(ck["rng"]["cpu"])
    assert torch.equal(torch.randn(3), ref["draw"])
)"),
            0);
}

TEST(CheckpointPython, WeLoadPythonsStateDictsAndCheckpoints) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  const testing::TempDir temp("from_python");
  const std::string& dir = temp.path();
  ASSERT_EQ(run_python(dir, "write_theirs.py", R"(
torch.manual_seed(0)
m = Mlp([6, 8, 3])
x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
sd = m.state_dict()
assert type(sd).__name__ == "OrderedDict" and hasattr(sd, "_metadata")
torch.save(sd, f"{d}/plain.pt")
torch.save(torch.nn.DataParallel(m).state_dict(), f"{d}/data_parallel.pt")
ref = {"x": x, "y": y, "out0": m(x).detach()}
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
def step():
    opt.zero_grad()
    loss(m, x, y).backward()
    opt.step()
step()
rng = torch.get_rng_state()
ref["draw"] = torch.randn(3)
torch.save({"format": "datapar.checkpoint/1", "model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "progress": {"seed": 1, "consumed_samples": 10}, "rng": {"cpu": rng, "cuda": []}}, f"{d}/checkpoint.pt")
ref["out1"] = m(x).detach()
step()
for n, p in m.named_parameters():
    ref["after." + n] = p.detach().clone()
torch.save(ref, f"{d}/expected.pt")
)"),
            0);
  const StateDict ref = load_state_dict_file(dir + "/expected.pt");
  const at::Tensor& x = ref["x"];

  Mlp plain(std::vector<int64_t>{6, 8, 3});
  load_state_dict(*plain, load_state_dict_file(dir + "/plain.pt"));
  EXPECT_TRUE(at::allclose(plain->forward(x), ref["out0"], 1e-5, 1e-6));

  const StateDict prefixed = load_state_dict_file(dir + "/data_parallel.pt");
  EXPECT_EQ(prefixed.keys().front(), "module.layers.0.weight");
  Mlp data_parallel(std::vector<int64_t>{6, 8, 3});
  load_state_dict(*data_parallel, prefixed);
  EXPECT_TRUE(at::allclose(data_parallel->forward(x), ref["out0"], 1e-5, 1e-6));

  const Checkpoint c = load_checkpoint(dir + "/checkpoint.pt");
  EXPECT_EQ(c.epoch, 3);
  EXPECT_EQ(c.progress, (Progress{{"seed", 1}, {"consumed_samples", 10}}));
  Mlp model(std::vector<int64_t>{6, 8, 3});
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1.0));  // hyperparameters come from the file
  restore_checkpoint(c, *model, opt);
  EXPECT_TRUE(at::equal(at::randn({3}), ref["draw"]));
  EXPECT_TRUE(at::allclose(model->forward(x), ref["out1"], 1e-5, 1e-6));
  sgd_step(model, opt, x, ref["y"]);
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(at::allclose(p.value(), ref["after." + p.key()], 1e-5, 1e-6)) << p.key();
  }
}

}  // namespace
}  // namespace datapar::train
