// dcp::save / dcp::load. See datapar/dcp/checkpoint.h; the format is in
// docs/checkpoint_format.md, and src/dcp/metadata.h reads and writes its .metadata.
//
// A save is three exchanges among the ranks (all_gather of small byte strings): each
// rank's plan (names, kinds, sizes, boxes, and any problem with the directory), from which
// every rank alike checks that they agree and picks who writes each whole tensor and value;
// after writing, each rank's byte ranges (or its error); and rank 0's verdict on .metadata.
// A load reads .metadata on every rank and ends with one exchange of errors, so that no rank
// goes on training while another failed.
//
// Note [What a load costs]
// A checkpoint's files are untrusted (issue 46: 100 entries naming one 20 MB item took
// 2.3 GiB). What a load allocates is bounded by what the checkpoint names once:
//   - the tensors: at most the bytes of their chunks (check_sizes), and no two byte ranges
//     of a file overlap, so each byte is read at most once;
//   - while one item is read: the tensor made of it (none when it is read into its box,
//     Note [A chunk read into its box]), at most the largest item, freed before the next:
//     its archive is read record by record, never whole (it was, and then copied twice:
//     three times the largest item);
//   - the objects (non-tensor items) and .metadata: their pickles, at most 64 bytes per
//     byte of them (pickle_limits.h) plus one 64 MiB allowance that every item of the load
//     shares (before, each item had its own: a thousand small items could each take it).
// So at most: the tensors' bytes + the largest item + 64 x the bytes of .metadata and
// of the objects + 64 MiB (+ 64 MiB for .metadata). Dcp.ALoadCostsAtMost... measures it.
#include "datapar/dcp/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/process_group/work.h"
#include "dcp/metadata.h"
#include "dcp/save_plan.h"
#include "file_system.h"
#include "random_bytes.h"
#include "owned_directory.h"
#include "serialization/atomic_file.h"
#include "serialization/pickle_writer.h"
#include "serialization/torch_file.h"

namespace datapar::dcp {

namespace detail {

// One entry of a rank's plan.
struct PlanEntry {
  std::string name;
  State::Kind kind;
  at::ScalarType dtype;
  std::vector<int64_t> global_size;
  std::vector<Chunk> boxes;  // this rank's: offsets and sizes
  std::vector<c10::IValue> path;
};

// A save's first half (save_plan.h): the directory, every rank's plan, and who writes what.
struct SavePlan {
  std::string dir;
  datapar::detail::OwnedDirectory out;
  std::vector<std::vector<PlanEntry>> plans;  // by rank
  std::vector<int> writer;                    // by entry: the rank that writes a whole tensor or value; -1 for shards
  int rank = 0;
};

}  // namespace detail

namespace {

using c10::IValue;
using datapar::detail::str_cat;
using detail::Metadata;
using GenericList = c10::impl::GenericList;

std::string data_file(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }
std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// ---- byte strings among the ranks ----

// Every rank's bytes, in rank order (one process alone: its own).
std::vector<std::string> all_gather_bytes(ProcessGroup* group_or_null, const std::string& bytes) {
  if (group_or_null == nullptr) return {bytes};
  return datapar::all_gather_bytes(*group_or_null, bytes);
}

IValue list_of(std::vector<IValue> items) {
  GenericList list(c10::AnyType::get());
  for (IValue& i : items) list.push_back(std::move(i));
  return list;
}

IValue ints(const std::vector<int64_t>& v) { return list_of(std::vector<IValue>(v.begin(), v.end())); }

std::vector<int64_t> ints_of(const IValue& v) {
  std::vector<int64_t> out;
  for (const IValue& e : v.toListRef()) out.push_back(e.toInt());
  return out;
}

// The first error among the ranks' strings, as "rank r: <error>"; "" if none.
std::string first_error(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) return str_cat("rank ", r, ": ", errors[r]);
  }
  return "";
}

// ---- a rank's plan ----

using detail::PlanEntry;

IValue plan_value(const State& state, const std::string& problem) {
  std::vector<IValue> entries;
  for (const State::Entry& e : state.entries()) {
    std::vector<IValue> boxes;
    for (const Shard& b : e.boxes) boxes.push_back(list_of({ints(b.offsets), ints(b.local.sizes().vec())}));
    entries.push_back(list_of({e.name, static_cast<int64_t>(e.kind), static_cast<int64_t>(e.dtype), ints(e.global_size),
                               list_of(std::move(boxes)), list_of(e.path)}));
  }
  return list_of({problem, list_of(std::move(entries))});
}

std::string encode_plan(const State& state, const std::string& problem) {
  return datapar::detail::torch_save_bytes(plan_value(state, problem));
}

// This rank's layout (its plan without a problem) as bytes to compare: the pickle alone.
std::string layout_of(const State& state) {
  std::vector<at::Tensor> none;
  return datapar::detail::write_pickle(plan_value(state, ""), &none);
}

