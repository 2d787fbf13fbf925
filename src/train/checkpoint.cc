// Checkpoints: the file layout (docs/checkpoint_format.md), its checks, and restoring.
#include "datapar/train/checkpoint.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "datapar/fsdp/fully_shard.h"
#include "process_group/tensor_description.h"
#include "serialization/atomic_file.h"
#include "serialization/pickle_limits.h"
#include "serialization/torch_file.h"

namespace datapar::train {
namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;
using detail::python_type_name;
using detail::str_cat;

const char kPrefix[] = "checkpoint-epoch-";
const char kSuffix[] = ".pt";
const char kDamaged[] = ".damaged";  // checkpoint-epoch-3.pt.damaged[.1, .2, ...]

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

bool is_container(const IValue& v) { return v.isGenericDict() || v.isList() || v.isTuple(); }

// Note [Copying a state tree]
// A copy of the dicts, lists and tuples of `root` (an optimizer state), with its tensors
// moved to `device` (left as they are without one), so that the result aliases no
// container of the original. The original may come from a user's C++ rather than from a
// file, and then hold anything, a dict inside itself included: so the walk keeps its own
// stack instead of recursing, refuses nesting past kMaxPickleDepth (what a file may hold)
// and a container inside itself, and copies a container that is referenced twice once,
// keeping it shared (a DAG costs its size, not its number of paths). Errors name `path`
// and `what`.
IValue copy_tree(const IValue& root, const std::optional<c10::Device>& device, const std::string& path, const char* what) {
  auto leaf = [&device](const IValue& v) { return v.isTensor() && device ? IValue(v.toTensor().to(*device)) : v; };
  if (!is_container(root)) return leaf(root);
  struct Frame {
    IValue source;
    std::vector<IValue> keys;      // a dict's keys
    std::vector<IValue> children;  // its values, or the list's or tuple's elements
    std::vector<IValue> copies;    // of children[0, copies.size())
  };
  std::vector<Frame> stack;
  std::unordered_set<const void*> open;                // containers on the path from the root
  std::unordered_map<const void*, IValue> copied;      // finished ones, by their original
  auto enter = [&](const IValue& v) {
    if (static_cast<int>(stack.size()) >= detail::kMaxPickleDepth) {
      bad(path, str_cat(what, ": nesting deeper than ", detail::kMaxPickleDepth, " levels (datapar's limit for a ",
                        "checkpoint). PyTorch's optimizers nest 4; keep it a few levels deep."));
    }
    Frame f;
    f.source = v;
    if (v.isGenericDict()) {
      for (const auto& e : v.toGenericDict()) {
        f.keys.push_back(e.key());
        f.children.push_back(e.value());
      }
    } else if (v.isList()) {
      f.children = v.toListRef().vec();
    } else {
      f.children = v.toTupleRef().elements().vec();
    }
    open.insert(v.internalToPointer());
    stack.push_back(std::move(f));
  };
  auto build = [](Frame& f) -> IValue {
    if (f.source.isGenericDict()) {
      Dict out = new_dict();
      for (size_t i = 0; i < f.keys.size(); ++i) out.insert(f.keys[i], f.copies[i]);
      return out;
    }
    if (f.source.isList()) {
      c10::impl::GenericList out(c10::AnyType::get());
      for (IValue& c : f.copies) out.push_back(std::move(c));
      return out;
    }
    return c10::ivalue::Tuple::create(std::move(f.copies));
  };

  enter(root);
  while (true) {
    Frame& f = stack.back();
    if (f.copies.size() < f.children.size()) {
      const IValue child = f.children[f.copies.size()];
      if (!is_container(child)) {
        f.copies.push_back(leaf(child));
      } else if (open.count(child.internalToPointer()) != 0) {
        bad(path, str_cat(what, ": a dict or list contains itself (a cycle), which no checkpoint file can hold. ",
                          "Build the state without cycles."));
      } else if (auto done = copied.find(child.internalToPointer()); done != copied.end()) {
        f.copies.push_back(done->second);
      } else {
        enter(child);  // `f` is invalid from here
      }
      continue;
    }
    IValue out = build(f);
    open.erase(f.source.internalToPointer());
    copied.emplace(f.source.internalToPointer(), out);
    stack.pop_back();
    if (stack.empty()) return out;
    stack.back().copies.push_back(std::move(out));
  }
}

using ::datapar::detail::dtype_name;

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
    // load_state_dict would convert (as PyTorch's does); a resumed run must continue the
    // saved one exactly, so a float64 or int64 tensor for a float32 parameter is an error.
    if (dst->scalar_type() != item.value().scalar_type()) {
      bad(path, str_cat("model: ", name, " is ", dtype_name(item.value().scalar_type()), " in the checkpoint but ",
                        dtype_name(dst->scalar_type()), " in ", model.name(), ". Restore it into the model it was saved ",
                        "from, with the same dtype (e.g. model->to(torch::kFloat64) before restoring a float64 run)."));
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

// A sharded model's parameters hold no values between FSDP's forwards: reading or writing
// them as a plain module's would touch freed memory.
void check_not_sharded(const torch::nn::Module& model, const char* call, const char* instead) {
  for (const auto& item : model.named_parameters()) {
    const std::string unit = datapar::detail::fsdp_unit_holding(item.value());
    DATAPAR_CHECK(unit.empty(), call, ": ", item.key(), " is sharded by FullyShardedDataParallel (unit '", unit,
                  "'): between FSDP's forwards the module's parameters hold no values. Go through the FSDP wrapper: ",
                  instead, " (datapar/train/fsdp_checkpoint.h; collective, every rank).");
  }
}

}  // namespace

Checkpoint make_checkpoint(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, int64_t epoch,
                           Progress progress) {
  check_not_sharded(model, "make_checkpoint", "train::make_checkpoint(fsdp, optimizer, epoch)");
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
  // Checked (no cycle, not too deep) before the writer sees it; the tensors stay where they are.
  root.insert("optimizer", copy_tree(checkpoint.optimizer, std::nullopt, path, "optimizer state"));
  root.insert("epoch", checkpoint.epoch);
  root.insert("progress", progress);
  root.insert("rng", rng);
  detail::torch_save(root, path);
  return true;
}

namespace {

// A checkpoint from the object of a file that loaded (torch_load) at `path`.
Checkpoint parse_checkpoint(const IValue& value, const std::string& path, const c10::Device& device) {
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
  c.optimizer = copy_tree(optimizer, device, path, "\"optimizer\"").toGenericDict();
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

}  // namespace

Checkpoint load_checkpoint(const std::string& path, const c10::Device& device) {
  uint32_t digest = 0;
  Checkpoint c = parse_checkpoint(detail::torch_load(path, &digest), path, device);
  c.digest = digest;
  return c;
}

void restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                        bool restore_rng) {
  check_not_sharded(model, "restore_checkpoint", "train::restore_checkpoint(checkpoint, fsdp, optimizer)");
  const std::string path = checkpoint.path.empty() ? "checkpoint" : checkpoint.path;
  check_model(model, checkpoint.model, path);
  const IValue optimizer_state = copy_tree(checkpoint.optimizer, std::nullopt, path, "optimizer state");
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
      load_optimizer_state_dict(optimizer, optimizer_state.toGenericDict());
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

namespace {

// The checkpoint-epoch-<N>.pt files of `dir`, newest first, and how many files there are
// that were moved aside as damaged (checkpoint-epoch-<N>.pt.damaged[.K]).
struct Listing {
  std::vector<std::pair<int64_t, std::string>> checkpoints;  // (epoch, path)
  int64_t damaged = 0;
};

Listing list_checkpoints(const std::string& dir) {
  Listing out;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return out;
  const size_t prefix = sizeof(kPrefix) - 1;
  const size_t suffix = sizeof(kSuffix) - 1;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.size() <= prefix + suffix || name.compare(0, prefix, kPrefix) != 0 || detail::is_atomic_temp_name(name)) {
      continue;
    }
    if (name.find(str_cat(kSuffix, kDamaged)) != std::string::npos) {
      ++out.damaged;
      continue;
    }
    if (name.compare(name.size() - suffix, suffix, kSuffix) != 0) continue;
    const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.checkpoints.emplace_back(std::stoll(digits), str_cat(dir, dir.back() == '/' ? "" : "/", name));
  }
  std::sort(out.checkpoints.rbegin(), out.checkpoints.rend());
  return out;
}

// Renames `path` to <path>.damaged, or .damaged.1, .damaged.2, ...: the first name not
// taken, so that no earlier damaged file is replaced. Returns the new name.
std::string move_aside(const std::string& path, const std::string& problem) {
  for (int k = 0; k < 1000; ++k) {
    const std::string target = str_cat(path, kDamaged, k == 0 ? "" : str_cat(".", k));
    // link() fails if `target` exists, where rename() would replace it.
    if (::link(path.c_str(), target.c_str()) == 0) {
      ::unlink(path.c_str());
      return target;
    }
    if (errno == EEXIST) continue;
    const int link_error = errno;
    if ((link_error == EPERM || link_error == EOPNOTSUPP || link_error == EMLINK) && ::access(target.c_str(), F_OK) != 0 &&
        ::rename(path.c_str(), target.c_str()) == 0) {
      return target;  // a file system without hard links; rank 0 is the only renamer
    }
    throw CheckpointError(str_cat(problem, " It cannot be moved aside to ", target, " (", std::strerror(link_error),
                                  "), and resuming past it would overwrite it. Move it away yourself, then resume."));
  }
  throw CheckpointError(str_cat(problem, " It cannot be moved aside: ", path, kDamaged,
                                " .. .999 exist. Clear them away, then resume."));
}

}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  for (const auto& [epoch, path] : list_checkpoints(dir).checkpoints) {
    if (detail::torch_file_is_intact(path)) return path;
  }
  return std::nullopt;
}

