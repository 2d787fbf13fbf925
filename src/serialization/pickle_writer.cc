// write_pickle. See pickle_writer.h; the format is in docs/checkpoint_format.md.
#include "serialization/pickle_writer.h"

#include <ATen/ATen.h>

#include <cstring>
#include <limits>

#include "datapar/error.h"
#include "serialization/pickle_limits.h"
#include "serialization/pickle_opcodes.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "datapar writes tensor bytes as they are in memory, and torch.save files are little-endian"
#endif

namespace datapar::detail {
namespace {

namespace op = pickle;

class Writer {
 public:
  explicit Writer(std::vector<at::Tensor>* storages) : storages_(storages) {}

  std::string finish(const c10::IValue& root) {
    put(op::kProto);
    put(uint8_t{2});
    value(root);
    put(op::kStop);
    return std::move(out_);
  }

 private:
  template <typename T>
  void put(T v) {  // little-endian fixed-size field
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void put(op::Op code) { out_.push_back(static_cast<char>(code)); }

  void string(const std::string& s) {
    DATAPAR_CHECK(s.size() <= std::numeric_limits<uint32_t>::max(), "torch_save: a string of ", s.size(), " bytes is too long to save");
    put(op::kBinUnicode);
    put(static_cast<uint32_t>(s.size()));
    out_ += s;
  }

  void global(const char* module, const std::string& name) {
    put(op::kGlobal);
    out_.append(module).append("\n").append(name).append("\n");
  }

  void integer(int64_t n) {  // the smallest encoding, as Python's pickler picks it
    if (n >= 0 && n <= 0xff) {
      put(op::kBinInt1);
      put(static_cast<uint8_t>(n));
    } else if (n >= 0 && n <= 0xffff) {
      put(op::kBinInt2);
      put(static_cast<uint16_t>(n));
    } else if (n >= std::numeric_limits<int32_t>::min() && n <= std::numeric_limits<int32_t>::max()) {
      put(op::kBinInt);
      put(static_cast<int32_t>(n));
    } else {
      put(op::kLong1);
      put(uint8_t{8});
      put(n);
    }
  }

  void real(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof d);
    put(op::kBinFloat);
    put(__builtin_bswap64(bits));  // pickle floats are big-endian
  }

  void ints(c10::IntArrayRef values) {
    put(op::kMark);
    for (int64_t v : values) integer(v);
    put(op::kTuple);
  }

  void tensor(const at::Tensor& original) {
    DATAPAR_CHECK(original.layout() == at::kStrided && !original.is_quantized(), "torch_save: cannot save a ",
                  original.layout(), original.is_quantized() ? " quantized" : "", " tensor; save a dense one (to_dense()).");
    at::Tensor t = original.detach();
    if (!t.device().is_cpu()) t = t.cpu();
    // A view shares a larger storage; save only its own elements. A contiguous view's are
    // the bytes from its data_ptr() on, which the archive's record takes as they are (an FSDP
    // shard of a flat buffer: no copy); another is copied in order first.
    if (!t.is_contiguous()) t = t.clone(at::MemoryFormat::Contiguous);
    const std::string key = std::to_string(storages_->size());
    storages_->push_back(t);

    global("torch._utils", "_rebuild_tensor_v2");
    put(op::kMark);
    put(op::kMark);  // persistent id: ('storage', torch.<Type>Storage, key, location, numel)
    string("storage");
    global("torch", std::string(c10::toString(t.scalar_type())) + "Storage");
    string(key);
    string("cpu");
    integer(t.numel());
    put(op::kTuple);
    put(op::kBinPersId);
    integer(0);  // storage offset
    ints(t.sizes());
    ints(t.strides());
    put(op::kNewFalse);  // requires_grad: state dicts hold detached tensors
    global("collections", "OrderedDict");  // backward hooks: none
    put(op::kEmptyTuple);
    put(op::kReduce);
    put(op::kTuple);
    put(op::kReduce);
  }

  // Entered for each dict, list and tuple. What the reader would refuse is not written, and
  // a container inside itself (possible in C++) ends here instead of in a stack overflow.
  struct Nested {
    explicit Nested(int& depth) : depth_(depth) {
      DATAPAR_CHECK(++depth_ <= kMaxPickleDepth, "torch_save: nesting deeper than ", kMaxPickleDepth,
                    " levels (datapar's limit for a checkpoint): is a dict or list inside itself? Save a value "
                    "without cycles, nested at most ", kMaxPickleDepth, " levels.");
    }
    ~Nested() { --depth_; }
    int& depth_;
  };

  void value(const c10::IValue& v) {
    if (v.isNone()) {
      put(op::kNone);
    } else if (v.isBool()) {
      put(v.toBool() ? op::kNewTrue : op::kNewFalse);
    } else if (v.isInt()) {
      integer(v.toInt());
    } else if (v.isDouble()) {
      real(v.toDouble());
    } else if (v.isString()) {
      string(v.toStringRef());
    } else if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isGenericDict()) {
      Nested nested(depth_);
      put(op::kEmptyDict);
      const auto dict = v.toGenericDict();
      if (dict.empty()) return;
      put(op::kMark);
      for (const auto& entry : dict) {
        const c10::IValue& key = entry.key();
        DATAPAR_CHECK(key.isString() || key.isInt() || key.isBool() || key.isDouble(), "torch_save: a dict key is a ",
                      key.tagKind(), "; use str, int, float or bool keys.");
        value(key);
        value(entry.value());
      }
      put(op::kSetItems);
    } else if (v.isList()) {
      Nested nested(depth_);
      put(op::kEmptyList);
      const auto list = v.toListRef();
      if (list.empty()) return;
      put(op::kMark);
      for (const c10::IValue& item : list) value(item);
      put(op::kAppends);
    } else if (v.isTuple()) {
      Nested nested(depth_);
      put(op::kMark);
      for (const c10::IValue& item : v.toTupleRef().elements()) value(item);
      put(op::kTuple);
    } else {
      DATAPAR_CHECK(false, "torch_save: cannot save a ", v.tagKind(),
                    "; save dicts, lists, tuples, numbers, strings and tensors.");
    }
  }

  std::vector<at::Tensor>* storages_;
  std::string out_;
  int depth_ = 0;  // containers entered
};

}  // namespace

std::string write_pickle(const c10::IValue& root, std::vector<at::Tensor>* storages) {
  return Writer(storages).finish(root);
}

}  // namespace datapar::detail