std::vector<PlanEntry> decode_plan(const std::string& bytes, std::string* problem) {
  const IValue v = datapar::detail::torch_load_bytes(bytes.data(), bytes.size());
  const auto& top = v.toListRef();
  *problem = top[0].toStringRef();
  std::vector<PlanEntry> out;
  for (const IValue& e : top[1].toListRef()) {
    const auto& f = e.toListRef();
    std::vector<detail::Chunk> boxes;
    for (const IValue& b : f[4].toListRef()) boxes.push_back({ints_of(b.toListRef()[0]), ints_of(b.toListRef()[1])});
    out.push_back(PlanEntry{f[0].toStringRef(), static_cast<State::Kind>(f[1].toInt()),
                            static_cast<at::ScalarType>(f[2].toInt()), ints_of(f[3]), std::move(boxes),
                            f[5].toListRef().vec()});
  }
  return out;
}

const char* kind_name(State::Kind kind) {
  return kind == State::Kind::kTensor ? "a whole tensor" : kind == State::Kind::kShard ? "a shard" : "a value";
}

// What rank `r`'s plan disagrees on with rank 0's; "" if nothing.
std::string disagreement(const std::vector<PlanEntry>& zero, const std::vector<PlanEntry>& other, size_t r) {
  if (zero.size() != other.size()) {
    return str_cat("rank 0 saves ", zero.size(), " entries but rank ", r, " saves ", other.size(),
                   ". Every rank saves the same entries");
  }
  for (size_t i = 0; i < zero.size(); ++i) {
    const PlanEntry& a = zero[i];
    const PlanEntry& b = other[i];
    if (a.name != b.name) return str_cat("entry ", i, " is ", a.name, " on rank 0 but ", b.name, " on rank ", r);
    if (a.kind != b.kind)
      return str_cat(a.name, " is ", kind_name(a.kind), " on rank 0 but ", kind_name(b.kind), " on rank ", r);
    if (a.kind == State::Kind::kValue) continue;
    if (a.dtype != b.dtype || a.global_size != b.global_size) {
      return str_cat(a.name, " is ", a.dtype, c10::IntArrayRef(a.global_size), " on rank 0 but ", b.dtype,
                     c10::IntArrayRef(b.global_size), " on rank ", r);
    }
    if (a.kind == State::Kind::kTensor && a.boxes[0].sizes != b.boxes[0].sizes) {
      return str_cat(a.name, " differs in size between rank 0 and rank ", r);
    }
  }
  return "";
}

