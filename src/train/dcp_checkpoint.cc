// save_dcp_checkpoint / load_latest_dcp_checkpoint. See datapar/train/dcp_checkpoint.h.
#include "datapar/train/dcp_checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "datapar/dcp/checkpoint.h"
#include "datapar/dcp/zero_state.h"
#include "datapar/error.h"
#include "file_system.h"
#include "owned_directory.h"
#include "serialization/zip_crc.h"

namespace datapar::train {
namespace {

using c10::IValue;

std::vector<std::string> parameter_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& p : module.named_parameters()) names.push_back(p.key());
  return names;
}

// N of "epoch-<N>", or -1.
int64_t epoch_of(const std::string& name) {
  const std::string prefix = "epoch-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 12) return -1;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::atoll(name.c_str() + prefix.size());
}

}  // namespace

std::string dcp_checkpoint_path(const std::string& dir, int64_t epoch) {
  return dir + "/epoch-" + std::to_string(epoch);
}

dcp::State dcp_checkpoint_state(const Checkpoint& c, const torch::nn::Module& module, ZeroRedundancyOptimizer* zero) {
  dcp::State state;
  for (const auto& item : c.model)
    state.put("model." + item.key(), item.value(), {IValue("model"), IValue(item.key())});
  if (zero != nullptr) {
    dcp::add_zero_optimizer(state, "optim", *zero, module);
  } else if (c.optimizer.contains("state")) {
    dcp::add_optimizer_state(state, "optim", c.optimizer, parameter_names(module));
  }
  state.put("epoch", IValue(c.epoch), {IValue("epoch")});
  for (const auto& p : c.progress)
    state.put("progress." + p.first, IValue(p.second), {IValue("progress"), IValue(p.first)});
  if (c.rng.cpu.defined()) state.put("rng.cpu", c.rng.cpu, {IValue("rng"), IValue("cpu")});
  for (size_t i = 0; i < c.rng.cuda.size(); ++i) {
    state.put("rng.cuda." + std::to_string(i), c.rng.cuda[i], {IValue("rng"), IValue("cuda"), IValue(int64_t(i))});
  }
  return state;
}

void save_dcp_checkpoint(const Checkpoint& c, const torch::nn::Module& module, const std::string& path,
                         ProcessGroup* group, ZeroRedundancyOptimizer* zero) {
  const dcp::State state = dcp_checkpoint_state(c, module, zero);
  if (group != nullptr) {
    dcp::save(state, path, *group);
  } else {
    dcp::save(state, path);
  }
}

std::string move_dcp_checkpoint_aside(const std::string& path, const std::string& problem) {
  for (int k = 0; k < 1000; ++k) {
    const std::string target = path + ".damaged" + (k == 0 ? "" : "." + std::to_string(k));
    if (detail::exists(target)) continue;
    if (::rename(path.c_str(), target.c_str()) == 0) return target;
    throw CheckpointError(detail::str_cat(problem, ". It cannot be moved aside to ", target, " (", std::strerror(errno),
                                          "), and training that epoch again would be refused. Move it away ",
                                          "yourself, then resume."));
  }
  throw CheckpointError(detail::str_cat(problem, ". It cannot be moved aside: ", path,
                                        ".damaged .. .999 exist. Clear them away, then resume."));
}

std::optional<Checkpoint> load_latest_dcp_checkpoint(const std::string& dir, const torch::nn::Module& module,
                                                     ProcessGroup* group, std::vector<SkippedCheckpoint>* skipped) {
  std::vector<int64_t> epochs;
  for (const std::string& name : detail::list_directory(dir)) {
    const int64_t epoch = epoch_of(name);
    if (epoch >= 0 && detail::is_directory(dir + "/" + name)) epochs.push_back(epoch);
  }
  std::sort(epochs.rbegin(), epochs.rend());
  int64_t newest = -1;
  for (int64_t epoch : epochs) {
    const std::string path = dcp_checkpoint_path(dir, epoch);
    // One planted by another user in a shared root is not read at all (owned_directory.h).
    std::string problem = detail::planted_entry_problem(path);
    if (problem.empty()) problem = dcp::checkpoint_problem(path);
    if (problem.empty()) {
      newest = epoch;
      break;
    }
    if (skipped != nullptr) skipped->push_back({path, problem});
  }
  if (group != nullptr) {  // the same epoch everywhere: the oldest of the ranks' newest
    at::Tensor t = at::full({1}, newest < 0 ? INT64_MAX : newest, at::kLong).to(group->device());
    group->all_reduce(t, ReduceOp::kMin)->wait();
    newest = t.cpu().item<int64_t>();
    if (newest == INT64_MAX) newest = -1;
  }
  if (newest < 0) return std::nullopt;
  const std::string path = dcp_checkpoint_path(dir, newest);
  const dcp::State state = group != nullptr ? dcp::load_all(path, *group) : dcp::load_all(path);
  Checkpoint c;
  c.path = path;
  c.optimizer = dcp::optimizer_state_of(state, "optim", parameter_names(module));
  for (const auto& e : state.entries()) {
    if (e.path.empty() || !e.path[0].isString()) continue;
    const std::string& head = e.path[0].toStringRef();
    if (head == "model" && e.path.size() == 2) c.model.insert(e.path[1].toStringRef(), e.boxes.at(0).local);
    if (head == "epoch" && e.value.isInt()) c.epoch = e.value.toInt();
    if (head == "progress" && e.path.size() == 2 && e.value.isInt())
      c.progress[e.path[1].toStringRef()] = e.value.toInt();
    if (head == "rng" && e.path.size() >= 2 && e.path[1].toStringRef() == "cpu") c.rng.cpu = e.boxes.at(0).local;
    if (head == "rng" && e.path.size() == 3 && e.path[1].toStringRef() == "cuda")
      c.rng.cuda.push_back(e.boxes.at(0).local);
  }
  if (c.optimizer.at("state").toGenericDict().empty() && c.optimizer.at("param_groups").toListRef().empty()) {
    c.optimizer = OptimizerState(c10::AnyType::get(), c10::AnyType::get());
  }
  // What agree_on_resume compares: the metadata's bytes, equal for the same checkpoint.
  std::ifstream in(path + "/.metadata", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  c.digest = detail::crc32(bytes.data(), bytes.size());
  return c;
}

}  // namespace datapar::train
