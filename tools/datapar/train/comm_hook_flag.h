// --comm-hook and --sync-every: how --mode ddp's gradients (or models) cross the network
// (datapar/ddp/comm_hook.h, datapar/ddp/powersgd_hook.h, datapar/diloco/diloco.h).
#pragma once

#include <memory>
#include <string>

#include <cstdint>

namespace datapar {
class CommHook;
class PowerSgdHook;
}

namespace datapar::tools {

// The hook --comm-hook names: nullptr for allreduce (DDP's own), bf16_compress_hook(),
// fp16_compress_hook(), or powersgd_hook() for "powersgd:RANK[:START]" (PyTorch's defaults
// otherwise, its start_powerSGD_iter 1000 unless START). InvalidArgumentError, saying what
// is accepted, for anything else.
std::shared_ptr<CommHook> comm_hook_of(const std::string& flag);

struct TrainPlan;
struct TrainOptions;
enum class Mode;

// --comm-hook's and --sync-every's checks, before the job starts (InvalidArgumentError).
void check_communication_flags(const TrainOptions& o, Mode mode);

// PowerSGD's state is each rank's own (its errors): every rank writes it beside the
// checkpoint of `epoch` epochs, as powersgd-epoch-<E>-rank-<R>.pt in --checkpoint-dir
// (written whole or not at all), and a resumed rank reads its own; without one it says so
// and starts PowerSGD's errors and warm start afresh.
void save_powersgd_state(const TrainPlan& plan, const PowerSgdHook& hook, int64_t epoch);
void load_powersgd_state(const TrainPlan& plan, PowerSgdHook& hook, int64_t epoch);

}  // namespace datapar::tools
