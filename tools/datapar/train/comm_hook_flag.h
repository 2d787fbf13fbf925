// --comm-hook: how --mode ddp's gradients cross the network (datapar/ddp/comm_hook.h,
// datapar/ddp/powersgd_hook.h).
#pragma once

#include <memory>
#include <string>

namespace datapar {
class CommHook;
}

namespace datapar::tools {

// The hook --comm-hook names: nullptr for allreduce (DDP's own), bf16_compress_hook(),
// fp16_compress_hook(), or powersgd_hook() for "powersgd:RANK[:START]" (PyTorch's defaults
// otherwise, its start_powerSGD_iter 1000 unless START). InvalidArgumentError, saying what
// is accepted, for anything else.
std::shared_ptr<CommHook> comm_hook_of(const std::string& flag);

}  // namespace datapar::tools
