// See broadcast_param_states.h.
#include "optim/broadcast_param_states.h"

#include <ATen/ATen.h>

#include "datapar/process_group/metadata.h"
#include "trace/recorder.h"

namespace datapar::detail {

std::map<size_t, std::unique_ptr<torch::optim::OptimizerParamState>> broadcast_param_states(
    ProcessGroup& group, OptimizerKind kind, const std::vector<at::Tensor>& params, const ParamStateMoves& moves,
    const std::function<const torch::optim::OptimizerParamState*(size_t)>& held) {
  std::map<size_t, std::unique_ptr<torch::optim::OptimizerParamState>> kept;
  const int rank = group.rank();
  for (int source = 0; source < group.size(); ++source) {
    std::vector<size_t> states, values;
    for (size_t p = 0; p < params.size(); ++p) {
      if (moves.source[p] != source) continue;
      if (moves.state[p]) states.push_back(p);
      if (moves.value[p]) values.push_back(p);
    }
    if (states.empty() && values.empty()) continue;
    // Note [Moving optimizer state]
    std::vector<ParamStateMeta> meta(states.size());
    if (!states.empty()) {
      std::vector<int64_t> words;
      for (size_t p : states) {
        for (int64_t v : param_state_meta(kind, rank == source ? held(p) : nullptr)) words.push_back(v);
      }
      at::Tensor on_group = metadata_tensor(group, words);
      group.broadcast(on_group, source)->synchronize();  // read on the host
      const std::vector<int64_t> read = host_int64s(on_group);
      for (size_t j = 0; j < states.size(); ++j) meta[j] = {read[3 * j], read[3 * j + 1], read[3 * j + 2]};
    }
    // Detached: the backend writes into them on its own thread, where grad mode is on.
    std::vector<at::Tensor> tensors;
    for (size_t p : values) tensors.push_back(params[p].detach());
    for (size_t j = 0; j < states.size(); ++j) {
      const size_t p = states[j];
      if (rank == source) {
        if (meta[j][0]) {
          for (const at::Tensor& t : param_state_tensors(kind, *held(p))) tensors.push_back(t.detach());
        }
      } else {
        for (size_t t = 0; t < param_state_tensor_count(kind, meta[j]); ++t) tensors.push_back(at::empty_like(params[p]));
      }
    }
    int64_t bytes = 0;
    for (const at::Tensor& t : tensors) bytes += static_cast<int64_t>(t.nbytes());
    if (!tensors.empty()) {
      const trace::detail::CollectiveLabel label("optimizer state", source, bytes);
      group.broadcast_coalesced(tensors, source)->wait();
    }
    if (rank == source) continue;
    size_t next = values.size();
    for (size_t j = 0; j < states.size(); ++j) {
      const size_t n = param_state_tensor_count(kind, meta[j]);
      const std::vector<at::Tensor> own(tensors.begin() + static_cast<std::ptrdiff_t>(next),
                                        tensors.begin() + static_cast<std::ptrdiff_t>(next + n));
      next += n;
      if (n > 0 && moves.keep[states[j]]) kept[states[j]] = make_param_state(kind, meta[j], own);
    }
  }
  return kept;
}

}  // namespace datapar::detail
