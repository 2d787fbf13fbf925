// See comm_hook_flag.h.
#include "comm_hook_flag.h"

#include <cmath>
#include <cstdint>
#include <sstream>

#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/powersgd_hook.h"
#include "datapar/error.h"
#include "../train.h"
#include "rank_state.h"

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

void check_communication_flags(const TrainOptions& o, Mode mode) {
  comm_hook_of(o.comm_hook);  // a bad value stops here
  DATAPAR_CHECK(o.comm_hook == "allreduce" || (mode == Mode::kDdp && !o.fault_tolerant), "--comm-hook is ddp's ",
                "reduction of the gradients; --mode ", o.mode, o.fault_tolerant ? " --fault-tolerant" : "",
                " reduces them its own way.\n---> HINT: use --mode ddp without --fault-tolerant, or leave it out.");
  DATAPAR_CHECK(o.outer_optimizer == "nesterov" || o.outer_optimizer == "replace", "--outer-optimizer: \"",
                o.outer_optimizer, "\" is not an outer step.\n---> HINT: use nesterov (DiLoCo) or replace (local SGD).");
  DATAPAR_CHECK(o.outer_lr > 0 && std::isfinite(o.outer_lr) && o.outer_momentum >= 0 && o.outer_momentum < 1,
                "--outer-lr ", o.outer_lr, " --outer-momentum ", o.outer_momentum,
                ": use a positive, finite rate and a momentum in [0, 1).");
  DATAPAR_CHECK(o.outer_dtype == "float32" || o.outer_dtype == "bf16" || o.outer_dtype == "int8", "--outer-dtype: \"",
                o.outer_dtype, "\" is not one.\n---> HINT: use float32, bf16 or int8.");
  DATAPAR_CHECK(o.fragments >= 1 && (o.sync_every == 0 || o.fragments <= o.sync_every), "--fragments ", o.fragments,
                " with --sync-every ", o.sync_every, ": each fragment syncs at a step of its own.\n---> HINT: use 1 to ",
                "--sync-every fragments.");
  DATAPAR_CHECK(o.sync_every > 0 || (o.fragments == 1 && o.outer_dtype == "float32"),
                "--fragments and --outer-dtype shape --sync-every's averaging.\n---> HINT: add --sync-every N.");
  if (o.sync_every == 0) return;
  DATAPAR_CHECK((mode == Mode::kDdp || (mode == Mode::kHsdp && !o.fault_tolerant)) && !o.zero &&
                    o.comm_hook == "allreduce" && o.balance == "even",
                "--sync-every trains each replica alone between averages: a rank (--mode ddp, without --zero, "
                "--comm-hook or --balance; under --fault-tolerant too) or a shard group (--mode hsdp, not under "
                "--fault-tolerant); --mode ", o.mode, o.fault_tolerant ? " --fault-tolerant" : "",
                " is not that.\n---> HINT: use --mode ddp, or --mode hsdp to shard within a machine and average "
                "across machines (--mode fsdp and --zero shard over the whole job: one replica, nothing to average).");
  DATAPAR_CHECK(!o.fault_tolerant || o.fragments == 1, "--fragments ", o.fragments,
                " under --fault-tolerant: fault tolerance takes whole DiLoCo rounds; Streaming DiLoCo (--fragments "
                "above 1) is not supported under it yet.\n---> HINT: leave out --fragments (1, the default).");
}

void save_powersgd_state(const TrainPlan& plan, const PowerSgdHook& hook, int64_t epoch) {
  save_rank_state(plan, "powersgd", epoch, hook.state_dict());
}

void load_powersgd_state(const TrainPlan& plan, PowerSgdHook& hook, int64_t epoch) {
  load_rank_state(plan, "powersgd", epoch, "PowerSGD", "its errors and warm start",
                  [&](const StateDict& state) { hook.load_state_dict(state); });
}

}  // namespace datapar::tools
