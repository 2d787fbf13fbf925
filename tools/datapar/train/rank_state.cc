// See rank_state.h.
#include "rank_state.h"

#include <cstdio>
#include <exception>

#include "../train.h"
#include "datapar/error.h"
#include "file_system.h"

namespace datapar::tools {
namespace {

std::string rank_state_path(const TrainPlan& plan, const std::string& name, int64_t epoch) {
  return plan.options.checkpoint_dir + "/" + name + "-epoch-" + std::to_string(epoch) + "-rank-" +
         std::to_string(plan.rank) + ".pt";
}

}  // namespace

void save_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const StateDict& state) {
  if (plan.options.checkpoint_dir.empty()) return;
  save_state_dict(state, rank_state_path(plan, name, epoch));  // atomic
}

bool load_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const std::string& what,
                     const std::string& afresh, const std::function<void(const StateDict&)>& apply) {
  const std::string path = rank_state_path(plan, name, epoch);
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

}  // namespace datapar::tools
