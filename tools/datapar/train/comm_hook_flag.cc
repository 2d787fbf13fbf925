// See comm_hook_flag.h.
#include "comm_hook_flag.h"

#include <cstdint>
#include <sstream>

#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/powersgd_hook.h"
#include "datapar/error.h"

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

}  // namespace datapar::tools
