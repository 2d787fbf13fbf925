// parse_metadata / write_metadata. See metadata.h.
#include "dcp/metadata.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "datapar/error.h"
#include "serialization/pickle_limits.h"
#include "serialization/pickle_reader.h"

namespace datapar::dcp::detail {
namespace {

using c10::IValue;
using datapar::detail::str_cat;

const std::string kModule = "torch.distributed.checkpoint.metadata";
const std::string kMetadata = kModule + ".Metadata";
const std::string kTensorStorage = kModule + ".TensorStorageMetadata";
const std::string kBytesStorage = kModule + ".BytesStorageMetadata";
const std::string kProperties = kModule + ".TensorProperties";
const std::string kChunk = kModule + ".ChunkStorageMetadata";
const std::string kIndex = kModule + ".MetadataIndex";
const std::string kStorageMeta = kModule + ".StorageMeta";
const std::string kMemoryFormat = kModule + "._MEM_FORMAT_ENCODING";
const std::string kStorageInfo = "torch.distributed.checkpoint.filesystem._StorageInfo";

// At most this many chunk pairs compared for overlap (a hostile file of many overlapping
// chunks; real ones compare about one pair per chunk).
constexpr int64_t kMaxOverlapChecks = int64_t{1} << 24;

const std::pair<const char*, at::ScalarType> kDtypes[] = {{"float32", at::kFloat},
                                                          {"float64", at::kDouble},
                                                          {"float16", at::kHalf},
                                                          {"bfloat16", at::kBFloat16},
                                                          {"int64", at::kLong},
                                                          {"int32", at::kInt},
                                                          {"int16", at::kShort},
                                                          {"int8", at::kChar},
                                                          {"uint8", at::kByte},
                                                          {"bool", at::kBool},
                                                          {"complex64", at::kComplexFloat},
                                                          {"complex128", at::kComplexDouble}};

const datapar::detail::PickleClasses& classes() {
  static const datapar::detail::PickleClasses c = [] {
    datapar::detail::PickleClasses c;
    c.objects = {kMetadata, kTensorStorage, kBytesStorage, kProperties, kChunk, kIndex, kStorageMeta, kStorageInfo};
    c.identities = {"torch.Size", "torch.serialization._get_layout"};
    c.paths = {"pathlib.PosixPath", "pathlib.PurePosixPath"};
    for (const auto& d : kDtypes) c.constants.insert(std::string("torch.") + d.first);
    c.enums = {kMemoryFormat};
    return c;
  }();
  return c;
}

[[noreturn]] void bad(const std::string& what) {
  throw CheckpointError(str_cat("the metadata is not what torch.distributed.checkpoint writes: ", what));
}

// An object's field, or None when absent (Python dataclasses leave defaults out).
IValue field(const IValue& object, const char* name) {
  const auto dict = object.toGenericDict();
  const auto it = dict.find(name);
  return it == dict.end() ? IValue() : it->value();
}

void expect_class(const IValue& v, const std::string& cls, const std::string& where) {
  if (!v.isGenericDict() || !field(v, "__class__").isString() || field(v, "__class__").toStringRef() != cls) {
    bad(str_cat(where, " is not a ", cls.substr(cls.rfind('.') + 1)));
  }
}

int64_t to_int(const IValue& v, const std::string& where) {
  if (!v.isInt()) bad(str_cat(where, " is not an int"));
  return v.toInt();
}

std::vector<int64_t> to_ints(const IValue& v, const std::string& where) {
  if (!v.isTuple() && !v.isList()) bad(str_cat(where, " is not a torch.Size"));
  const auto elements = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
  if (elements.size() > datapar::detail::kMaxPickleTensorDims)
    bad(str_cat(where, " has ", elements.size(), " dimensions"));
  std::vector<int64_t> out;
  for (const IValue& e : elements) out.push_back(to_int(e, where));
  return out;
}

std::string to_string(const IValue& v, const std::string& where) {
  if (!v.isString()) bad(str_cat(where, " is not a str"));
  return v.toStringRef();
}

at::ScalarType dtype_of(const IValue& properties, const std::string& where) {
  expect_class(properties, kProperties, where + "'s properties");
  // TensorProperties.__getstate__: (dtype, layout, requires_grad, memory_format, pin_memory).
  IValue dtype = field(properties, "dtype");
  const IValue state = field(properties, "__state__");
  if (state.isTuple() && !state.toTupleRef().elements().empty()) dtype = state.toTupleRef().elements()[0];
  if (state.isTuple() && state.toTupleRef().elements().size() > 1) {
    const IValue& layout = state.toTupleRef().elements()[1];
    if (!layout.isString() || layout.toStringRef() != "torch.strided") {
      bad(str_cat(where, " is not a strided (dense) tensor; datapar reads dense tensors"));
    }
  }
  at::ScalarType type = at::kFloat;
  if (!dtype.isString() || dtype.toStringRef().rfind("torch.", 0) != 0 ||
      !scalar_type_from_torch_name(dtype.toStringRef(), &type)) {
    bad(str_cat(where, " has a dtype datapar does not read"));
  }
  return type;
}

bool inside(const Chunk& c, const std::vector<int64_t>& size) {
  if (c.offsets.size() != size.size() || c.sizes.size() != size.size()) return false;
  for (size_t d = 0; d < size.size(); ++d) {
    if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > size[d] || c.sizes[d] > size[d] - c.offsets[d])
      return false;
  }
  return true;
}

bool overlap(const Chunk& a, const Chunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  }
  return volume(a.sizes) > 0 && volume(b.sizes) > 0;
}

