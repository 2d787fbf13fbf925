// read_pickle. See pickle_reader.h; the format is in docs/checkpoint_format.md.
#include "serialization/pickle_reader.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "serialization/pickle_opcodes.h"

namespace datapar::detail {
namespace {

namespace op = pickle;

// A value on the machine's stack. Most are IValues; a class or function named by GLOBAL
// and a tuple holding one (torch.save's persistent ids hold torch.FloatStorage) have no
// IValue form, so they stay Items until a call consumes them.
struct Item {
  enum class Kind { kValue, kGlobal, kTuple };
  Kind kind = Kind::kValue;
  c10::IValue value;
  std::string name;            // kGlobal: "module.name"
  std::vector<Item> elements;  // kTuple
};

Item value_item(c10::IValue v) {
  Item item;
  item.value = std::move(v);
  return item;
}

const at::ScalarType kStorageTypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong,
                                        at::kInt,   at::kShort,  at::kChar, at::kByte,     at::kBool,
                                        at::kComplexFloat, at::kComplexDouble};

class Machine {
 public:
  Machine(const char* data, size_t size, const StorageLoader& load) : data_(data), size_(size), load_(load) {}

  c10::IValue run() {
    while (true) {
      const size_t at = pos_;
      const uint8_t code = read<uint8_t>();
      if (code == op::kStop) break;
      step(code, at);
    }
    if (stack_.size() != 1) fail("the program ends with ", stack_.size(), " values on the stack instead of 1");
    return to_ivalue(stack_.back());
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw CheckpointError(str_cat("data.pkl: ", args..., " at byte ", pos_, " of ", size_));
  }

  template <typename T>
  T read() {  // little-endian fixed-size field
    if (size_ - pos_ < sizeof(T)) fail("the pickle ends early (truncated?)");
    T out;
    std::memcpy(&out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return out;
  }

  std::string read_bytes(size_t n) {
    if (size_ - pos_ < n) fail("a ", n, "-byte string runs past the end (truncated?)");
    std::string out(data_ + pos_, n);
    pos_ += n;
    return out;
  }

  std::string read_line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (nl == nullptr) fail("a GLOBAL name has no end (truncated?)");
    const size_t n = static_cast<const char*>(nl) - (data_ + pos_);
    std::string out = read_bytes(n);
    ++pos_;
    return out;
  }

  Item pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("stack underflow");
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }

  Item& top() {
    if (stack_.empty()) fail("stack underflow");
    return stack_.back();
  }

