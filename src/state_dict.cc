// State dicts and their files. See state_dict.h.
#include "datapar/state_dict.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "datapar/error.h"

namespace datapar {
namespace {

const char kPrefix[] = "module.";

void add_module(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) out.insert(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) out.insert(prefix + b.key(), b.value());
  }
  for (const auto& child : module.named_children()) add_module(*child.value(), prefix + child.key() + ".", out);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  add_module(module, "", out);
  return out;
}

void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  bool prefixed = !state.is_empty();
  for (const auto& item : state) prefixed = prefixed && item.key().rfind(kPrefix, 0) == 0;
  const size_t strip = prefixed ? sizeof(kPrefix) - 1 : 0;

  StateDict target = state_dict(module);
  std::vector<std::string> unexpected;
  std::vector<std::string> loaded;
  at::NoGradGuard no_grad;
  for (const auto& item : state) {
    const std::string name = item.key().substr(strip);
    at::Tensor* dst = target.find(name);
    if (dst == nullptr) {
      unexpected.push_back(name);
      continue;
    }
    DATAPAR_CHECK(dst->sizes() == item.value().sizes(), "load_state_dict: ", name, " has shape ",
                  item.value().sizes(), " in the state dict but ", dst->sizes(), " in ", module.name(),
                  ". Load it into the model it was saved from.");
    dst->copy_(item.value());
    loaded.push_back(name);
  }
  if (!strict) return;
  std::vector<std::string> missing;
  for (const auto& item : target) {
    if (std::find(loaded.begin(), loaded.end(), item.key()) == loaded.end()) missing.push_back(item.key());
  }
  if (missing.empty() && unexpected.empty()) return;
  std::ostringstream msg;
  msg << "load_state_dict: the state dict does not match " << module.name() << ".";
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    msg << " " << what << ":";
    for (size_t i = 0; i < keys.size() && i < 10; ++i) msg << (i ? ", " : " ") << keys[i];
    if (keys.size() > 10) msg << " and " << keys.size() - 10 << " more";
    msg << ".";
  };
  list("Missing keys", missing);
  list("Unexpected keys", unexpected);
  msg << " Load a state dict of the same model, or pass strict=false to load the keys that match.";
  throw InvalidArgumentError(msg.str());
}

void save_state_dict(const StateDict& state, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& item : state) dict.insert(item.key(), item.value().detach().cpu());
  const std::vector<char> bytes = torch::jit::pickle_save(dict);

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(detail::str_cat(path, ": cannot create ", tmp, " (", errno_text(), "). Check that the directory exists and is writable."));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw CheckpointError(detail::str_cat(path, ": write failed after ", written, " of ", bytes.size(), " bytes (", why, "). Is the disk full?"));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw CheckpointError(detail::str_cat(path, ": could not flush ", tmp, " to disk (", why, ")."));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw CheckpointError(detail::str_cat(path, ": could not move ", tmp, " into place (", why, ")."));
  }
  // Make the rename itself durable: fsync the directory.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

StateDict load_state_dict_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(detail::str_cat(path, ": cannot open (", errno_text(), "). Check the path."));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw CheckpointError(detail::str_cat(path, ": not a readable state dict (", bytes.size(),
                                          " bytes; truncated, or not written by torch.save? A Python state dict must be saved as a plain",
                                          " dict: torch.save(dict(model.state_dict()), path)): ",
                                          e.what_without_backtrace()));
  }
  if (!value.isGenericDict()) {
    throw CheckpointError(detail::str_cat(path, ": holds a ", value.tagKind(), ", not a dict of tensors. Save model.state_dict(), not the model."));
  }
  StateDict state;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      throw CheckpointError(detail::str_cat(path, ": entry ", entry.key(), " is not a named tensor; expected a state dict."));
    }
    state.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  return state;
}

}  // namespace datapar
