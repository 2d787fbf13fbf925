// read_pickle. See pickle_reader.h; the format is in docs/checkpoint_format.md.
//
// Note [Pickle budget]
// A pickle is a program, and a short one can describe a huge or endless object: a million
// nested lists in 2 MB, 2^34 tuples in 250 bytes through the memo, a list inside itself.
// The machine keeps every file's cost bounded (limits in pickle_limits.h):
//  1. Nothing is copied deeply. Values are IValues, whose copies share (DUP and the memo
//     cost O(1)); the few tuples that cannot be IValues (they hold a class) share their
//     elements through a shared_ptr and nest at most kMaxPickleGlobalTupleDepth.
//  2. Every dict, list and tuple built has an entry in `containers_`: its depth and its
//     size as a walk over it would count it (values, string bytes; a shared value counts
//     at every reference). A container put into another, or into a tuple, is sealed, and
//     APPEND or SETITEM on a sealed one is refused. Python's pickler never does that: it
//     fills a container before it nests it (in batches of 1000 while it is the top of the
//     stack). Sealing makes the bookkeeping exact and cycles impossible: a container
//     still being filled is inside nothing, so adding a child changes only its own depth
//     and size, and no child can contain it, except itself, which is refused.
//  3. So the result nests at most kMaxPickleDepth levels and holds at most
//     kMaxPickleValues values and kMaxPickleStringBytes of strings however it is walked,
//     and destroying it recurses at most kMaxPickleDepth levels. What is not inside the
//     result (the stack, the memo) grows by O(1) per opcode, so with the pickle's size.
//  4. Memory: counts bound what a walk visits, not what is allocated: 4 million empty
//     dicts in 9 MB, under the value budget, took 2.3 GB (empty lists 1 GB). So every
//     container, dict entry, list or tuple element, string, tensor, memo entry and stack
//     slot is charged its measured cost as it is built (pickle_limits.h), and the total may
//     not pass kMaxPickleMemoryPerByte per byte of data.pkl plus kPickleMemoryAllowance.
//     Nothing is refunded (a transient tuple counts though freed), and the stack and memo
//     are charged at their highest: a bound on the peak, not an estimate of it.
//  5. The budget grows with the file, so bytes that make nothing would raise it for free:
//     48 MB of PROTO and FRAME opcodes let 4 million empty dicts through (2.6 GB, issue
//     46). PROTO, FRAME, a memo put over an entry, and POP and POP_MARK (with a byte for each
//     value or mark they drop: DUP then POP makes nothing either) are charged what their
//     bytes brought, kMaxPickleMemoryPerByte each. Real files hold one PROTO and a FRAME
//     per 64 KiB.
#include "serialization/pickle_reader.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "serialization/pickle_limits.h"
#include "serialization/pickle_opcodes.h"

namespace datapar::detail {
namespace {

namespace op = pickle;

// A value on the machine's stack. Most are IValues; a class or function named by GLOBAL
// and a tuple holding one (torch.save's persistent ids hold torch.FloatStorage) have no
// IValue form, so they stay Items until a call consumes them. Copies share everything
// (Note [Pickle budget], 1).
struct Item {
  enum class Kind { kValue, kGlobal, kTuple };
  Kind kind = Kind::kValue;
  c10::IValue value;  // kValue; kGlobal: the name "module.name" as a string
  std::shared_ptr<const std::vector<Item>> elements;  // kTuple
  int depth = 0;      // kTuple: 1 + the depth of the deepest tuple item inside
  const std::string& name() const { return value.toStringRef(); }
};

// A container's depth and size, as a walk over it would see them.
struct Size {
  int depth = 0;       // 0 for a leaf, 1 for a container of leaves
  int64_t values = 1;  // itself and everything inside, shared values counted at each reference
  int64_t bytes = 0;   // of the strings counted in `values`
};

bool is_container(const c10::IValue& v) { return v.isList() || v.isGenericDict() || v.isTuple(); }

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
  Machine(const char* data, size_t size, const StorageLoader& load, const PickleClasses* classes,
          PickleAllowance* allowance)
      : data_(data),
        size_(size),
        load_(load),
        classes_(classes),
        allowance_(allowance),
        memory_budget_(static_cast<int64_t>(size) * kMaxPickleMemoryPerByte +
                       (allowance != nullptr ? std::max<int64_t>(0, allowance->left) : kPickleMemoryAllowance)) {}

