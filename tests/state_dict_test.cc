#include "datapar/state_dict.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/models.h"
#include "testing/python.h"
#include "file_system.h"

namespace datapar {
namespace {

using testing::BnNet;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(StateDict, UsesPyTorchNamesAndOrder) {
  BnNet model;
  const auto keys = state_dict(*model).keys();
  const std::vector<std::string> want{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                      "bn.running_var", "bn.num_batches_tracked", "fc2.weight", "fc2.bias"};
  EXPECT_EQ(keys, want);
}

TEST(StateDict, LoadsAPythonDataParallelPrefix) {
  BnNet source;
  BnNet target;
  StateDict prefixed;
  for (const auto& item : state_dict(*source)) prefixed.insert("module." + item.key(), item.value());
  load_state_dict(*target, prefixed);
  EXPECT_TRUE(at::equal(target->fc2->weight, source->fc2->weight));
}

TEST(StateDict, MismatchesAreNamed) {
  BnNet model;
  StateDict state = state_dict(*model);
  StateDict missing;
  for (const auto& item : state) {
    if (item.key() != "fc2.bias") missing.insert(item.key(), item.value());
  }
  missing.insert("extra.weight", at::ones({1}));
  EXPECT_THROW_MSG(load_state_dict(*model, missing), InvalidArgumentError,
                   "Missing keys: fc2.bias. Unexpected keys: extra.weight.");
  EXPECT_NO_THROW(load_state_dict(*model, missing, /*strict=*/false));
  StateDict wrong_shape;
  wrong_shape.insert("fc1.weight", at::ones({2, 2}));
  EXPECT_THROW_MSG(load_state_dict(*model, wrong_shape, false), InvalidArgumentError, "fc1.weight has shape [2, 2]");
}

TEST(StateDict, FileRoundTripIsExact) {
  BnNet model;
  const std::string path = temp_path("bn_state.pt");
  save_state_dict(state_dict(*model), path);
  BnNet other;
  load_state_dict(*other, load_state_dict_file(path));
  for (const auto& item : state_dict(*model)) EXPECT_TRUE(at::equal(item.value(), *state_dict(*other).find(item.key())));
  // No temporary file is left behind (".bn_state.pt.tmp.<host>.<pid>-<random>").
  for (const std::string& name : detail::list_directory(detail::parent_directory(path))) {
    EXPECT_NE(name.rfind(".bn_state.pt.tmp.", 0), 0u) << name;
  }
}

TEST(StateDict, TruncatedOrForeignFilesGetACheckpointError) {
  BnNet model;
  const std::string path = temp_path("truncated.pt");
  save_state_dict(state_dict(*model), path);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  EXPECT_THROW_MSG(load_state_dict_file(path), CheckpointError, "truncated");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a checkpoint";
  EXPECT_THROW(load_state_dict_file(path), CheckpointError);
  EXPECT_THROW_MSG(load_state_dict_file(temp_path("no_such_file.pt")), CheckpointError, "cannot open");
  EXPECT_THROW_MSG(save_state_dict(state_dict(*model), "/nonexistent-dir/x.pt"), CheckpointError, "cannot create");
}

// Python's torch.load reads what we write, and we read what torch.save writes: the
// OrderedDict of model.state_dict() as it is (with _metadata), not only a plain dict.
TEST(StateDict, PythonTorchReadsAndWritesTheSameFiles) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  BnNet model;
  const std::string ours = temp_path("from_cpp.pt");
  const std::string theirs = temp_path("from_python.pt");
  save_state_dict(state_dict(*model), ours);
  const std::string script =
      "import torch\n"
      "sd = torch.load('" + ours + "', weights_only=True)\n"
      "m = torch.nn.Sequential()\n"
      "m.fc1 = torch.nn.Linear(6, 8); m.bn = torch.nn.BatchNorm1d(8); m.fc2 = torch.nn.Linear(8, 3)\n"
      "m.load_state_dict(sd)\n"
      "assert list(sd.keys()) == list(m.state_dict().keys()), list(sd.keys())\n"
      "with torch.no_grad():\n"
      "    m.fc2.bias.fill_(0.25)\n"
      "torch.save(m.state_dict(), '" + theirs + "')\n";
  const std::string script_path = temp_path("roundtrip.py");
  std::ofstream(script_path) << script;
  ASSERT_EQ(testing::run_python_file(script_path), 0);
  BnNet loaded;
  load_state_dict(*loaded, load_state_dict_file(theirs));
  EXPECT_TRUE(at::equal(loaded->fc1->weight, model->fc1->weight));
  EXPECT_TRUE(at::allclose(loaded->fc2->bias, at::full({3}, 0.25)));
}

}  // namespace
}  // namespace datapar