  std::vector<Item> pop_to_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + mark), std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  c10::IValue to_ivalue(const Item& item) const {
    switch (item.kind) {
      case Item::Kind::kValue:
        return item.value;
      case Item::Kind::kTuple: {
        std::vector<c10::IValue> elements;
        for (const Item& e : item.elements) elements.push_back(to_ivalue(e));
        return c10::ivalue::Tuple::create(std::move(elements));
      }
      case Item::Kind::kGlobal:
        break;
    }
    fail("the Python object ", item.name, " is stored as data; datapar reads only dicts, lists, tuples, numbers, strings and tensors");
  }

  Item tuple_item(std::vector<Item> elements) {
    Item item;
    item.kind = Item::Kind::kTuple;
    item.elements = std::move(elements);
    return item;
  }

  c10::impl::GenericDict dict_at(Item& item, const char* opcode) {
    if (item.kind != Item::Kind::kValue || !item.value.isGenericDict()) fail(opcode, " on something that is not a dict");
    return item.value.toGenericDict();
  }

  void set_items(std::vector<Item> kv, const char* opcode) {
    if (kv.size() % 2 != 0) fail(opcode, " with an odd number of keys and values");
    auto dict = dict_at(top(), opcode);
    for (size_t i = 0; i < kv.size(); i += 2) {
      c10::IValue key = to_ivalue(kv[i]);
      if (!key.isString() && !key.isInt() && !key.isBool() && !key.isDouble()) {
        fail("a dict key is a ", key.tagKind(), "; only str, int, float and bool keys are read");
      }
      dict.insert_or_assign(std::move(key), to_ivalue(kv[i + 1]));
    }
  }

  void append(std::vector<Item> items, const char* opcode) {
    Item& target = top();
    if (target.kind != Item::Kind::kValue || !target.value.isList()) fail(opcode, " on something that is not a list");
    auto list = target.value.toList();
    for (const Item& item : items) list.push_back(to_ivalue(item));
  }

  int64_t int_arg(const Item& item, const char* what) {
    if (item.kind != Item::Kind::kValue || !item.value.isInt()) fail(what, " is not an int");
    return item.value.toInt();
  }

  std::vector<int64_t> ints_arg(const Item& item, const char* what) {
    std::vector<int64_t> out;
    if (item.kind == Item::Kind::kTuple) {
      for (const Item& e : item.elements) out.push_back(int_arg(e, what));
    } else if (item.kind == Item::Kind::kValue && item.value.isTuple()) {
      for (const auto& e : item.value.toTupleRef().elements()) out.push_back(int_arg(value_item(e), what));
    } else {
      fail(what, " is not a tuple of ints");
    }
    return out;
  }

  // storage: a flat (numel,) tensor from persistent_load. Checks the view fits in it.
  at::Tensor rebuild_tensor(const std::vector<Item>& args) {
    if (args.size() < 4) fail("_rebuild_tensor_v2 with ", args.size(), " arguments");
    if (args[0].kind != Item::Kind::kValue || !args[0].value.isTensor()) fail("a tensor's storage is not a persistent storage");
    const at::Tensor storage = args[0].value.toTensor();
    const int64_t offset = int_arg(args[1], "a tensor's storage offset");
    const std::vector<int64_t> sizes = ints_arg(args[2], "a tensor's size");
    const std::vector<int64_t> strides = ints_arg(args[3], "a tensor's stride");
    if (sizes.size() != strides.size()) fail("a tensor has ", sizes.size(), " sizes but ", strides.size(), " strides");
    int64_t extent = 1;  // elements the view reaches, from `offset`
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 0 || strides[d] < 0) fail("a tensor has a negative size or stride");
      if (sizes[d] == 0) extent = 0;
      if (extent != 0) extent += (sizes[d] - 1) * strides[d];
    }
    if (offset < 0 || (extent > 0 && offset + extent > storage.numel())) {
      fail("a tensor of size ", c10::IntArrayRef(sizes), " at offset ", offset, " does not fit its storage of ",
           storage.numel(), " elements");
    }
    return at::empty({0}, storage.options()).set_(storage.storage(), offset, sizes, strides);
  }

  Item call(const std::string& fn, std::vector<Item> args) {
    if (fn == "collections.OrderedDict") {
      if (!args.empty()) fail("OrderedDict built from arguments");
      return value_item(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
    }
    if (fn == "torch._utils._rebuild_tensor_v2" || fn == "torch._utils._rebuild_tensor") {
      return value_item(rebuild_tensor(args));  // requires_grad and hooks are dropped
    }
    if (fn == "torch._utils._rebuild_parameter" || fn == "torch._utils._rebuild_parameter_with_state" ||
        fn == "torch.jit._pickle.restore_type_tag" || fn == "torch.jit._pickle.build_intlist" ||
        fn == "torch.jit._pickle.build_doublelist" || fn == "torch.jit._pickle.build_boollist" ||
        fn == "torch.jit._pickle.build_tensorlist") {
      // A Parameter reads as its data; libtorch's type-tag wrappers return their argument.
      if (args.empty()) fail(fn, " without arguments");
      return std::move(args[0]);
    }
    const bool scripted = fn.rfind("__torch__.", 0) == 0;
    fail("the file calls ", fn, ", which datapar does not read",
         scripted ? " (a TorchScript archive from torch.jit.save? Save model.state_dict() with torch.save)"
                  : " (it reads state dicts and checkpoints: dicts, lists, numbers, strings and tensors)");
  }

  // torch.save's persistent id: ('storage', torch.<Type>Storage, key, location, numel).
  Item persistent_load(const Item& pid) {
    const auto& e = pid.elements;
    if (pid.kind != Item::Kind::kTuple || e.size() != 5 || e[0].kind != Item::Kind::kValue ||
        !e[0].value.isString() || e[0].value.toStringRef() != "storage" || e[1].kind != Item::Kind::kGlobal ||
        e[2].kind != Item::Kind::kValue || !e[2].value.isString()) {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    const std::string& type_name = e[1].name;
    const std::string prefix = "torch.";
    const std::string suffix = "Storage";
    at::ScalarType dtype = at::kByte;
    const bool named = type_name.size() > prefix.size() + suffix.size() && type_name.rfind(prefix, 0) == 0 &&
                       type_name.compare(type_name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string short_name =
        named ? type_name.substr(prefix.size(), type_name.size() - prefix.size() - suffix.size()) : "";
    if (short_name != "Untyped" && !scalar_type_from_storage_name(short_name, &dtype)) {
      fail("storage type ", type_name, " is not one datapar reads");
    }
    const std::string& key = e[2].value.toStringRef();
    const int64_t numel = int_arg(e[4], "a storage's size");
    auto it = storages_.find(key);
    if (it == storages_.end()) it = storages_.emplace(key, load_(key, dtype, numel)).first;
    if (it->second.scalar_type() != dtype) fail("storage ", key, " is read as two different types");
    return value_item(it->second);
  }

  void step(uint8_t code, size_t at) {
    switch (code) {
      case op::kProto: read<uint8_t>(); break;
      case op::kFrame: read<uint64_t>(); break;
      case op::kMark: marks_.push_back(stack_.size()); break;
      case op::kPop: pop(); break;
      case op::kPopMark: pop_to_mark(); break;
      case op::kDup: stack_.push_back(top()); break;
      case op::kNone: stack_.push_back(value_item(c10::IValue())); break;
      case op::kNewTrue: stack_.push_back(value_item(true)); break;
      case op::kNewFalse: stack_.push_back(value_item(false)); break;
      case op::kBinInt: stack_.push_back(value_item(static_cast<int64_t>(read<int32_t>()))); break;
      case op::kBinInt1: stack_.push_back(value_item(static_cast<int64_t>(read<uint8_t>()))); break;
      case op::kBinInt2: stack_.push_back(value_item(static_cast<int64_t>(read<uint16_t>()))); break;
      case op::kLong1: {
        const uint8_t n = read<uint8_t>();
        if (n > 8) fail("an integer of ", int(n), " bytes (datapar reads up to 64 bits)");
        const std::string bytes = read_bytes(n);
        uint64_t v = 0;
        for (size_t i = 0; i < n; ++i) v |= uint64_t(uint8_t(bytes[i])) << (8 * i);
        if (n > 0 && n < 8 && (uint8_t(bytes[n - 1]) & 0x80)) v |= ~uint64_t(0) << (8 * n);  // sign-extend
        stack_.push_back(value_item(static_cast<int64_t>(v)));
        break;
      }
      case op::kBinFloat: {
        uint64_t bits = read<uint64_t>();
        bits = __builtin_bswap64(bits);  // pickle floats are big-endian
        double d;
        std::memcpy(&d, &bits, sizeof d);
        stack_.push_back(value_item(d));
        break;
      }
      case op::kBinUnicode: stack_.push_back(value_item(read_bytes(read<uint32_t>()))); break;
      case op::kShortBinUnicode: stack_.push_back(value_item(read_bytes(read<uint8_t>()))); break;
      case op::kEmptyDict: stack_.push_back(value_item(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()))); break;
      case op::kEmptyList: stack_.push_back(value_item(c10::impl::GenericList(c10::AnyType::get()))); break;
      case op::kEmptyTuple: stack_.push_back(tuple_item({})); break;
      case op::kTuple: stack_.push_back(tuple_item(pop_to_mark())); break;
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        std::vector<Item> elements(code - op::kTuple1 + 1);
        for (size_t i = elements.size(); i-- > 0;) elements[i] = pop();
        stack_.push_back(tuple_item(std::move(elements)));
        break;
      }
      case op::kSetItem: {
        Item value = pop();
        Item key = pop();
        set_items({std::move(key), std::move(value)}, "SETITEM");
        break;
      }
      case op::kSetItems: set_items(pop_to_mark(), "SETITEMS"); break;
      case op::kAppend: append({pop()}, "APPEND"); break;
      case op::kAppends: append(pop_to_mark(), "APPENDS"); break;
      case op::kBinPut: memo_[read<uint8_t>()] = top(); break;
      case op::kLongBinPut: memo_[read<uint32_t>()] = top(); break;
      case op::kMemoize: memo_[static_cast<uint32_t>(memo_.size())] = top(); break;
      case op::kBinGet: push_memo(read<uint8_t>()); break;
      case op::kLongBinGet: push_memo(read<uint32_t>()); break;
      case op::kGlobal: {
        Item item;
        item.kind = Item::Kind::kGlobal;
        const std::string module = read_line();
        item.name = module + "." + read_line();
        stack_.push_back(std::move(item));
        break;
      }
      case op::kStackGlobal: {
        Item name = pop();
        Item module = pop();
        if (!module.value.isString() || !name.value.isString()) fail("STACK_GLOBAL without two strings");
        Item item;
        item.kind = Item::Kind::kGlobal;
        item.name = module.value.toStringRef() + "." + name.value.toStringRef();
        stack_.push_back(std::move(item));
        break;
      }
      case op::kReduce: {
        Item args = pop();
        Item fn = pop();
        if (fn.kind != Item::Kind::kGlobal || args.kind != Item::Kind::kTuple) fail("REDUCE without a function and an argument tuple");
        stack_.push_back(call(fn.name, std::move(args.elements)));
        break;
      }
      case op::kBuild: {
        Item state = pop();
        Item& target = top();
        // Python's state_dict() is an OrderedDict with a _metadata attribute (module
        // versions) that load_state_dict does not need; a tensor's state is its Python
        // attributes. Both are dropped.
        if (target.kind != Item::Kind::kValue || !(target.value.isGenericDict() || target.value.isTensor())) {
          fail("BUILD on a Python object; datapar reads only dicts, lists, tuples, numbers, strings and tensors");
        }
        break;
      }
      case op::kBinPersId: stack_.push_back(persistent_load(pop())); break;
      default:
        pos_ = at;
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", code);
        fail("unknown or unsupported pickle opcode ", hex, " (not a torch.save file, or one from a newer format)");
    }
  }

  void push_memo(uint32_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail("memo entry ", index, " is read before it is written");
    stack_.push_back(it->second);
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  const StorageLoader& load_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;  // stack heights at each MARK
  std::unordered_map<uint32_t, Item> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;  // by key: views share a storage
};

}  // namespace

bool scalar_type_from_storage_name(const std::string& name, at::ScalarType* type) {
  for (at::ScalarType t : kStorageTypes) {
    if (name == c10::toString(t)) {
      *type = t;
      return true;
    }
  }
  return false;
}

c10::IValue read_pickle(const char* data, size_t size, const StorageLoader& load_storage) {
  return Machine(data, size, load_storage).run();
}

}  // namespace datapar::detail
