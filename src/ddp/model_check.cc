#include "ddp/model_check.h"

#include <ATen/ATen.h>

#include <sstream>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void check_same_model(ProcessGroup& group, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::chrono::milliseconds timeout) {
  std::ostringstream mine;
  for (const auto& [name, t] : tensors) mine << name << " " << t.sizes() << " " << t.scalar_type() << "\n";
  const std::string text = mine.str();

  // Lengths first, then the texts padded to the longest.
  const int n = group.size();
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(at::zeros({1}, at::kLong));
  group.all_gather(lengths, at::full({1}, static_cast<int64_t>(text.size()), at::kLong))->wait(timeout);
  int64_t longest = 0;
  for (const at::Tensor& l : lengths) longest = std::max(longest, l.item<int64_t>());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::copy(text.begin(), text.end(), padded.data_ptr<uint8_t>());
  std::vector<at::Tensor> texts;
  for (int r = 0; r < n; ++r) texts.push_back(at::zeros({longest}, at::kByte));
  group.all_gather(texts, padded)->wait(timeout);

  std::vector<std::vector<std::string>> lines;
  for (int r = 0; r < n; ++r) {
    const auto* bytes = texts[r].data_ptr<uint8_t>();
    lines.push_back(split_lines(std::string(bytes, bytes + lengths[r].item<int64_t>())));
  }
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