// One thing a rank writes: entry `entry`'s chunk `chunk` (its only one for whole tensors
// and values), and where it went.
struct Written {
  int64_t entry = 0;
  int64_t chunk = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

// ---- reading data files ----

// A checkpoint's files are read only when regular (detail::open_regular_file). Returns the
// open descriptor; throws CheckpointError naming `what`.
int open_regular(const std::string& path, const std::string& what, int64_t* size) {
  const datapar::detail::RegularFile file = datapar::detail::open_regular_file(path);
  if (file.irregular) {
    throw CheckpointError(str_cat(what, " is not a regular file (a FIFO, device, socket or directory?): refused, ",
                                  "a checkpoint holds files only"));
  }
  if (file.error == ENOENT) {
    throw CheckpointError(str_cat(what, " is missing (", std::strerror(ENOENT), "): the checkpoint was not copied whole"));
  }
  if (file.fd < 0) throw CheckpointError(str_cat(what, " cannot be opened (", std::strerror(file.error), ")"));
  *size = file.size;
  return file.fd;
}

// Reads `length` bytes at `offset` of `fd`, whole.
void read_at(int fd, int64_t offset, char* out, int64_t length, const std::string& what) {
  while (length > 0) {
    const ssize_t n = ::pread(fd, out, static_cast<size_t>(length), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CheckpointError(str_cat(what, ": a read failed (", n < 0 ? std::strerror(errno) : "end of file", ")"));
    out += n;
    offset += n;
    length -= n;
  }
}

// The data files, one open at a time: a checkpoint of a thousand ranks' files loads under
// any limit on open files (all of them were kept open: "Too many open files" at 1100).
// Their items' pickles share one memory allowance (Note [What a load costs]).
class DataFiles {
 public:
  datapar::detail::PickleAllowance allowance;

  explicit DataFiles(std::string dir) : dir_(std::move(dir)) {}
  ~DataFiles() { close_current(); }
  DataFiles(const DataFiles&) = delete;
  DataFiles& operator=(const DataFiles&) = delete;

  // The item at `info`, after checking that the file holds its bytes: its archive read
  // record by record, each storage into the tensor `place` gives or a new one.
  IValue load(const detail::StorageInfo& info, const datapar::detail::StoragePlace& place) {
    const std::string what = "data file " + info.relative_path;
    if (info.relative_path != current_) {
      close_current();
      fd_ = open_regular(join(dir_, info.relative_path), what, &size_);
      current_ = info.relative_path;
    }
    if (info.offset > size_ || info.length > size_ - info.offset) {
      throw CheckpointError(str_cat(what, " has ", size_, " bytes, but the metadata puts an entry at ", info.offset,
                                    "..", info.offset + info.length, " (a truncated copy?)"));
    }
    const int fd = fd_;
    return datapar::detail::torch_load_archive(
        static_cast<uint64_t>(info.length),
        [&](uint64_t offset, char* out, uint64_t n) {
          read_at(fd, info.offset + static_cast<int64_t>(offset), out, static_cast<int64_t>(n), what);
        },
        place, &allowance);
  }

 private:
  void close_current() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    current_.clear();
  }

  std::string dir_;
  std::string current_;  // the open file's name, or ""
  int fd_ = -1;
  int64_t size_ = 0;
};

IValue read_item(DataFiles& files, const detail::StorageInfo& info, const std::string& name,
                 const datapar::detail::StoragePlace& place = nullptr) {
  try {
    return files.load(info, place);
  } catch (const CheckpointError& e) {
    throw CheckpointError(str_cat(name, " at ", info.relative_path, ":", info.offset, ": ", e.what()));
  }
}

// Copies the part of saved chunk `c` (data `saved`) that meets the box of `target` (at
// `offsets` of the global tensor).
void copy_overlap(const detail::Chunk& c, const at::Tensor& saved, at::Tensor& target,
                  const std::vector<int64_t>& offsets) {
  at::Tensor from = saved;
  at::Tensor to = target;
  for (size_t d = 0; d < offsets.size(); ++d) {
    const int64_t begin = std::max(c.offsets[d], offsets[d]);
    const int64_t end = std::min(c.offsets[d] + c.sizes[d], offsets[d] + target.size(static_cast<int64_t>(d)));
    if (begin >= end) return;
    from = from.narrow(static_cast<int64_t>(d), begin - c.offsets[d], end - begin);
    to = to.narrow(static_cast<int64_t>(d), begin - offsets[d], end - begin);
  }
  at::NoGradGuard no_grad;
  to.copy_(from);
}

bool meets(const detail::Chunk& chunk, const Shard& box) {
  for (size_t d = 0; d < chunk.offsets.size(); ++d) {
    if (chunk.offsets[d] >= box.offsets[d] + box.local.size(static_cast<int64_t>(d)) ||
        box.offsets[d] >= chunk.offsets[d] + chunk.sizes[d]) {
      return false;
    }
  }
  return true;
}

// Note [A chunk read into its box]: a chunk that is the whole of the one box it meets (a DDP
// tensor, an FSDP shard saved at the same world size), of the box's dtype and contiguous on
// the CPU, is read straight into the box's memory: one read, no copy. That box, or null.
Shard* box_that_is(const detail::Chunk& chunk, at::ScalarType dtype, std::vector<Shard>& boxes) {
  Shard* met = nullptr;
  for (Shard& box : boxes) {
    if (!meets(chunk, box)) continue;
    if (met != nullptr) return nullptr;  // the chunk feeds two boxes: read it once, copy it twice
    met = &box;
  }
  if (met == nullptr || met->offsets != chunk.offsets || met->local.sizes() != c10::IntArrayRef(chunk.sizes) ||
      met->local.scalar_type() != dtype || !met->local.device().is_cpu() || !met->local.is_contiguous()) {
    return nullptr;
  }
  return met;
}

// Each saved chunk that meets one of this rank's boxes is read once and copied into every
// box it meets (FSDP's part rows and whole rows of one parameter may meet the same chunk).
void load_entry(State::Entry& e, const detail::Entry& saved, DataFiles& files) {
  if ((e.kind == State::Kind::kValue) == saved.is_tensor) {
    throw CheckpointError(str_cat(e.name, " is ", saved.is_tensor ? "a tensor" : "a value", " in the checkpoint but ",
                                  e.kind == State::Kind::kValue ? "a value" : "a tensor", " here"));
  }
  if (e.kind == State::Kind::kValue) {
    e.value = read_item(files, saved.storage[0], e.name);
    return;
  }
  if (saved.size != e.global_size) {
    throw CheckpointError(str_cat(e.name, " has size ", c10::IntArrayRef(saved.size), " in the checkpoint but ",
                                  c10::IntArrayRef(e.global_size), " here. Load it into the model it was saved from"));
  }
  for (size_t c = 0; c < saved.chunks.size(); ++c) {
    const detail::Chunk& chunk = saved.chunks[c];
    if (detail::volume(chunk.sizes) == 0 ||
        std::none_of(e.boxes.begin(), e.boxes.end(), [&](const Shard& box) { return meets(chunk, box); })) {
      continue;
    }
    Shard* const whole = box_that_is(chunk, saved.dtype, e.boxes);
    bool placed = false;
    const auto place = [&](const std::string&, at::ScalarType dtype, int64_t numel) {
      if (whole == nullptr || placed || dtype != saved.dtype || numel != whole->local.numel()) return at::Tensor();
      placed = true;
      return whole->local.detach().view({-1});
    };
    const IValue item = read_item(files, saved.storage[c], e.name, place);
    if (!item.isTensor() || item.toTensor().sizes() != c10::IntArrayRef(chunk.sizes) ||
        item.toTensor().scalar_type() != saved.dtype) {
      throw CheckpointError(str_cat(e.name, "'s chunk at ", c10::IntArrayRef(chunk.offsets), " should be a ",
                                    saved.dtype, " tensor of size ", c10::IntArrayRef(chunk.sizes),
                                    " but its bytes hold ",
                                    item.isTensor() ? str_cat(item.toTensor().scalar_type(), item.toTensor().sizes())
                                                    : datapar::detail::python_type_name(item)));
    }
    const at::Tensor& read = item.toTensor();
    if (placed && read.data_ptr() == whole->local.data_ptr() && read.strides() == whole->local.strides()) continue;
    // Placed, but the archive's tensor views its storage another way (a transposed one):
    // its elements, taken out of the box's memory before they are put back in order.
    const at::Tensor saved_chunk = placed ? read.clone() : read;
    for (Shard& box : e.boxes) {
      if (meets(chunk, box)) copy_overlap(chunk, saved_chunk, box.local, box.offsets);
    }
  }
}

// Every byte range inside its file, and every tensor no larger than the bytes its chunks
// are stored in: what load_all allocates is then bounded by the checkpoint's size.
void check_sizes(const Metadata& md, const std::string& dir) {
  std::map<std::string, int64_t> file_sizes;
  for (const detail::Entry& e : md.entries) {
    int64_t stored = 0;
    for (const detail::StorageInfo& info : e.storage) {
      auto it = file_sizes.find(info.relative_path);
      if (it == file_sizes.end()) {
        struct stat st {};
        if (::stat(join(dir, info.relative_path).c_str(), &st) != 0) {
          throw CheckpointError(str_cat("data file ", info.relative_path, " is missing (", std::strerror(errno),
                                        "): the checkpoint was not copied whole"));
        }
        if (!S_ISREG(st.st_mode)) {
          throw CheckpointError(str_cat("data file ", info.relative_path, " is not a regular file (a FIFO, device, ",
                                        "socket or directory?): refused, a checkpoint holds files only"));
        }
        it = file_sizes.emplace(info.relative_path, static_cast<int64_t>(st.st_size)).first;
      }
      if (info.offset > it->second || info.length > it->second - info.offset) {
        throw CheckpointError(str_cat("data file ", info.relative_path, " has ", it->second,
                                      " bytes, but the metadata puts ", e.fqn, " at ", info.offset, "..",
                                      info.offset + info.length, " (a truncated copy?)"));
      }
      stored += info.length;
    }
    if (e.is_tensor && detail::volume(e.size) > stored / static_cast<int64_t>(c10::elementSize(e.dtype))) {
      throw CheckpointError(str_cat(e.fqn, " claims ", detail::volume(e.size), " elements of ", e.dtype,
                                    " but its chunks are "
                                    "stored in ",
                                    stored, " bytes: the metadata is damaged"));
    }
  }
  // Every item is stored once: byte ranges that overlap would let a small checkpoint name
  // one large item many times (100 entries on one 20 MB item took 2.3 GiB to load, issue
  // 46). Without overlaps, loading reads each byte of the data files at most once.
  struct Range {
    int64_t begin, end;
    const std::string* fqn;
  };
  std::map<std::string, std::vector<Range>> files;
  for (const detail::Entry& e : md.entries) {
    for (const detail::StorageInfo& info : e.storage) {
      if (info.length > 0) files[info.relative_path].push_back({info.offset, info.offset + info.length, &e.fqn});
    }
  }
  for (auto& named : files) {
    std::vector<Range>& ranges = named.second;
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    for (size_t k = 1; k < ranges.size(); ++k) {
      const Range& before = ranges[k - 1];
      const Range& at = ranges[k];
      if (at.begin < before.end) {
        throw CheckpointError(str_cat("data file ", named.first, ": the bytes of ", *at.fqn, " (from ", at.begin,
                                      ") overlap those of ", *before.fqn, " (", before.begin, "..", before.end,
                                      "): a checkpoint stores each item once; the metadata is damaged or crafted"));
      }
    }
  }
}

Metadata read_metadata_file(const std::string& dir) {
  const std::string path = join(dir, detail::kMetadataFile);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw CheckpointError(
        str_cat(dir, ": not a directory (", std::strerror(errno), "); a DCP checkpoint is a directory"));
  }
  if (::lstat(path.c_str(), &st) != 0) {
    throw CheckpointError(
        str_cat(dir, ": no ", detail::kMetadataFile,
                " file: not a checkpoint, or an incomplete one (a save that did not finish: a rank died "
                "or the disk filled). Load the previous checkpoint"));
  }
  int64_t size = 0;
  const int fd = open_regular(path, path, &size);
  std::string bytes;
  try {
    if (size > (int64_t{1} << 30)) throw CheckpointError(str_cat(path, ": ", size, " bytes, too large for metadata"));
    bytes.resize(static_cast<size_t>(size));
    read_at(fd, 0, bytes.data(), size, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  try {
    return detail::parse_metadata(bytes.data(), bytes.size());
  } catch (const CheckpointError& e) {
    throw CheckpointError(str_cat(path, ": ", e.what(), "."));
  } catch (const c10::Error& e) {
    throw CheckpointError(str_cat(path, ": the metadata is damaged (", e.what_without_backtrace(), ")."));
  }
}

}  // namespace

// ---- State ----

State::Entry& State::add(const std::string& name, std::vector<IValue> path) {
  DATAPAR_CHECK(!name.empty(), "dcp::State: an entry needs a name");
  for (const Entry& e : entries_) DATAPAR_CHECK(e.name != name, "dcp::State: ", name, " is put twice");
  entries_.emplace_back();
  entries_.back().name = name;
  entries_.back().path = std::move(path);
  return entries_.back();
}

void State::put(const std::string& name, at::Tensor whole, std::vector<IValue> path) {
  DATAPAR_CHECK(whole.defined() && whole.layout() == at::kStrided, "dcp::State: ", name, " is not a dense tensor");
  Entry& e = add(name, std::move(path));
  e.kind = Kind::kTensor;
  e.global_size = whole.sizes().vec();
  e.dtype = whole.scalar_type();
  e.boxes = {Shard{whole, std::vector<int64_t>(whole.dim(), 0), whole.sizes().vec()}};
}

void State::put(const std::string& name, Shard shard, std::vector<IValue> path) {
  DATAPAR_CHECK(shard.local.defined(), "dcp::State: ", name, " is not a dense tensor");
  std::vector<int64_t> global_size = shard.global_size;
  const at::ScalarType dtype = shard.local.scalar_type();
  put(name, std::vector<Shard>{std::move(shard)}, std::move(global_size), dtype, std::move(path));
}

void State::put(const std::string& name, std::vector<Shard> boxes, std::vector<int64_t> global_size,
                at::ScalarType dtype, std::vector<IValue> path) {
  const size_t dims = global_size.size();
  for (const Shard& box : boxes) {
    DATAPAR_CHECK(box.local.defined() && box.local.layout() == at::kStrided, "dcp::State: ", name,
                  " is not a dense tensor");
    DATAPAR_CHECK(box.local.scalar_type() == dtype, "dcp::State: ", name, "'s boxes are ", box.local.scalar_type(),
                  " and ", dtype);
    DATAPAR_CHECK(box.offsets.size() == dims && static_cast<size_t>(box.local.dim()) == dims, "dcp::State: ", name,
                  "'s shard has ", box.local.dim(), " dimensions, offsets of ", box.offsets.size(),
                  " and a global size of ", dims);
    for (size_t d = 0; d < dims; ++d) {
      DATAPAR_CHECK(box.offsets[d] >= 0 && box.offsets[d] + box.local.size(static_cast<int64_t>(d)) <= global_size[d],
                    "dcp::State: ", name, "'s shard of size ", box.local.sizes(), " at ", c10::IntArrayRef(box.offsets),
                    " is not inside ", c10::IntArrayRef(global_size));
    }
  }
  Entry& e = add(name, std::move(path));
  e.kind = Kind::kShard;
  e.boxes = std::move(boxes);
  e.global_size = std::move(global_size);
  e.dtype = dtype;
}

void State::put(const std::string& name, IValue value, std::vector<IValue> path) {
  DATAPAR_CHECK(!value.isTensor(), "dcp::State: ", name, ": put a tensor as a tensor or a Shard, not as a value");
  Entry& e = add(name, std::move(path));
  e.kind = Kind::kValue;
  e.value = std::move(value);
}

const State::Entry& State::at(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return e;
  }
  throw InvalidArgumentError(str_cat("dcp::State has no entry ", name));
}

