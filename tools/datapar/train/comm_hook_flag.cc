// See comm_hook_flag.h.
#include "comm_hook_flag.h"

#include <cstdint>
#include <cstdio>
#include <exception>
#include <sstream>

#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/powersgd_hook.h"
#include "datapar/error.h"
#include "datapar/state_dict.h"
#include "file_system.h"
#include "../train.h"

namespace datapar::tools {

std::shared_ptr<CommHook> comm_hook_of(const std::string& flag) {
  if (flag == "allreduce") return nullptr;
  if (flag == "bf16") return bf16_compress_hook();
  if (flag == "fp16") return fp16_compress_hook();
  const std::string hint = "\n---> HINT: use allreduce (the default), bf16, fp16 or powersgd:RANK[:START], e.g. "
                           "powersgd:4 (PyTorch's powerSGD_hook at rank 4).";
  DATAPAR_CHECK(flag.rfind("powersgd:", 0) == 0, "--comm-hook \"", flag, "\" is not a communication hook.", hint);
  std::istringstream fields(flag.substr(9));
  PowerSgdOptions options;
  int64_t rank = 0;
  char colon = 0;
  bool ok = static_cast<bool>(fields >> rank) && rank >= 1 && rank <= 1024;
  if (ok && fields >> colon) ok = colon == ':' && fields >> options.start_iter && options.start_iter >= 2;
  ok = ok && fields.eof();
  DATAPAR_CHECK(ok, "--comm-hook \"", flag, "\": PowerSGD takes a rank from 1 to 1024 and, after it, the steps of ",
                "plain all-reduce first (at least 2).", hint);
  options.matrix_approximation_rank = static_cast<int>(rank);
  return powersgd_hook(options);
}

namespace {

std::string powersgd_state_path(const TrainPlan& plan, int64_t epoch) {
  return plan.options.checkpoint_dir + "/powersgd-epoch-" + std::to_string(epoch) + "-rank-" +
         std::to_string(plan.rank) + ".pt";
}

}  // namespace

void save_powersgd_state(const TrainPlan& plan, const PowerSgdHook& hook, int64_t epoch) {
  if (plan.options.checkpoint_dir.empty()) return;
  const std::string path = powersgd_state_path(plan, epoch), part = path + ".part";
  save_state_dict(hook.state_dict(), part);
  DATAPAR_CHECK(std::rename(part.c_str(), path.c_str()) == 0, "datapar train: cannot rename ", part, " to ", path,
                ".");
}

void load_powersgd_state(const TrainPlan& plan, PowerSgdHook& hook, int64_t epoch) {
  const std::string path = powersgd_state_path(plan, epoch);
  if (!detail::exists(path)) {
    std::fprintf(stderr, "datapar train: rank %d: no PowerSGD state beside the checkpoint of epoch %ld (%s): its "
                 "errors and warm start begin afresh\n", plan.rank, static_cast<long>(epoch), path.c_str());
    return;
  }
  try {
    hook.load_state_dict(load_state_dict_file(path));
  } catch (const std::exception& e) {
    throw InvalidArgumentError("datapar train: " + path + " is not PowerSGD's state (" + e.what() +
                               ").\n---> HINT: delete it to start PowerSGD's errors afresh, or resume from another "
                               "checkpoint.");
  }
}

}  // namespace datapar::tools