  c10::IValue run() {
    while (true) {
      const size_t at = pos_;
      const uint8_t code = read<uint8_t>();
      if (code == op::kStop) break;
      const size_t held = stack_.size() + marks_.size(), memo = memo_.size();
      step(code, at);
      // Note [Pickle budget], 5: an opcode that makes nothing pays for the budget its bytes
      // brought, and one that drops values pays for a byte of each too.
      int64_t idle = 0;
      switch (code) {
        case op::kProto:
        case op::kFrame: idle = static_cast<int64_t>(pos_ - at); break;
        case op::kPop:
        case op::kPopMark:
          idle = static_cast<int64_t>(pos_ - at + held - (stack_.size() + marks_.size()));
          break;
        case op::kBinPut:
        case op::kLongBinPut:
        case op::kMemoize:
          if (memo_.size() == memo) idle = static_cast<int64_t>(pos_ - at);  // over an entry: nothing new
          break;
        default: break;
      }
      if (idle > 0) charge(idle * kMaxPickleMemoryPerByte);
      // Note [Pickle budget], 4: the stack, its marks and the memo at their highest.
      if (stack_.size() + marks_.size() > stack_peak_) {
        charge(static_cast<int64_t>(stack_.size() + marks_.size() - stack_peak_) * kPickleStackSlotCost);
        stack_peak_ = stack_.size() + marks_.size();
      }
      if (memo_.size() > memo_peak_) {
        charge(static_cast<int64_t>(memo_.size() - memo_peak_) * kPickleMemoEntryCost);
        memo_peak_ = memo_.size();
      }
    }
    if (stack_.size() != 1) fail("the program ends with ", stack_.size(), " values on the stack instead of 1");
    if (allowance_ != nullptr) {
      allowance_->left -= std::max<int64_t>(0, memory_ - static_cast<int64_t>(size_) * kMaxPickleMemoryPerByte);
    }
    return value_of(stack_.back());
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw CheckpointError(str_cat("data.pkl: ", args..., " at byte ", pos_, " of ", size_));
  }

  // A limit of pickle_limits.h was passed: `what` is "more than <limit> <things>".
  [[noreturn]] void over_limit(const std::string& what, const char* note = nullptr) const {
    throw CheckpointError(str_cat("data.pkl: ", what, " (", note ? note : "", note ? "; " : "",
                                  "datapar's limit for a checkpoint) at byte ", pos_, " of ", size_,
                                  ". State dicts and checkpoints stay far inside it: the file is damaged or was not "
                                  "written by torch.save"));
  }