// ---- save ----

namespace detail {

// With a saver's memo: true, and `sp` filled, when every rank's layout is the one its last
// save had; false (the memo reset to this layout) when the plans must be exchanged again.
// Throws a directory's problem on every rank.
bool reuse_remembered_plan(const State& state, const std::string& problem, ProcessGroup* group, int world,
                           PlanMemo& memo, SavePlan& sp) {
  // Note [A plan remembered]: a saver's next save of the same layout (every save of a
  // training run: the same entries, shapes and shards, only the values new) exchanges one
  // small all_gather, each rank's [same layout as last time, the length of its directory's
  // problem], instead of every rank's plan: when every rank's layout is the one it had, so
  // is the plan. A problem's text follows only when there is one; a changed layout has
  // the plans exchanged by plan_save.
  std::string layout = layout_of(state);
  const bool same = memo.plan != nullptr && memo.layout == layout;
  std::vector<int64_t> said{same ? 1 : 0, static_cast<int64_t>(problem.size())};
  if (group != nullptr) {
    std::vector<at::Tensor> all;
    for (int r = 0; r < world; ++r) all.push_back(metadata_zeros(*group, 2, at::kLong));
    group->all_gather(all, metadata_tensor(*group, said))->wait();
    said.clear();
    for (const at::Tensor& t : all) {
      const std::vector<int64_t> v = host_int64s(t);
      said.insert(said.end(), v.begin(), v.end());
    }
  }
  bool all_same = true, any_problem = false;
  for (int r = 0; r < world; ++r) {
    all_same = all_same && said.at(2 * r) == 1;
    any_problem = any_problem || said.at(2 * r + 1) != 0;
  }
  if (any_problem) {
    const std::string first = first_error(all_gather_bytes(group, problem));
    DATAPAR_INTERNAL_ASSERT(!first.empty(), "dcp::save: a rank said it had a problem and sent none");
    throw CheckpointError(str_cat("dcp::save: ", first, "."));
  }
  if (all_same) {
    sp.plans = memo.plan->plans;
    sp.writer = memo.plan->writer;
    return true;
  }
  memo.plan = nullptr;
  memo.layout = std::move(layout);
  return false;
}

std::shared_ptr<const SavePlan> plan_save(const State& state, const std::string& dir, ProcessGroup* group,
                                          PlanMemo* memo) {
  auto made = std::make_shared<SavePlan>();
  SavePlan& sp = *made;
  sp.dir = dir;
  sp.rank = group != nullptr ? group->rank() : 0;
  const int world = group != nullptr ? group->size() : 1;

  // 1. Plans, and any problem with the directory, on every rank. The directory is opened
  // once, never through a link, and only if this user owns it; every file is written
  // relative to it (OwnedDirectory).
  std::string problem;
  sp.out = datapar::detail::OwnedDirectory::open(dir, &problem);
  if (!problem.empty()) {
    problem = str_cat("cannot write into ", dir, " (", problem, ")");
  } else if (sp.out.has(detail::kMetadataFile)) {
    problem = str_cat(dir,
                      " holds a checkpoint already; save each checkpoint into a new directory (the last good one "
                      "stays loadable if this save fails), or remove it first");
  }
  std::vector<std::vector<PlanEntry>>& plans = sp.plans;
  std::string plan_problem;
  if (memo != nullptr && reuse_remembered_plan(state, problem, group, world, *memo, sp)) return made;
  for (const std::string& bytes : all_gather_bytes(group, encode_plan(state, problem))) {
    std::string p;
    plans.push_back(decode_plan(bytes, &p));
    if (plan_problem.empty() && !p.empty()) plan_problem = str_cat("rank ", plans.size() - 1, ": ", p);
  }
  if (!plan_problem.empty()) throw CheckpointError(str_cat("dcp::save: ", plan_problem, "."));
  for (int r = 1; r < world; ++r) {
    const std::string d = disagreement(plans[0], plans[r], static_cast<size_t>(r));
    if (!d.empty()) throw InvalidArgumentError(str_cat("dcp::save: the ranks' states differ: ", d, "."));
  }

  // 2. Who writes what: every rank its shards; each whole tensor and value the rank with the
  // fewest bytes so far (PyTorch's dedup does the same), the same choice on every rank.
  const std::vector<PlanEntry>& plan = plans[0];
  std::vector<int>& writer = sp.writer;
  writer.assign(plan.size(), -1);
  std::vector<int64_t> bytes_by_rank(world, 0);
  for (int r = 0; r < world; ++r) {
    for (const PlanEntry& e : plans[r]) {
      if (e.kind == State::Kind::kShard)
        for (const detail::Chunk& box : e.boxes) {
          bytes_by_rank[r] += detail::volume(box.sizes) * static_cast<int64_t>(c10::elementSize(e.dtype));
        }
    }
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].kind == State::Kind::kShard) continue;
    writer[i] = static_cast<int>(std::min_element(bytes_by_rank.begin(), bytes_by_rank.end()) - bytes_by_rank.begin());
    bytes_by_rank[writer[i]] +=
        plan[i].kind == State::Kind::kTensor
            ? detail::volume(plan[i].global_size) * static_cast<int64_t>(c10::elementSize(plan[i].dtype))
            : 64;
  }
  if (memo != nullptr) memo->plan = made;
  return made;
}

