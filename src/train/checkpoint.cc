// Checkpoints: the file layout (docs/checkpoint_format.md), its checks, and restoring.
#include "datapar/train/checkpoint.h"

#include <ATen/ATen.h>
#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "datapar/error.h"
#include "serialization/atomic_file.h"
#include "serialization/torch_file.h"

namespace datapar::train {
namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;
using detail::python_type_name;
using detail::str_cat;

const char kPrefix[] = "checkpoint-epoch-";
const char kSuffix[] = ".pt";

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

// ---- reading: every problem is a CheckpointError that names the file ----

[[noreturn]] void bad(const std::string& path, const std::string& problem) {
  throw CheckpointError(str_cat(path, ": ", problem));
}

const IValue& field(const Dict& root, const char* key, const std::string& path) {
  auto it = root.find(key);
  if (it == root.end()) bad(path, str_cat("has no \"", key, "\" entry; the checkpoint is incomplete or not a datapar checkpoint."));
  return it->value();
}

void expect(bool ok, const std::string& path, const std::string& what, const IValue& v, const char* wanted) {
  if (!ok) bad(path, str_cat(what, " is a ", python_type_name(v), ", expected ", wanted, "."));
}

void check_format(const Dict& root, const std::string& path) {
  auto it = root.find("format");
  if (it == root.end()) {
    bool tensors = !root.empty();
    for (const auto& e : root) tensors = tensors && e.value().isTensor();
    bad(path, tensors ? "is a state dict, not a checkpoint (no \"format\" entry). Load it with load_state_dict_file."
                      : "has no \"format\" entry; it is not a datapar checkpoint.");
  }
  const IValue& format = it->value();
  expect(format.isString(), path, "\"format\"", format, "a str");
  if (format.toStringRef() == kCheckpointFormat) return;
  const bool ours = format.toStringRef().rfind("datapar.checkpoint/", 0) == 0;
  bad(path, str_cat("has format \"", format.toStringRef(), "\" but this datapar reads \"", kCheckpointFormat, "\"",
                    ours ? ". It was written by another datapar version; load it with that one." : "; not a datapar checkpoint."));
}

// Tensors of a (possibly nested) optimizer state, moved to `device`. Dicts and lists are
// copied, since the loaded ones are shared with nothing and we must not alias.
IValue to_device(const IValue& v, const c10::Device& device) {
  if (v.isTensor()) return v.toTensor().to(device);
  if (v.isGenericDict()) {
    Dict out = new_dict();
    for (const auto& e : v.toGenericDict()) out.insert(e.key(), to_device(e.value(), device));
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const IValue& e : v.toListRef()) out.push_back(to_device(e, device));
    return out;
  }
  return v;
}

// ---- restoring ----

// The checks of load_state_dict(strict) done without copying, so restore_checkpoint can
// refuse before it changes anything.
void check_model(const torch::nn::Module& model, const StateDict& saved, const std::string& path) {
  const StateDict target = state_dict(model);
  bool prefixed = !saved.is_empty();
  for (const auto& item : saved) prefixed = prefixed && item.key().rfind("module.", 0) == 0;
  size_t matched = 0;
  for (const auto& item : saved) {
    const std::string name = item.key().substr(prefixed ? 7 : 0);
    const at::Tensor* dst = target.find(name);
    if (dst == nullptr) {
      bad(path, str_cat("model: the checkpoint has ", name, " but ", model.name(),
                        " has no such parameter or buffer. Restore it into the model it was saved from."));
    }
    if (dst->sizes() != item.value().sizes()) {
      bad(path, str_cat("model: ", name, " has shape ", item.value().sizes(), " in the checkpoint but ", dst->sizes(), " in ",
                        model.name(), ". Restore it into the model it was saved from."));
    }
    ++matched;
  }
  if (matched != target.size()) {
    for (const auto& item : target) {
      if (saved.find(item.key()) == nullptr && saved.find("module." + item.key()) == nullptr) {
        bad(path, str_cat("model: ", model.name(), " has ", item.key(), " but the checkpoint does not. Restore it into the model ",
                          "it was saved from."));
      }
    }
  }
}

}  // namespace

Checkpoint make_checkpoint(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, int64_t epoch,
                           Progress progress) {
  Checkpoint c;
  c.model = state_dict(model);
  c.optimizer = optimizer_state_dict(optimizer);
  c.epoch = epoch;
  c.progress = std::move(progress);
  c.rng = get_rng_state();
  return c;
}

bool save_checkpoint(const Checkpoint& checkpoint, const std::string& path, int64_t rank) {
  if (rank != 0) return false;
  DATAPAR_CHECK(checkpoint.rng.cpu.defined(), "save_checkpoint: the checkpoint has no RNG state; build it with make_checkpoint ",
                "or set rng = get_rng_state().");
  Dict model(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : checkpoint.model) model.insert(item.key(), item.value());
  Dict progress(c10::StringType::get(), c10::IntType::get());
  for (const auto& [key, value] : checkpoint.progress) progress.insert(key, value);
  c10::impl::GenericList cuda(c10::TensorType::get());
  for (const at::Tensor& t : checkpoint.rng.cuda) cuda.push_back(t);
  Dict rng = new_dict();
  rng.insert("cpu", checkpoint.rng.cpu);
  rng.insert("cuda", cuda);

  Dict root = new_dict();
  root.insert("format", kCheckpointFormat);
  root.insert("model", model);
  root.insert("optimizer", checkpoint.optimizer.empty() ? new_dict() : checkpoint.optimizer);
  root.insert("epoch", checkpoint.epoch);
  root.insert("progress", progress);
  root.insert("rng", rng);
  detail::torch_save(root, path);
  return true;
}

