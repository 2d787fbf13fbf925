// See trajectory_flags.h.
#include "trajectory_flags.h"

#include <cstdio>
#include <map>
#include <sstream>

#include "datapar/error.h"

namespace datapar::tools {
namespace {

// "%.17g": a double's exact value, the same text on every host.
std::string exact(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

std::string serialize(const std::vector<std::pair<std::string, std::string>>& flags) {
  std::string out;
  for (const auto& [flag, value] : flags) out += flag + '\t' + value + '\n';
  return out;
}

std::map<std::string, std::string> parse(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> trajectory_flags(const TrainPlan& plan, int64_t train_samples) {
  const TrainOptions& o = plan.options;
  return {
      {"--mode", o.mode},
      {"--model", o.model},
      {"--batch-size (after --scale-lr)", std::to_string(plan.global_batch)},
      {"--lr (after --scale-lr)", exact(plan.lr)},
      {"--optimizer", o.optimizer},
      {"--momentum", exact(o.momentum)},
      {"--weight-decay", exact(plan.weight_decay)},
      {"--seed", std::to_string(o.seed)},
      {"--epochs", std::to_string(o.epochs)},
      {"--limit", std::to_string(o.limit)},
      {"--data (training samples)", std::to_string(train_samples)},
      {"--zero", o.zero ? "on" : "off"},
      {"--mp", o.mp},
      {"--amp", o.amp},
      {"--checkpoint-activations", o.checkpoint_activations ? "on" : "off"},
      {"the job's size (--nnodes x --nproc-per-node)", std::to_string(plan.world_size)},
  };
}

void check_same_trajectory(Store& store, const std::string& key,
                           const std::vector<std::pair<std::string, std::string>>& flags) {
  const std::string mine = serialize(flags);
  const std::string first = as_text(store.compare_set(key, {}, Bytes(mine.begin(), mine.end())));
  if (first == mine) return;
  const std::map<std::string, std::string> theirs = parse(first);
  std::string differ;
  for (const auto& [flag, value] : flags) {
    const auto it = theirs.find(flag);
    const std::string other = it == theirs.end() ? "(not given)" : it->second;
    if (other != value) differ += detail::str_cat(differ.empty() ? "" : "; ", flag, " is ", value, " here, ", other, " there");
  }
  throw InvalidArgumentError(detail::str_cat(
      "--fault-tolerant: this worker's training differs from the job's (the first worker's): ",
      differ.empty() ? "its flags are another version's" : differ,
      ". Every worker of a fault-tolerant job must train the same thing: give every node the same `datapar train` "
      "flags."));
}

}  // namespace datapar::tools