  // Note [Pickle budget], 4.
  void charge(int64_t bytes) {
    memory_ += bytes;
    if (memory_ > memory_budget_) {
      over_limit(str_cat("more than ", memory_budget_ >> 20, " MiB of memory to hold what it describes"),
                 str_cat(kMaxPickleMemoryPerByte, " bytes per byte of data.pkl plus ", kPickleMemoryAllowance >> 20,
                         " MiB")
                     .c_str());
    }
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
    charge(kPickleStringCost + static_cast<int64_t>(n));
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

  // The IValue of an item. An Item tuple always holds a class (else it would be an
  // IValue tuple), which is not data: the message names it.
  c10::IValue value_of(const Item& item) const {
    const Item* global = &item;
    while (global->kind == Item::Kind::kTuple) {  // at most kMaxPickleGlobalTupleDepth levels
      const auto& e = *global->elements;
      global = &*std::find_if(e.begin(), e.end(), [](const Item& i) { return i.kind != Item::Kind::kValue; });
    }
    if (global->kind == Item::Kind::kValue) return global->value;
    fail("the Python object ", global->name(), " is stored as data; datapar reads only dicts, lists, tuples, numbers, strings and tensors");
  }

  // ---- containers: Note [Pickle budget], 2 ----

  struct Container {
    c10::IValue value;  // holds it, so that its address is never reused for another
    Size size;
    bool sealed = false;
    bool object_keys = false;  // a dict keyed by objects (PickleClasses), read as {position: (key, value)}
    bool plain_keys = false;
  };

  void check(const Size& size) const {
    const char* shared = "counting each reference to a shared one";
    if (size.depth > kMaxPickleDepth) over_limit(str_cat("nesting deeper than ", kMaxPickleDepth, " levels"));
    if (size.values > kMaxPickleValues) over_limit(str_cat("more than ", kMaxPickleValues, " values"), shared);
    if (size.bytes > kMaxPickleStringBytes) {
      over_limit(str_cat("more than ", kMaxPickleStringBytes, " bytes of strings"), shared);
    }
  }

  void track(const c10::IValue& container, const Size& size) {
    check(size);
    if (containers_.size() >= 2 * swept_size_) {  // amortized O(1) per container
      // An entry that is the last reference to its container: nothing can reach the
      // container again, so it may go (and its address be reused for a new one).
      for (auto it = containers_.begin(); it != containers_.end();) {
        it = it->second.value.use_count() == 1 ? containers_.erase(it) : std::next(it);
      }
      swept_size_ = std::max<size_t>(containers_.size(), 1024);
    }
    containers_[container.internalToPointer()] = Container{container, size, false};
  }

  Size size_of(const c10::IValue& v) const {
    if (!is_container(v)) return Size{0, 1, v.isString() ? static_cast<int64_t>(v.toStringRef().size()) : 0};
    const auto it = containers_.find(v.internalToPointer());
    DATAPAR_INTERNAL_ASSERT(it != containers_.end());  // every container is built here
    return it->second.size;
  }

  // `child` goes into a container or tuple of size `parent`: grows `parent` and seals the
  // child. `parent_value` (a dict or list being filled) must not be the child itself.
  c10::IValue nest(const Item& child, Size& parent, const c10::IValue* parent_value = nullptr) {
    c10::IValue v = value_of(child);
    if (is_container(v)) {
      if (parent_value != nullptr && v.isSameIdentity(*parent_value)) {
        fail("a ", v.isList() ? "list" : "dict", " is put inside itself (a cycle; no state dict or checkpoint has one)");
      }
      containers_.at(v.internalToPointer()).sealed = true;
    }
    const Size s = size_of(v);
    parent.depth = std::max(parent.depth, s.depth + 1);
    parent.values += s.values;
    parent.bytes += s.bytes;
    check(parent);
    return v;
  }

  // The dict or list on top of the stack, which APPEND(S) or SETITEM(S) fills.
  Container& open_container(bool dict, const char* opcode) {
    Item& target = top();
    if (target.kind != Item::Kind::kValue || !(dict ? target.value.isGenericDict() : target.value.isList())) {
      fail(opcode, " on something that is not a ", dict ? "dict" : "list");
    }
    Container& c = containers_.at(target.value.internalToPointer());
    if (c.sealed) {
      fail(opcode, " on a ", dict ? "dict" : "list", " that is already inside another container (Python's pickler fills "
           "a container before it nests it; not a torch.save file)");
    }
    return c;
  }

  Item tuple_item(std::vector<Item> elements) {
    charge(kPickleTupleCost + static_cast<int64_t>(elements.size()) * kPickleSlotCost);
    const bool values = std::all_of(elements.begin(), elements.end(), [](const Item& e) { return e.kind == Item::Kind::kValue; });
    if (values) {  // the usual case: an IValue tuple at once
      Size size{1, 1, 0};
      std::vector<c10::IValue> ivalues;
      ivalues.reserve(elements.size());
      for (const Item& e : elements) ivalues.push_back(nest(e, size));
      Item item = value_item(c10::ivalue::Tuple::create(std::move(ivalues)));
      track(item.value, size);
      return item;
    }
    Item item;
    item.kind = Item::Kind::kTuple;
    item.depth = 1;
    for (const Item& e : elements) {
      if (e.kind == Item::Kind::kTuple) item.depth = std::max(item.depth, e.depth + 1);
      if (e.kind == Item::Kind::kValue && is_container(e.value)) containers_.at(e.value.internalToPointer()).sealed = true;
    }
    if (item.depth > kMaxPickleGlobalTupleDepth) {
      over_limit(str_cat("tuples that hold a Python class nest deeper than ", kMaxPickleGlobalTupleDepth, " levels"));
    }
    item.elements = std::make_shared<const std::vector<Item>>(std::move(elements));
    return item;
  }

  Item new_dict() {
    charge(kPickleDictCost);
    Item item = value_item(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
    track(item.value, Size{1, 1, 0});
    return item;
  }

  Item new_list() {
    charge(kPickleListCost);
    Item item = value_item(c10::impl::GenericList(c10::AnyType::get()));
    track(item.value, Size{1, 1, 0});
    return item;
  }

  void set_items(std::vector<Item> kv, const char* opcode) {
    if (kv.size() % 2 != 0) fail(opcode, " with an odd number of keys and values");
    Container& c = open_container(/*dict=*/true, opcode);
    charge(static_cast<int64_t>(kv.size() / 2) * kPickleDictEntryCost);
    auto dict = c.value.toGenericDict();
    for (size_t i = 0; i < kv.size(); i += 2) {
      c10::IValue key = value_of(kv[i]);
      if (is_object(key)) {  // PickleClasses: {position: (key, value)}
        if (c.plain_keys) fail("a dict has both objects and plain values as keys");
        c.object_keys = true;
        charge(kPickleTupleCost + 2 * kPickleSlotCost);
        c10::IValue k = nest(kv[i], c.size);
        c10::IValue v = nest(kv[i + 1], c.size, &c.value);
        const int64_t position = static_cast<int64_t>(dict.size());
        dict.insert_or_assign(position, c10::ivalue::Tuple::create({std::move(k), std::move(v)}));
        continue;
      }
      if (c.object_keys) fail("a dict has both objects and plain values as keys");
      c.plain_keys = true;
      if (!key.isString() && !key.isInt() && !key.isBool() && !key.isDouble()) {
        fail("a dict key is a ", key.tagKind(), "; only str, int, float and bool keys are read");
      }
      // NaN keys are all unequal and all hash alike: each insert would collide and grow the
      // table (64 of them asked for 448 MiB), and none could ever be looked up.
      if (key.isDouble() && std::isnan(key.toDouble())) fail("a dict key is NaN; no state dict or checkpoint has one");
      nest(kv[i], c.size);
      dict.insert_or_assign(std::move(key), nest(kv[i + 1], c.size, &c.value));
    }
  }

  // ---- Python objects (PickleClasses) ----

  bool is_object(const c10::IValue& v) const { return v.isGenericDict() && objects_.count(v.internalToPointer()) > 0; }

  // A new object of class `name`: a dict {"__class__": name}, filled by BUILD.
  Item new_object(const std::string& name, std::vector<Item> args) {
    Item item = new_dict();
    objects_.emplace(item.value.internalToPointer(), item.value);
    Container& c = containers_.at(item.value.internalToPointer());
    put(c, "__class__", value_item(name));
    if (!args.empty()) put(c, "__args__", tuple_item(std::move(args)));
    return item;
  }

  void put(Container& c, const std::string& key, const Item& value) {
    charge(kPickleDictEntryCost + kPickleStringCost + static_cast<int64_t>(key.size()));
    c.size.values += 1;
    c.size.bytes += static_cast<int64_t>(key.size());
    c.value.toGenericDict().insert_or_assign(key, nest(value, c.size, &c.value));
  }

  // BUILD on an object: a dict state's entries become its own, any other state is kept whole.
  void build(const c10::IValue& object, const Item& state) {
    Container& c = containers_.at(object.internalToPointer());
    if (c.sealed) fail("BUILD on an object that is already inside a container (not what Python's pickler writes)");
    const c10::IValue s = value_of(state);
    if (!s.isGenericDict()) {
      put(c, "__state__", state);
      return;
    }
    nest(state, c.size, &c.value);  // seals it and counts what it holds
    auto target = c.value.toGenericDict();
    for (const auto& entry : s.toGenericDict()) {
      if (!entry.key().isString() || entry.key().toStringRef().rfind("__", 0) == 0) {
        fail("an object's state names a field that is not a plain string");
      }
      charge(kPickleDictEntryCost);
      target.insert_or_assign(entry.key(), entry.value());
    }
  }

  // A call PickleClasses allows: true, with its result in *out.
  bool call_class(const std::string& fn, std::vector<Item>& args, Item* out) {
    if (classes_ == nullptr) return false;
    if (classes_->objects.count(fn) > 0) {
      *out = new_object(fn, std::move(args));
      return true;
    }
    if (classes_->identities.count(fn) > 0) {
      if (args.size() != 1) fail(fn, " with ", args.size(), " arguments instead of 1");
      *out = std::move(args[0]);
      return true;
    }
    if (classes_->paths.count(fn) > 0) {
      std::string path;
      for (const Item& part : args) {
        if (part.kind != Item::Kind::kValue || !part.value.isString()) fail(fn, " with a part that is not a str");
        if (!path.empty() && path.back() != '/') path += '/';
        path += part.value.toStringRef();
      }
      charge(kPickleStringCost + static_cast<int64_t>(path.size()));
      *out = value_item(path);
      return true;
    }
    if (fn == "builtins.getattr" && args.size() == 2 && args[0].kind == Item::Kind::kGlobal &&
        classes_->enums.count(args[0].name()) > 0 && args[1].kind == Item::Kind::kValue && args[1].value.isString()) {
      const std::string member = args[0].name() + "." + args[1].value.toStringRef();
      charge(kPickleStringCost + static_cast<int64_t>(member.size()));
      *out = value_item(member);
      return true;
    }
    return false;
  }

  void append(std::vector<Item> items, const char* opcode) {
    Container& c = open_container(/*dict=*/false, opcode);
    charge(static_cast<int64_t>(items.size()) * kPickleSlotCost);
    auto list = c.value.toList();
    for (const Item& item : items) list.push_back(nest(item, c.size, &c.value));
  }

  int64_t int_arg(const Item& item, const char* what) {
    if (item.kind != Item::Kind::kValue || !item.value.isInt()) fail(what, " is not an int");
    return item.value.toInt();
  }

  std::vector<int64_t> ints_arg(const Item& item, const char* what) {
    if (item.kind != Item::Kind::kValue || !item.value.isTuple()) fail(what, " is not a tuple of ints");
    const auto& elements = item.value.toTupleRef().elements();
    if (elements.size() > kMaxPickleTensorDims) {
      over_limit(str_cat(what, " has ", elements.size(), " dimensions, more than ", kMaxPickleTensorDims));
    }
    std::vector<int64_t> out;
    for (const auto& e : elements) {
      if (!e.isInt()) fail(what, " is not a tuple of ints");
      out.push_back(e.toInt());
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
    charge(kPickleTensorCost);
    // `offset` counts from the storage tensor's first element, which need not be its storage's
    // (a storage read into the caller's tensor, torch_load_archive).
    return at::empty({0}, storage.options()).set_(storage.storage(), storage.storage_offset() + offset, sizes, strides);
  }

  Item call(const std::string& fn, std::vector<Item> args) {
    Item built;
    if (call_class(fn, args, &built)) return built;
    if (fn == "collections.OrderedDict") {
      if (!args.empty()) fail("OrderedDict built from arguments");
      return new_dict();
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
    if (pid.kind != Item::Kind::kTuple) fail("a persistent id that is not ('storage', type, key, location, numel)");
    const auto& e = *pid.elements;
    if (e.size() != 5 || e[0].kind != Item::Kind::kValue ||
        !e[0].value.isString() || e[0].value.toStringRef() != "storage" || e[1].kind != Item::Kind::kGlobal ||
        e[2].kind != Item::Kind::kValue || !e[2].value.isString()) {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    const std::string& type_name = e[1].name();
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
    if (it == storages_.end()) {
      charge(kPickleTensorCost);
      it = storages_.emplace(key, load_(key, dtype, numel)).first;
    }
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
      case op::kEmptyDict: stack_.push_back(new_dict()); break;
      case op::kEmptyList: stack_.push_back(new_list()); break;
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
        const std::string module = read_line();
        stack_.push_back(global_item(module, read_line()));
        break;
      }
      case op::kStackGlobal: {
        Item name = pop();
        Item module = pop();
        if (module.kind != Item::Kind::kValue || name.kind != Item::Kind::kValue || !module.value.isString() ||
            !name.value.isString()) {
          fail("STACK_GLOBAL without two strings");
        }
        stack_.push_back(global_item(module.value.toStringRef(), name.value.toStringRef()));
        break;
      }
      case op::kReduce: {
        Item args = pop();
        Item fn = pop();
        const bool tuple = args.kind == Item::Kind::kTuple || (args.kind == Item::Kind::kValue && args.value.isTuple());
        if (fn.kind != Item::Kind::kGlobal || !tuple) fail("REDUCE without a function and an argument tuple");
        const size_t n = args.kind == Item::Kind::kTuple ? args.elements->size() : args.value.toTupleRef().elements().size();
        if (n > kMaxPickleCallArguments) over_limit(str_cat("a call with ", n, " arguments, more than ", kMaxPickleCallArguments));
        std::vector<Item> arguments;
        if (args.kind == Item::Kind::kTuple) {
          arguments = *args.elements;
        } else {
          for (const c10::IValue& e : args.value.toTupleRef().elements()) arguments.push_back(value_item(e));
        }
        stack_.push_back(call(fn.name(), std::move(arguments)));
        break;
      }
      case op::kBuild: {
        Item state = pop();
        Item& target = top();
        if (target.kind == Item::Kind::kValue && is_object(target.value)) {
          build(target.value, state);
          break;
        }
        // Python's state_dict() is an OrderedDict with a _metadata attribute (module
        // versions) that load_state_dict does not need; a tensor's state is its Python
        // attributes. Both are dropped.
        if (target.kind != Item::Kind::kValue || !(target.value.isGenericDict() || target.value.isTensor())) {
          fail("BUILD on a Python object; datapar reads only dicts, lists, tuples, numbers, strings and tensors");
        }
        break;
      }
      case op::kNewObj: {
        Item args = pop();
        Item cls = pop();
        if (cls.kind != Item::Kind::kGlobal || args.kind != Item::Kind::kValue || !args.value.isTuple()) {
          fail("NEWOBJ without a class and an argument tuple");
        }
        if (classes_ == nullptr || classes_->objects.count(cls.name()) == 0) {
          fail("the file builds a ", cls.name(), ", which datapar does not read");
        }
        std::vector<Item> arguments;
        for (const c10::IValue& e : args.value.toTupleRef().elements()) arguments.push_back(value_item(e));
        if (arguments.size() > kMaxPickleCallArguments) {
          over_limit(str_cat("a call with ", arguments.size(), " arguments, more than ", kMaxPickleCallArguments));
        }
        stack_.push_back(new_object(cls.name(), std::move(arguments)));
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

  Item global_item(const std::string& module, const std::string& name) {
    if (module.size() + name.size() >= kMaxPickleGlobalName) {
      over_limit(str_cat("a class or function name of ", module.size() + 1 + name.size(), " bytes, more than ",
                         kMaxPickleGlobalName));
    }
    Item item;
    item.kind = Item::Kind::kGlobal;
    item.value = module + "." + name;
    if (classes_ != nullptr && classes_->constants.count(item.name()) > 0) {
      charge(kPickleStringCost + static_cast<int64_t>(item.name().size()));
      item.kind = Item::Kind::kValue;  // torch.float32 reads as "torch.float32"
    }
    return item;
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
  const PickleClasses* classes_;  // null: plain data only
  std::vector<Item> stack_;
  std::vector<size_t> marks_;  // stack heights at each MARK
  std::unordered_map<uint32_t, Item> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;  // by key: views share a storage
  std::unordered_map<const void*, Container> containers_;  // by internalToPointer()
  // The dicts that are objects (PickleClasses::objects), held so that no address is reused.
  std::unordered_map<const void*, c10::IValue> objects_;
  size_t swept_size_ = 1024;  // containers_.size() after the last sweep (see track)
  PickleAllowance* allowance_;   // shared with other reads, or null
  const int64_t memory_budget_;  // Note [Pickle budget], 4
  int64_t memory_ = 0;           // charged so far
  size_t stack_peak_ = 0;        // the highest stack_.size() + marks_.size() charged
  size_t memo_peak_ = 0;         // the largest memo_.size() charged
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

c10::IValue read_pickle(const char* data, size_t size, const StorageLoader& load_storage,
                        const PickleClasses* classes, PickleAllowance* allowance) {
  return Machine(data, size, load_storage, classes, allowance).run();
}

}  // namespace datapar::detail