bool writes_entry(const SavePlan& plan, size_t i) {
  return plan.plans[0].at(i).kind == State::Kind::kShard || plan.writer.at(i) == plan.rank;
}

// Rank 0's .metadata: every entry of the plan, and where each rank's `results` (its
// gathered byte ranges: entry, chunk, offset, length) put their bytes.
void write_metadata_file(const SavePlan& sp, const std::vector<std::string>& results) {
  const std::vector<PlanEntry>& plan = sp.plans[0];
  Metadata md;
  md.save_id = datapar::detail::random_hex(16);
  md.entries.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Entry& e = md.entries[i];
    e.fqn = plan[i].name;
    e.is_tensor = plan[i].kind != State::Kind::kValue;
    e.dtype = plan[i].dtype;
    e.size = plan[i].global_size;
    e.path = plan[i].path;
  }
  for (size_t r = 0; r < results.size(); ++r) {
    const IValue v = datapar::detail::torch_load_bytes(results[r].data(), results[r].size());
    for (const IValue& w : v.toListRef()[1].toListRef()) {
      const std::vector<int64_t> f = ints_of(w);
      Entry& e = md.entries[static_cast<size_t>(f[0])];
      if (e.is_tensor) e.chunks.push_back(sp.plans[r][static_cast<size_t>(f[0])].boxes.at(static_cast<size_t>(f[1])));
      e.storage.push_back(StorageInfo{data_file(static_cast<int>(r)), f[2], f[3]});
    }
  }
  datapar::detail::AtomicFile file(sp.out.fd(), sp.dir, kMetadataFile);
  const std::string bytes = write_metadata(md, sp.dir);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void write_planned(const State& state, const SavePlan& sp, ProcessGroup* group) {
  const int rank = sp.rank;
  const std::string& dir = sp.dir;
  const std::vector<PlanEntry>& plan = sp.plans[0];
  DATAPAR_CHECK(state.entries().size() == plan.size(), "dcp::save: the state has ", state.entries().size(),
                " entries, its plan ", plan.size());

  // 3. This rank's file.
  std::vector<Written> written;
  std::string error;
  try {
    datapar::detail::AtomicFile file(sp.out.fd(), dir, data_file(rank));
    int64_t offset = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      const State::Entry& e = state.entries()[i];
      if (!writes_entry(sp, i)) continue;
      const size_t items = e.kind == State::Kind::kValue ? 1 : e.boxes.size();
      for (size_t box = 0; box < items; ++box) {
        const IValue item =
            e.kind == State::Kind::kValue ? e.value : IValue(e.boxes[box].local.detach().cpu().contiguous());
        // Streamed into the file: a tensor's bytes are written from its own memory.
        const auto length = static_cast<int64_t>(
            datapar::detail::torch_save_to(item, [&file](const void* data, size_t size) { return file.write(data, size); }));
        written.push_back(Written{static_cast<int64_t>(i), static_cast<int64_t>(box), offset, length});
        offset += length;
      }
    }
    file.commit();
  } catch (const std::exception& e) {
    error = e.what();
  }

  // 4. Everyone's ranges (or errors) to everyone; rank 0 writes .metadata.
  std::vector<IValue> mine;
  for (const Written& w : written) mine.push_back(ints({w.entry, w.chunk, w.offset, w.length}));
  const std::vector<std::string> results =
      all_gather_bytes(group, datapar::detail::torch_save_bytes(list_of({error, list_of(std::move(mine))})));
  std::vector<std::string> errors;
  for (const std::string& r : results) {
    errors.push_back(datapar::detail::torch_load_bytes(r.data(), r.size()).toListRef()[0].toStringRef());
  }
  const std::string failed = first_error(errors);
  if (!failed.empty()) {
    throw CheckpointError(str_cat("dcp::save into ", dir, ": ", failed, ". The checkpoint there is incomplete (no ",
                                  detail::kMetadataFile, "); the previous one is untouched"));
  }
  std::string verdict;
  if (rank == 0) {
    try {
      write_metadata_file(sp, results);
    } catch (const std::exception& e) {
      verdict = e.what();
    }
  }
  const std::string written_metadata = all_gather_bytes(group, verdict)[0];
  if (!written_metadata.empty()) {
    throw CheckpointError(str_cat("dcp::save into ", dir, ": rank 0 could not write ", detail::kMetadataFile, ": ",
                                  written_metadata, ". The checkpoint there is incomplete"));
  }
}

}  // namespace detail

