// DATAPAR_DISTRIBUTED_DEBUG=DETAIL: every collective's call checked across the group before it
// runs (ProcessGroup::check_same_call), as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL does with a
// wrapper group. A mismatched collective otherwise hangs, or moves one collective's bytes into
// another's tensors (a rank once read them as DDP's bucket metadata and died in
// vector::_M_range_check): here it is an error on every rank, naming each rank's call.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/process_group.h"
#include "process_group/work_completion.h"

namespace datapar {

void ProcessGroup::check_same_call(const std::string& what, const std::string& tensors) {
  constexpr int64_t kBytes = 256;  // the call, cut short beyond: enough to tell calls apart
  const std::string call = tensors.empty() ? what : what + " on " + tensors;
  at::Tensor mine = at::zeros({kBytes}, at::kByte);
  std::memcpy(mine.data_ptr(), call.data(), std::min<size_t>(call.size(), kBytes - 1));
  const at::TensorOptions options = at::TensorOptions().dtype(at::kByte).device(device());
  if (!device().is_cpu()) mine = mine.to(device());
  std::vector<at::Tensor> calls;
  for (int r = 0; r < size(); ++r) calls.push_back(at::empty({kBytes}, options));
  const std::string check = "the DETAIL check before " + what;
  try {
    do_all_gather(check, calls, mine)->synchronize(timeout_ + std::min(timeout_, kWaitGrace));
  } catch (...) {
    std::rethrow_exception(detail::as_datapar_error(describe(check), std::current_exception()));
  }
  std::vector<std::pair<std::string, std::vector<int>>> ranks_of;  // each call, in the order of its first rank
  for (int r = 0; r < size(); ++r) {
    const at::Tensor bytes = calls[r].cpu();
    const std::string c(reinterpret_cast<const char*>(bytes.data_ptr()));
    const auto same = std::find_if(ranks_of.begin(), ranks_of.end(), [&](const auto& k) { return k.first == c; });
    if (same == ranks_of.end()) {
      ranks_of.push_back({c, {r}});
    } else {
      same->second.push_back(r);
    }
  }
  if (ranks_of.size() == 1) return;
  std::string text;
  for (const auto& [c, ranks] : ranks_of) {
    text += text.empty() ? "" : "; ";
    text += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
    text += " called " + c;
  }
  throw InvalidArgumentError(detail::str_cat(
      "DATAPAR_DISTRIBUTED_DEBUG=DETAIL: the ranks of this ", label(), " group of ", size(),
      " called different collectives: ", text, " (this is rank ", rank(),
      "). Every rank must call the same collectives, with the same dtypes and sizes, in the same order: find where "
      "the program takes another path on one of them."));
}

}  // namespace datapar