// Chunks inside the tensor, disjoint, covering it: what any load of it relies on.
void check_chunks(const Entry& e) {
  const std::string where = "tensor " + e.fqn;
  const int64_t numel = volume(e.size);
  if (numel < 0) bad(str_cat(where, " has a size past 2^62 elements"));
  if (e.chunks.empty()) bad(str_cat(where, " has no chunks"));
  int64_t covered = 0;
  for (const Chunk& c : e.chunks) {
    if (!inside(c, e.size)) {
      bad(str_cat(where, " of size ", c10::IntArrayRef(e.size), " has a chunk at ", c10::IntArrayRef(c.offsets),
                  " of size ", c10::IntArrayRef(c.sizes), " that is not inside it"));
    }
    covered += volume(c.sizes);
  }
  std::vector<size_t> order(e.chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t rank = e.size.size();
  if (rank > 0) {
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return e.chunks[a].offsets[0] < e.chunks[b].offsets[0]; });
  }
  int64_t checks = 0;
  std::vector<size_t> open;  // chunks whose rows (first dimension) may still meet the next ones
  for (size_t i : order) {
    const Chunk& c = e.chunks[i];
    if (rank > 0) {
      open.erase(
          std::remove_if(open.begin(), open.end(),
                         [&](size_t j) { return e.chunks[j].offsets[0] + e.chunks[j].sizes[0] <= c.offsets[0]; }),
          open.end());
    }
    for (size_t j : open) {
      if (++checks > kMaxOverlapChecks) bad(str_cat(where, " has more chunks side by side than datapar compares"));
      if (overlap(c, e.chunks[j])) {
        bad(str_cat(where, " has overlapping chunks at ", c10::IntArrayRef(c.offsets), " and ",
                    c10::IntArrayRef(e.chunks[j].offsets)));
      }
    }
    open.push_back(i);
  }
  if (covered != numel) {
    bad(str_cat(where, " of ", numel, " elements has chunks covering ", covered, " (a part is missing)"));
  }
}

// A data file's name: a plain name inside the checkpoint's directory.
void check_relative_path(const std::string& path) {
  if (path.empty() || path == "." || path == ".." || path.find('/') != std::string::npos ||
      path.find('\0') != std::string::npos || path.size() > 255) {
    bad(str_cat("a data file is named \"", path.substr(0, 80), "\", which is not a file name inside the checkpoint"));
  }
}

// ---- writing: protocol-2 pickle opcodes (serialization/pickle_opcodes.h) ----