Checkpoint load_checkpoint(const std::string& path, const c10::Device& device) {
  const IValue value = detail::torch_load(path);
  if (!value.isGenericDict()) bad(path, str_cat("holds a ", python_type_name(value), ", not a checkpoint dict."));
  const Dict root = value.toGenericDict();
  check_format(root, path);

  Checkpoint c;
  c.path = path;
  const IValue& model = field(root, "model", path);
  expect(model.isGenericDict(), path, "\"model\"", model, "a dict of tensors");
  for (const auto& e : model.toGenericDict()) {
    expect(e.key().isString(), path, "a key of \"model\"", e.key(), "a str");
    expect(e.value().isTensor(), path, str_cat("\"model\" entry ", e.key().toStringRef()), e.value(), "a tensor");
    c.model.insert(e.key().toStringRef(), e.value().toTensor().to(device));
  }
  const IValue& optimizer = field(root, "optimizer", path);
  expect(optimizer.isGenericDict(), path, "\"optimizer\"", optimizer, "a dict");
  c.optimizer = to_device(optimizer, device).toGenericDict();
  const IValue& epoch = field(root, "epoch", path);
  expect(epoch.isInt(), path, "\"epoch\"", epoch, "an int");
  c.epoch = epoch.toInt();
  const IValue& progress = field(root, "progress", path);
  expect(progress.isGenericDict(), path, "\"progress\"", progress, "a dict of ints");
  for (const auto& e : progress.toGenericDict()) {
    expect(e.key().isString(), path, "a key of \"progress\"", e.key(), "a str");
    expect(e.value().isInt(), path, str_cat("\"progress\" entry ", e.key().toStringRef()), e.value(), "an int");
    c.progress[e.key().toStringRef()] = e.value().toInt();
  }
  const IValue& rng = field(root, "rng", path);
  expect(rng.isGenericDict(), path, "\"rng\"", rng, "a dict");
  const IValue& cpu = field(rng.toGenericDict(), "cpu", path);
  expect(cpu.isTensor() && cpu.toTensor().scalar_type() == at::kByte, path, "\"rng\" entry cpu", cpu, "a uint8 tensor");
  c.rng.cpu = cpu.toTensor();
  auto cuda = rng.toGenericDict().find("cuda");
  if (cuda != rng.toGenericDict().end()) {
    expect(cuda->value().isList(), path, "\"rng\" entry cuda", cuda->value(), "a list of uint8 tensors");
    for (const IValue& t : cuda->value().toListRef()) {
      expect(t.isTensor() && t.toTensor().scalar_type() == at::kByte, path, "an \"rng\" cuda state", t, "a uint8 tensor");
      c.rng.cuda.push_back(t.toTensor());
    }
  }
  return c;
}

void restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                        bool restore_rng) {
  const std::string path = checkpoint.path.empty() ? "checkpoint" : checkpoint.path;
  check_model(model, checkpoint.model, path);
  if (restore_rng) {
    // The state's size is fixed per generator; compare it with ours now so that
    // set_rng_state below cannot fail after the model and optimizer were changed.
    const int64_t size = get_rng_state().cpu.numel();
    if (!checkpoint.rng.cpu.defined() || checkpoint.rng.cpu.numel() != size) {
      bad(path, str_cat("rng: the CPU generator state has ", checkpoint.rng.cpu.defined() ? checkpoint.rng.cpu.numel() : 0,
                        " bytes but this libtorch's has ", size, "."));
    }
  }
  // All-or-nothing by itself, so it goes first; the model cannot fail after check_model.
  if (!checkpoint.optimizer.empty()) {
    try {
      load_optimizer_state_dict(optimizer, checkpoint.optimizer);
    } catch (const InvalidArgumentError& e) {
      bad(path, e.what());
    }
  }
  load_state_dict(model, checkpoint.model, /*strict=*/true);
  if (restore_rng) set_rng_state(checkpoint.rng);
}

std::string checkpoint_path(const std::string& dir, int64_t epoch) {
  return str_cat(dir, dir.empty() || dir.back() == '/' ? "" : "/", kPrefix, epoch, kSuffix);
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return std::nullopt;
  std::vector<std::pair<int64_t, std::string>> found;  // (epoch, path)
  const size_t prefix = sizeof(kPrefix) - 1;
  const size_t suffix = sizeof(kSuffix) - 1;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.size() <= prefix + suffix || name.compare(0, prefix, kPrefix) != 0 ||
        name.compare(name.size() - suffix, suffix, kSuffix) != 0 || detail::is_atomic_temp_name(name)) {
      continue;
    }
    const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(std::stoll(digits), str_cat(dir, dir.back() == '/' ? "" : "/", name));
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [epoch, path] : found) {
    if (detail::torch_file_is_intact(path)) return path;
  }
  return std::nullopt;
}

}  // namespace datapar::train
