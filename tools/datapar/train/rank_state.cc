// See rank_state.h.
#include "rank_state.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <map>

#include "../train.h"
#include "datapar/error.h"
#include "file_system.h"

namespace datapar::tools {
namespace {

std::string rank_state_path(const TrainPlan& plan, const std::string& name, int64_t epoch, int rank) {
  return plan.options.checkpoint_dir + "/" + name + "-epoch-" + std::to_string(epoch) + "-rank-" +
         std::to_string(rank < 0 ? plan.rank : rank) + ".pt";
}

}  // namespace

void save_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const StateDict& state,
                     int rank) {
  if (plan.options.checkpoint_dir.empty()) return;
  save_state_dict(state, rank_state_path(plan, name, epoch, rank));  // atomic
}

bool load_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const std::string& what,
                     const std::string& afresh, const std::function<void(const StateDict&)>& apply, int rank) {
  const std::string path = rank_state_path(plan, name, epoch, rank);
  if (!detail::exists(path)) {
    std::fprintf(stderr, "datapar train: rank %d: no %s state beside the checkpoint of epoch %ld (%s): %s begin "
                 "afresh\n", plan.rank, what.c_str(), static_cast<long>(epoch), path.c_str(), afresh.c_str());
    return false;
  }
  try {
    apply(load_state_dict_file(path));
    return true;
  } catch (const std::exception& e) {
    throw InvalidArgumentError("datapar train: " + path + " is not " + what + "'s state (" + e.what() +
                               ").\n---> HINT: delete it to start " + afresh + " afresh, or resume from another "
                               "checkpoint.");
  }
}

void save_scaler_state(const TrainPlan& plan, const amp::GradScaler& scaler, int64_t epoch, int rank) {
  StateDict state;
  for (const auto& [key, value] : scaler.state_dict()) state.insert(key, at::scalar_tensor(value, at::kDouble));
  save_rank_state(plan, "grad-scaler", epoch, state, rank);
}

void load_scaler_state(const TrainPlan& plan, amp::GradScaler& scaler, int64_t epoch, int rank) {
  load_rank_state(
      plan, "grad-scaler", epoch, "GradScaler", "the scale and its growth count",
      [&scaler](const StateDict& state) {
        std::map<std::string, double> values;
        for (const auto& item : state) values[item.key()] = item.value().item<double>();
        scaler.load_state_dict(values);
      },
      rank);
}

}  // namespace datapar::tools