LatestCheckpoint load_latest_checkpoint(const std::string& dir, int64_t rank, const c10::Device& device) {
  LatestCheckpoint out;
  for (const auto& [epoch, path] : list_checkpoints(dir).checkpoints) {
    // Unreadable is not damaged: a file that cannot be opened is left alone and is an error.
    // One that is gone was moved aside by rank 0 while this rank listed the directory.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue;
      throw CheckpointError(str_cat(path, ": cannot open (", std::strerror(errno), "). Make it readable, or move it away, ",
                                    "then resume."));
    }
    ::close(fd);
    IValue value;
    uint32_t digest = 0;
    try {
      value = detail::torch_load(path, &digest);  // every record against its CRC-32, and the whole data.pkl
    } catch (const CheckpointError& e) {
      if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) continue;  // moved aside by rank 0 meanwhile
      DamagedCheckpoint damaged{path, e.what(), ""};
      if (rank == 0) damaged.moved_to = move_aside(path, damaged.problem);
      out.damaged.push_back(std::move(damaged));
      continue;
    }
    // A whole file of another layout or version is not damage: that error is for the user.
    out.checkpoint = parse_checkpoint(value, path, device);
    out.checkpoint->digest = digest;
    break;
  }
  out.set_aside = list_checkpoints(dir).damaged;
  return out;
}

}  // namespace datapar::train
