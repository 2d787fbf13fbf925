#include "ddp/model_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"

namespace datapar::detail {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void check_same_model(ProcessGroup& group, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::ostringstream mine;
  for (const auto& [name, t] : tensors) mine << name << " " << t.sizes() << " " << t.scalar_type() << "\n";
  const std::string text = mine.str();

  // Lengths first, then the texts padded to the longest.
  const int n = group.size();
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(metadata_zeros(group, 1, at::kLong));
  // synchronize(), not wait(): the host reads and acts on the results (work.h).
  group.all_gather(lengths, metadata_tensor(group, std::vector<int64_t>{static_cast<int64_t>(text.size())}))
      ->synchronize();
  std::vector<int64_t> length_of;
  for (const at::Tensor& l : lengths) length_of.push_back(host_int64s(l).front());
  const int64_t longest = *std::max_element(length_of.begin(), length_of.end());
  std::vector<at::Tensor> texts;
  for (int r = 0; r < n; ++r) texts.push_back(metadata_zeros(group, longest, at::kByte));
  group.all_gather(texts, metadata_text(group, text, longest))->synchronize();

  std::vector<std::vector<std::string>> lines;
  for (int r = 0; r < n; ++r) lines.push_back(split_lines(host_text(texts[r], length_of[r])));
  size_t first = SIZE_MAX;
  for (int r = 1; r < n; ++r) {
    size_t i = 0;
    while (i < lines[0].size() && i < lines[r].size() && lines[0][i] == lines[r][i]) ++i;
    if (i < lines[0].size() || i < lines[r].size()) first = std::min(first, i);
  }
  if (first == SIZE_MAX) return;
  auto entry = [&](int r) {
    return first < lines[r].size() ? "'" + lines[r][first] + "'" : std::string("nothing (") +
                                                                       std::to_string(lines[r].size()) + " entries)";
  };
  std::ostringstream message;
  message << "DistributedDataParallel: the model differs between ranks at parameter/buffer #" << first
          << ": rank 0 has " << entry(0);
  for (int r = 1; r < n; ++r) {
    if (entry(r) != entry(0)) message << "; rank " << r << " has " << entry(r);
  }
  message << ". Every rank must build the same model (same layers, shapes and dtypes) before wrapping it.";
  throw InvalidArgumentError(message.str());
}

}  // namespace datapar::detail