class Emitter {
 public:
  Emitter() { out_ += "\x80\x02"; }
  std::string finish() {
    out_ += '.';
    return std::move(out_);
  }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  void none() { out_ += 'N'; }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      raw(static_cast<int32_t>(v));
    } else {
      out_ += "\x8a\x08";
      raw(v);
    }
  }
  void string(const std::string& s) {
    out_ += 'X';
    raw(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void mark() { out_ += '('; }
  void tuple() { out_ += 't'; }  // of everything since mark()
  void ints(const std::vector<int64_t>& v) {
    mark();
    for (int64_t x : v) integer(x);
    tuple();
  }
  void size(const std::vector<int64_t>& v) {  // torch.Size(v)
    global("torch", "Size");
    mark();
    ints(v);
    tuple();
    out_ += 'R';
  }
  // cls.__new__(cls): then the state and build(), or nothing for a stateless object.
  void new_object(const std::string& module, const std::string& name) {
    global(module, name);
    out_ += ")\x81";
  }
  void build() { out_ += 'b'; }
  void empty_dict() { out_ += '}'; }
  void empty_list() { out_ += ']'; }
  void set_items() { out_ += 'u'; }  // into the dict below the mark
  void appends() { out_ += 'e'; }
  void reduce() { out_ += 'R'; }

 private:
  template <typename T>
  void raw(T v) {
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);  // little-endian host, as pickle_writer.cc
    out_.append(b, sizeof v);
  }
  std::string out_;
};

void emit_properties(Emitter& e, at::ScalarType dtype) {
  e.new_object(kModule, "TensorProperties");
  e.mark();  // __setstate__'s tuple
  const std::string name = torch_dtype_name(dtype);
  e.global("torch", name.substr(name.find('.') + 1));
  e.global("torch.serialization", "_get_layout");
  e.mark();
  e.string("torch.strided");
  e.tuple();
  e.reduce();
  e.boolean(false);  // requires_grad
  e.global("builtins", "getattr");
  e.mark();
  e.global(kModule, "_MEM_FORMAT_ENCODING");
  e.string("TORCH_CONTIGUOUS_FORMAT");
  e.tuple();
  e.reduce();
  e.boolean(false);  // pin_memory
  e.tuple();
  e.build();
}

void emit_storage_info(Emitter& e, const StorageInfo& s) {
  e.new_object("torch.distributed.checkpoint.filesystem", "_StorageInfo");
  e.empty_dict();
  e.mark();
  e.string("relative_path");
  e.string(s.relative_path);
  e.string("offset");
  e.integer(s.offset);
  e.string("length");
  e.integer(s.length);
  e.set_items();
  e.build();
}

void emit_index(Emitter& e, const std::string& fqn, const std::vector<int64_t>* offsets, int64_t index) {
  e.new_object(kModule, "MetadataIndex");
  e.empty_dict();
  e.mark();
  e.string("fqn");
  e.string(fqn);
  if (offsets != nullptr) {
    e.string("offset");
    e.size(*offsets);
    e.string("index");
    e.integer(index);
  } else {
    e.string("index");
    e.none();
  }
  e.set_items();
  e.build();
}

}  // namespace

bool scalar_type_from_torch_name(const std::string& name, at::ScalarType* type) {
  for (const auto& d : kDtypes) {
    if (name == std::string("torch.") + d.first) {
      *type = d.second;
      return true;
    }
  }
  return false;
}

std::string torch_dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.second == type) return std::string("torch.") + d.first;
  }
  throw InvalidArgumentError(str_cat("torch.distributed.checkpoint: tensors of ", type, " are not saved by datapar"));
}

int64_t volume(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s < 0) return -1;
    if (s == 0) return 0;
  }
  for (int64_t s : sizes) {
    if (n > (int64_t{1} << 62) / s) return -1;
    n *= s;
  }
  return n;
}

const Entry* Metadata::find(const std::string& fqn) const {
  for (const Entry& e : entries) {
    if (e.fqn == fqn) return &e;
  }
  return nullptr;
}