namespace {

// Fills `state` from the checkpoint `md` describes.
void fill(State& state, const Metadata& md, const std::string& dir, bool allow_partial) {
  DataFiles files(dir);
  for (State::Entry& e : state.entries()) {
    const detail::Entry* saved = md.find(e.name);
    if (saved == nullptr) {
      if (allow_partial) continue;
      throw CheckpointError(str_cat(e.name, " is not in the checkpoint (it has ", md.entries.size(),
                                    " entries); load with allow_partial to leave it as it is"));
    }
    load_entry(e, *saved, files);
  }
}

void load_state(State& state, const std::string& dir, ProcessGroup* group, bool allow_partial) {
  std::string error;
  try {
    fill(state, read_metadata_file(dir), dir, allow_partial);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::string failed = first_error(all_gather_bytes(group, error));
  if (!failed.empty()) throw CheckpointError(str_cat("dcp::load from ", dir, ": ", failed));
}

State load_all_state(const std::string& dir, ProcessGroup* group) {
  State state;
  std::string error;
  try {
    const Metadata md = read_metadata_file(dir);
    check_sizes(md, dir);  // before allocating what the metadata claims
    for (const detail::Entry& e : md.entries) {
      if (e.is_tensor) {
        state.put(e.fqn, at::empty(e.size, at::TensorOptions().dtype(e.dtype)), e.path);
      } else {
        state.put(e.fqn, IValue(), e.path);
      }
    }
    fill(state, md, dir, /*allow_partial=*/false);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::string failed = first_error(all_gather_bytes(group, error));
  if (!failed.empty()) throw CheckpointError(str_cat("dcp::load_all from ", dir, ": ", failed));
  return state;
}

}  // namespace

void save(const State& state, const std::string& dir, ProcessGroup& group) {
  detail::write_planned(state, *detail::plan_save(state, dir, &group), &group);
}
void save(const State& state, const std::string& dir) {
  detail::write_planned(state, *detail::plan_save(state, dir, nullptr), nullptr);
}
void load(State& state, const std::string& dir, ProcessGroup& group, bool allow_partial) {
  load_state(state, dir, &group, allow_partial);
}
void load(State& state, const std::string& dir, bool allow_partial) { load_state(state, dir, nullptr, allow_partial); }
State load_all(const std::string& dir, ProcessGroup& group) { return load_all_state(dir, &group); }
State load_all(const std::string& dir) { return load_all_state(dir, nullptr); }

std::vector<Shard> flat_range_boxes(const std::vector<int64_t>& sizes, int64_t begin, int64_t end) {
  std::vector<Shard> out;
  if (begin >= end) return out;
  if (sizes.empty()) {  // a scalar: [0, 1)
    out.push_back(Shard{at::Tensor(), {}, {}});
    return out;
  }
  const std::vector<int64_t> inner_sizes(sizes.begin() + 1, sizes.end());
  int64_t inner = 1;
  for (int64_t s : inner_sizes) inner *= s;
  // `rows` whole rows from `row`, or, with inner_begin/inner_end, part of one row.
  auto prefixed = [&](int64_t row, int64_t inner_begin, int64_t inner_end) {
    for (Shard& b : flat_range_boxes(inner_sizes, inner_begin, inner_end)) {
      b.offsets.insert(b.offsets.begin(), row);
      b.global_size.insert(b.global_size.begin(), 1);  // global_size holds the box's sizes here
      out.push_back(std::move(b));
    }
  };
  const int64_t first = begin / inner, last = (end - 1) / inner;
  if (first == last && !(begin % inner == 0 && end - begin == inner)) {
    prefixed(first, begin - first * inner, end - first * inner);
    return out;
  }
  int64_t whole_begin = first, whole_end = last + 1;
  if (begin % inner != 0) {
    prefixed(first, begin % inner, inner);
    whole_begin = first + 1;
  }
  const bool tail = end % inner != 0;
  if (tail) whole_end = last;
  if (whole_begin < whole_end) {
    Shard b{at::Tensor(), std::vector<int64_t>(sizes.size(), 0), sizes};
    b.offsets[0] = whole_begin;
    b.global_size[0] = whole_end - whole_begin;
    out.push_back(std::move(b));
  }
  if (tail) prefixed(last, 0, end % inner);
  return out;
}

bool is_checkpoint(const std::string& dir) noexcept { return checkpoint_problem(dir).empty(); }

std::string checkpoint_problem(const std::string& dir) noexcept {
  try {
    read_metadata_file(dir);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return dir + ": unreadable";
  }
}

std::vector<SavedEntry> saved_entries(const std::string& dir) {
  std::vector<SavedEntry> out;
  for (const detail::Entry& e : read_metadata_file(dir).entries)
    out.push_back(SavedEntry{e.fqn, e.is_tensor, e.dtype, e.size});
  return out;
}

}  // namespace datapar::dcp
