// A collective's tensors in words. See tensor_description.h.
#include "process_group/tensor_description.h"

#include <sstream>

namespace datapar::detail {

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream out;
  out << dtype_name(t.scalar_type()) << "[";
  for (int64_t d = 0; d < t.dim(); ++d) out << (d ? ", " : "") << t.size(d);
  out << "]";
  return out.str();
}

std::string describe_tensors(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return "no tensors";
  const std::string first = describe_tensor(tensors.front());
  bool alike = true;
  for (const at::Tensor& t : tensors) alike = alike && describe_tensor(t) == first;
  if (alike) return tensors.size() == 1 ? first : first + " x" + std::to_string(tensors.size());
  std::string out;
  for (const at::Tensor& t : tensors) out += (out.empty() ? "" : ", ") + describe_tensor(t);
  return out;
}

}  // namespace datapar::detail