Metadata parse_metadata(const char* data, size_t size) {
  const datapar::detail::StorageLoader no_storages = [](const std::string&, at::ScalarType, int64_t) -> at::Tensor {
    throw CheckpointError("the metadata holds a tensor, which DCP's metadata never does");
  };
  IValue root;
  try {
    root = datapar::detail::read_pickle(data, size, no_storages, &classes());
  } catch (const CheckpointError& e) {
    std::string what = e.what();
    if (what.rfind("data.pkl: ", 0) == 0) what = what.substr(10);
    throw CheckpointError(str_cat("the metadata pickle cannot be read: ", what));
  }
  expect_class(root, kMetadata, "the pickled object");
  const IValue version = field(root, "version");
  if (!version.isString() || version.toStringRef() != kFormatVersion) {
    throw CheckpointError(str_cat("the checkpoint's DCP format version is ",
                                  version.isString() ? "\"" + version.toStringRef() + "\"" : std::string("not given"),
                                  "; datapar reads version ", kFormatVersion,
                                  " (written by PyTorch 2.4 to 2.15; tested with 2.15). Save it with such a PyTorch"));
  }
  Metadata out;
  const IValue storage_meta = field(root, "storage_meta");
  if (!storage_meta.isNone()) {
    expect_class(storage_meta, kStorageMeta, "storage_meta");
    if (field(storage_meta, "save_id").isString()) out.save_id = field(storage_meta, "save_id").toStringRef();
  }

  const IValue entries = field(root, "state_dict_metadata");
  if (!entries.isGenericDict()) bad("state_dict_metadata is not a dict");
  std::unordered_map<std::string, size_t> position;
  for (const auto& item : entries.toGenericDict()) {
    Entry e;
    e.fqn = to_string(item.key(), "a key of state_dict_metadata");
    const IValue& md = item.value();
    const std::string where = "entry " + e.fqn;
    if (md.isGenericDict() && field(md, "__class__").isString() &&
        field(md, "__class__").toStringRef() == kBytesStorage) {
      e.is_tensor = false;
    } else {
      expect_class(md, kTensorStorage, where);
      e.is_tensor = true;
      e.dtype = dtype_of(field(md, "properties"), where);
      e.size = to_ints(field(md, "size"), where + "'s size");
      const IValue chunks = field(md, "chunks");
      if (!chunks.isList()) bad(str_cat(where, "'s chunks are not a list"));
      for (const IValue& c : chunks.toListRef()) {
        expect_class(c, kChunk, where + "'s chunk");
        e.chunks.push_back(Chunk{to_ints(field(c, "offsets"), where + "'s chunk offsets"),
                                 to_ints(field(c, "sizes"), where + "'s chunk sizes")});
      }
      check_chunks(e);
      e.storage.resize(e.chunks.size());
    }
    if (e.storage.empty()) e.storage.resize(1);
    position[e.fqn] = out.entries.size();
    out.entries.push_back(std::move(e));
  }

  // storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo}, which the reader gives
  // as {0: (MetadataIndex, _StorageInfo), ...} (serialization/pickle_reader.h).
  const IValue storage = field(root, "storage_data");
  if (!storage.isGenericDict()) bad("storage_data is not a dict");
  std::vector<std::vector<bool>> found(out.entries.size());
  for (size_t i = 0; i < out.entries.size(); ++i) found[i].assign(out.entries[i].storage.size(), false);
  for (const auto& pair : storage.toGenericDict()) {
    if (!pair.value().isTuple() || pair.value().toTupleRef().elements().size() != 2) {
      bad("a key of storage_data is not a MetadataIndex");
    }
    const IValue& key = pair.value().toTupleRef().elements()[0];
    const IValue& info = pair.value().toTupleRef().elements()[1];
    expect_class(key, kIndex, "a key of storage_data");
    const std::string fqn = to_string(field(key, "fqn"), "a MetadataIndex's fqn");
    const IValue offset = field(key, "offset");
    const auto at = position.find(fqn);
    if (at == position.end())
      bad(str_cat("storage_data names ", fqn.substr(0, 200), ", which state_dict_metadata does not"));
    Entry& e = out.entries[at->second];
    size_t slot = 0;
    if (e.is_tensor) {
      const std::vector<int64_t> offsets = to_ints(offset, "a MetadataIndex's offset");
      const auto chunk =
          std::find_if(e.chunks.begin(), e.chunks.end(), [&](const Chunk& c) { return c.offsets == offsets; });
      if (chunk == e.chunks.end())
        bad(str_cat("storage_data has bytes for ", fqn, " at ", c10::IntArrayRef(offsets), ", no chunk of it"));
      slot = static_cast<size_t>(chunk - e.chunks.begin());
    } else if (!offset.isNone()) {
      bad(str_cat("storage_data gives the object ", fqn, " an offset"));
    }
    expect_class(info, kStorageInfo, "a value of storage_data");
    if (!field(info, "transform_descriptors").isNone()) {
      const IValue t = field(info, "transform_descriptors");
      if (!(t.isList() && t.toListRef().empty()) && !(t.isTuple() && t.toTupleRef().elements().empty())) {
        throw CheckpointError(str_cat("entry ", fqn,
                                      " is stored through transforms (compression or an extension); datapar reads "
                                      "checkpoints saved with PyTorch's default FileSystemWriter only"));
      }
    }
    StorageInfo s{to_string(field(info, "relative_path"), "a relative_path"),
                  to_int(field(info, "offset"), "an offset"), to_int(field(info, "length"), "a length")};
    check_relative_path(s.relative_path);
    if (s.offset < 0 || s.length <= 0 || s.offset > (int64_t{1} << 50) || s.length > (int64_t{1} << 50)) {
      bad(str_cat("entry ", fqn, " is stored at offset ", s.offset, " length ", s.length));
    }
    if (found[at->second][slot]) bad(str_cat("storage_data gives ", fqn, " the same chunk twice"));
    found[at->second][slot] = true;
    e.storage[slot] = std::move(s);
  }
  for (size_t i = 0; i < out.entries.size(); ++i) {
    for (size_t c = 0; c < found[i].size(); ++c) {
      if (!found[i][c]) {
        const Entry& e = out.entries[i];
        bad(str_cat("entry ", e.fqn, e.is_tensor ? str_cat("'s chunk at ", c10::IntArrayRef(e.chunks[c].offsets)) : "",
                    " has no place in any data file"));
      }
    }
  }

  const IValue planner = field(root, "planner_data");
  if (planner.isGenericDict()) {
    for (const auto& item : planner.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTuple()) continue;
      const auto at = position.find(item.key().toStringRef());
      if (at == position.end()) continue;
      for (const IValue& part : item.value().toTupleRef().elements()) {
        if (!part.isString() && !part.isInt())
          bad(str_cat("planner_data's path of ", item.key().toStringRef(), " is not str and int"));
      }
      out.entries[at->second].path = item.value().toTupleRef().elements().vec();
    }
  }
  return out;
}

std::string write_metadata(const Metadata& metadata, const std::string& checkpoint_id) {
  Emitter e;
  e.new_object(kModule, "Metadata");
  e.empty_dict();
  e.mark();

  e.string("state_dict_metadata");
  e.empty_dict();
  e.mark();
  for (const Entry& entry : metadata.entries) {
    e.string(entry.fqn);
    if (!entry.is_tensor) {
      e.new_object(kModule, "BytesStorageMetadata");
      continue;
    }
    e.new_object(kModule, "TensorStorageMetadata");
    e.empty_dict();
    e.mark();
    e.string("properties");
    emit_properties(e, entry.dtype);
    e.string("size");
    e.size(entry.size);
    e.string("chunks");
    e.empty_list();
    e.mark();
    for (const Chunk& c : entry.chunks) {
      e.new_object(kModule, "ChunkStorageMetadata");
      e.empty_dict();
      e.mark();
      e.string("offsets");
      e.size(c.offsets);
      e.string("sizes");
      e.size(c.sizes);
      e.set_items();
      e.build();
    }
    e.appends();
    e.set_items();
    e.build();
  }
  e.set_items();

  e.string("planner_data");
  e.empty_dict();
  e.mark();
  for (const Entry& entry : metadata.entries) {
    if (entry.path.empty()) continue;
    e.string(entry.fqn);
    e.mark();
    for (const IValue& part : entry.path) {
      if (part.isInt()) {
        e.integer(part.toInt());
      } else {
        e.string(part.toStringRef());
      }
    }
    e.tuple();
  }
  e.set_items();

  e.string("storage_data");
  e.empty_dict();
  e.mark();
  for (const Entry& entry : metadata.entries) {
    for (size_t c = 0; c < entry.storage.size(); ++c) {
      emit_index(e, entry.fqn, entry.is_tensor ? &entry.chunks[c].offsets : nullptr, static_cast<int64_t>(c));
      emit_storage_info(e, entry.storage[c]);
    }
  }
  e.set_items();

  e.string("storage_meta");
  e.new_object(kModule, "StorageMeta");
  e.empty_dict();
  e.mark();
  e.string("checkpoint_id");
  e.string(checkpoint_id);
  e.string("save_id");
  e.string(metadata.save_id);
  e.string("load_id");
  e.none();
  e.string("modules");
  e.empty_list();
  e.set_items();
  e.build();

  e.string("version");
  e.string(kFormatVersion);
  e.set_items();
  e.build();
  return e.finish();
}

}  // namespace datapar::dcp::detail
