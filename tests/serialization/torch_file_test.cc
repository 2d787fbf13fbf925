// torch_save / torch_load and their parts: what round-trips, what is refused, and that no
// input, however damaged, does more than throw CheckpointError.
#include "serialization/torch_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>

#include "child_process.h"
#include "datapar/error.h"
#include "serialization/atomic_file.h"
#include "serialization/pickle_reader.h"
#include "serialization/pickle_writer.h"
#include "serialization/zip_crc.h"
#include "testing/child.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"
#include "file_system.h"
#include "testing/text.h"

namespace datapar::detail {
namespace {

using datapar::testing::read_text;
using c10::IValue;
using Dict = c10::impl::GenericDict;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

Dict sample() {
  Dict d(c10::AnyType::get(), c10::AnyType::get());
  d.insert("none", IValue());
  d.insert("yes", true);
  d.insert("small", int64_t{7});
  d.insert("negative", int64_t{-300});
  d.insert("wide", int64_t{70000});
  d.insert("huge", int64_t{-(int64_t{1} << 40)});
  d.insert("pi", 3.25);
  d.insert("text", std::string("unicode \xc3\xa9"));
  Dict by_int(c10::AnyType::get(), c10::AnyType::get());
  by_int.insert(int64_t{3}, at::arange(6, at::kLong).view({2, 3}));
  d.insert("by_int", by_int);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(std::string("two"));
  d.insert("list", list);
  d.insert("tuple", c10::ivalue::Tuple::create(std::vector<IValue>{0.5, int64_t{2}}));
  d.insert("empty", Dict(c10::AnyType::get(), c10::AnyType::get()));
  return d;
}

TEST(CheckpointFile, RoundTripsValuesAndEveryDtype) {
  Dict d = sample();
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                           at::kByte, at::kBool}) {
    d.insert(std::string("t_") + c10::toString(t), (at::arange(12) % 5).to(t).view({3, 4}));
  }
  d.insert("scalar", at::scalar_tensor(2.5));
  d.insert("zero_size", at::empty({0, 4}));
  const at::Tensor base = at::arange(20, at::kFloat).view({4, 5});
  d.insert("view", base.t().slice(0, 1, 3));  // non-contiguous, offset: saved compact
  const std::string path = temp_path("values.pt");
  torch_save(d, path);

  const Dict back = torch_load(path).toGenericDict();
  ASSERT_EQ(back.size(), d.size());
  for (const auto& e : d) {
    const IValue& got = back.at(e.key());
    if (e.value().isTensor()) {
      EXPECT_EQ(got.toTensor().scalar_type(), e.value().toTensor().scalar_type()) << e.key();
      EXPECT_TRUE(at::equal(got.toTensor(), e.value().toTensor())) << e.key();
    } else if (e.key() == "by_int") {
      EXPECT_TRUE(at::equal(got.toGenericDict().at(int64_t{3}).toTensor(), at::arange(6, at::kLong).view({2, 3})));
    } else {
      EXPECT_EQ(got, e.value()) << e.key();
    }
  }
  // Keys keep their order.
  std::vector<std::string> want, have;
  for (const auto& e : d) want.push_back(e.key().toStringRef());
  for (const auto& e : back) have.push_back(e.key().toStringRef());
  EXPECT_EQ(have, want);
}

TEST(CheckpointFile, ReadsWhatLibtorchsPickleSaveWrote) {
  // Files of the earlier save_state_dict (torch::jit::pickle_save, with type tags).
  c10::Dict<std::string, at::Tensor> d;
  d.insert("w", at::randn({3, 2}));
  d.insert("b", at::randn({2}));
  const std::vector<char> bytes = torch::jit::pickle_save(d);
  const std::string path = temp_path("pickle_save.pt");
  write_all(path, std::string(bytes.begin(), bytes.end()));
  const Dict back = torch_load(path).toGenericDict();
  EXPECT_TRUE(at::equal(back.at("w").toTensor(), d.at("w")));
  EXPECT_TRUE(at::equal(back.at("b").toTensor(), d.at("b")));
}

TEST(CheckpointFile, RefusesWhatItCannotSave) {
  EXPECT_THROW_MSG(torch_save(IValue(c10::Device(c10::kCPU)), temp_path("device.pt")), InvalidArgumentError, "cannot save a Device");
  Dict d(c10::AnyType::get(), c10::AnyType::get());
  d.insert(at::ones({1}), int64_t{1});
  EXPECT_THROW_MSG(torch_save(d, temp_path("tensor_key.pt")), InvalidArgumentError, "a dict key is a Tensor");
}

TEST(CheckpointFile, DamagedFilesNameThePathAndTheProblem) {
  const std::string path = temp_path("damaged.pt");
  Dict d = sample();
  d.insert("big", at::randn({1000}));
  torch_save(d, path);
  const std::string good = read_text(path);

  write_all(path, good.substr(0, good.size() / 2));
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, path + ": cannot read");
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, "truncated");
  write_all(path, "");
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, "empty");
  std::mt19937 rng(5);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  write_all(path, noise);
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, "not a torch.save file");
  write_all(path, std::string("\x80\x02\x8a\x0a", 4) + noise);
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, "legacy torch.save format");
  EXPECT_THROW_MSG(torch_load(temp_path("missing.pt")), CheckpointError, "cannot open");
  EXPECT_THROW_MSG(torch_load(::testing::TempDir()), CheckpointError, "is a directory");

  // A flipped bit inside a tensor's bytes: the record's CRC-32 no longer matches.
  write_all(path, good);
  const size_t offset = caffe2::serialize::PyTorchStreamReader(path).getRecordOffset("data/1");  // "big"
  std::string flipped = good;
  flipped[offset + 100] ^= 0x10;
  write_all(path, flipped);
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, "damaged");

  // The central directory's entry for a record, patched: found by its name.
  auto patch_entry = [&](const std::string& suffix, const std::function<void(std::string&, size_t)>& patch) {
    std::string bytes = good;
    for (size_t at = bytes.find("PK\x01\x02"); at != std::string::npos; at = bytes.find("PK\x01\x02", at + 1)) {
      const size_t name_length = uint8_t(bytes[at + 28]) | uint8_t(bytes[at + 29]) << 8;
      const std::string name = bytes.substr(at + 46, name_length);
      if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        patch(bytes, at);
        return bytes;
      }
    }
    ADD_FAILURE() << "no directory entry ends with " << suffix;
    return bytes;
  };
  // A record that claims 4 GiB in a small file (fuzzing found it: libtorch's reader would
  // allocate the claimed size before reading a byte): refused before any allocation.
  write_all(path, patch_entry("/data.pkl", [](std::string& b, size_t at) { b.replace(at + 24, 4, "\xff\xff\xff\xff"); }));
  EXPECT_THROW_MSG(torch_load(path), CheckpointError,
                   "record data.pkl claims 4294967295 bytes, more than the whole file (" + std::to_string(good.size()));
  // When the entry's 32-bit size is 0xffffffff, the size in its zip64 extra field counts, as
  // zip readers (libtorch's too) take it: the real size loads, a claimed 5 GiB is refused.
  auto le = [](const std::string& b, size_t at, size_t width) {
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v |= uint64_t(uint8_t(b[at + i])) << (8 * i);
    return v;
  };
  auto put_le = [](std::string& b, size_t at, size_t width, uint64_t v) {
    for (size_t i = 0; i < width; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
  };
  auto with_zip64_size = [&](uint64_t size) {
    std::string extra("\x01\x00\x08\x00", 4);  // id 1, 8 bytes: the uncompressed size
    extra.resize(12);
    put_le(extra, 4, 8, size);
    std::string bytes = patch_entry("/data.pkl", [&](std::string& b, size_t at) {
      EXPECT_EQ(le(b, at + 30, 2), 0u) << "torch_save's entries have no extra field";
      put_le(b, at + 24, 4, 0xffffffff);
      put_le(b, at + 30, 2, extra.size());
      b.insert(at + 46 + le(b, at + 28, 2), extra);
    });
    // The directory grew: its size in both end records, and where the zip64 one starts.
    const size_t zip64_end = bytes.rfind("PK\x06\x06"), locator = bytes.rfind("PK\x06\x07");
    const size_t end = bytes.rfind("PK\x05\x06");
    put_le(bytes, zip64_end + 40, 8, le(bytes, zip64_end + 40, 8) + extra.size());
    put_le(bytes, locator + 8, 8, le(bytes, locator + 8, 8) + extra.size());
    put_le(bytes, end + 12, 4, le(bytes, end + 12, 4) + extra.size());
    return bytes;
  };
  uint64_t pickle_size = 0;
  patch_entry("/data.pkl", [&](std::string& b, size_t at) { pickle_size = le(b, at + 24, 4); });
  write_all(path, with_zip64_size(pickle_size));
  EXPECT_EQ(torch_load(path).toGenericDict().size(), d.size());
  // A claimed 5 GiB is refused before it is allocated: by torch_load's check (libtorch 1.13)
  // or, in libtorch 2.x, already by its zip reader, which compares the sizes with the file's
  // when it opens it.
  write_all(path, with_zip64_size(uint64_t(5) << 30));
  const std::string claims =
      "record data.pkl claims 5368709120 bytes, more than the whole file (" + std::to_string(good.size() + 12);
#if TORCH_VERSION_MAJOR < 2
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, claims);
#else
  try {
    torch_load(path);
    ADD_FAILURE() << "a record claiming 5 GiB was loaded";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
    EXPECT_TRUE(what.find(claims) != std::string::npos || what.find(path + ": cannot read") == 0) << what;
  }
#endif
  // Two entries with one name: which one a reader finds is up to the reader.
  write_all(path, patch_entry("/data/0", [](std::string& b, size_t at) {
    const size_t name_length = uint8_t(b[at + 28]) | uint8_t(b[at + 29]) << 8;
    b[at + 46 + name_length - 1] = '1';
  }));
  EXPECT_THROW_MSG(torch_load(path), CheckpointError, "an entry is named twice");
}

TEST(CheckpointFile, Crc32MatchesZlib) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  const std::string text(1000, 'q');
  EXPECT_EQ(crc32(text.data() + 3, 997, crc32(text.data(), 3)), crc32(text.data(), 1000));  // resumable
  EXPECT_EQ(crc32(nullptr, 0), 0u);
}

// Recorded from the hand-written CRC-32 it used before zlib's (issue 51), and checked with
// Python's zlib.crc32: a long buffer, and pieces starting at odd offsets and from a given CRC,
// as the CRCs of archives written by the previous version were computed.
TEST(CheckpointFile, Crc32AsRecorded) {
  std::string data(100003, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7 + i / 251) & 0xff);
  EXPECT_EQ(crc32(data.data(), data.size()), 0xeb903f59u);
  EXPECT_EQ(crc32(data.data() + 5, 1001), 0x0cd48693u);
  EXPECT_EQ(crc32(data.data() + 3, 13, 0x12345678u), 0x6f1e05a1u);
}

// Every prefix and many one-byte corruptions of a real data.pkl: the machine throws
// CheckpointError or returns a value, and never crashes or throws anything else.
TEST(CheckpointFile, PickleReaderSurvivesTruncationAndCorruption) {
  Dict d = sample();
  d.insert("t", at::randn({4, 3}));
  std::vector<at::Tensor> storages;
  const std::string pickle = write_pickle(d, &storages);
  StorageLoader load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    if (key.empty() || key.size() > 3 || key.find_first_not_of("0123456789") != std::string::npos) {
      throw CheckpointError("bad key");
    }
    const size_t i = std::stoul(key);
    if (i >= storages.size() || storages[i].scalar_type() != dtype || storages[i].numel() != numel) {
      throw CheckpointError("storage mismatch");
    }
    return storages[i];
  };
  const IValue back = read_pickle(pickle.data(), pickle.size(), load);
  EXPECT_TRUE(at::equal(back.toGenericDict().at("t").toTensor(), d.at("t").toTensor()));

  int refused = 0;
  for (size_t n = 0; n < pickle.size(); ++n) {
    try {
      read_pickle(pickle.data(), n, load);
    } catch (const CheckpointError&) {
      ++refused;
    }
  }
  EXPECT_EQ(refused, static_cast<int>(pickle.size()));  // no prefix is a whole pickle
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = pickle;
    bad[rng() % bad.size()] = static_cast<char>(rng());
    try {
      read_pickle(bad.data(), bad.size(), load);
    } catch (const CheckpointError&) {
    }
  }
}

// Issue 50: torch_load_archive reads an archive record by record (a DCP item in a data
// file): a storage goes into the tensor the caller places it in (the loaded tensor is a view
// of it, wherever in its storage it starts) or into a new one; torch_save_to streams the bytes
// torch_save_bytes returns, and a contiguous view is saved as its own elements, not its
// storage's. Every truncation and many flipped bytes: CheckpointError, never a crash.
TEST(CheckpointFile, AnArchiveReadRecordByRecordPutsEachStorageWhereItIsPlaced) {
  const at::Tensor flat = at::arange(1000000, at::kFloat);
  Dict d(c10::AnyType::get(), c10::AnyType::get());
  d.insert("w", at::randn({3, 4}));
  d.insert("b", at::arange(5, at::kLong));
  d.insert("view", flat.narrow(0, 10, 6));
  d.insert("step", int64_t{17});
  const std::string bytes = torch_save_bytes(d);
  EXPECT_LT(bytes.size(), 4096u) << "the view was saved with the whole of its storage";
  std::string streamed;
  EXPECT_EQ(torch_save_to(d, [&](const void* data, size_t size) {
              streamed.append(static_cast<const char*>(data), size);
              return size;
            }),
            bytes.size());
  EXPECT_EQ(streamed, bytes);

  const ArchiveRead read = [&](uint64_t offset, char* out, uint64_t n) {
    ASSERT_LE(offset + n, bytes.size());
    std::memcpy(out, bytes.data() + offset, n);
  };
  at::Tensor target = at::zeros({20});  // w goes to elements 4..15
  const StoragePlace place = [&](const std::string&, at::ScalarType dtype, int64_t numel) {
    return dtype == at::kFloat && numel == 12 ? target.narrow(0, 4, 12) : at::Tensor();
  };
  const Dict back = torch_load_archive(bytes.size(), read, place).toGenericDict();
  const at::Tensor w = back.at("w").toTensor();
  EXPECT_EQ(w.data_ptr(), target.narrow(0, 4, 12).data_ptr());
  EXPECT_TRUE(at::equal(w, d.at("w").toTensor()));
  EXPECT_TRUE(at::equal(target.narrow(0, 4, 12).view({3, 4}), d.at("w").toTensor()));
  EXPECT_EQ(target[3].item<float>(), 0.0f);
  EXPECT_EQ(target[16].item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(back.at("b").toTensor(), d.at("b").toTensor()));
  EXPECT_TRUE(at::equal(back.at("view").toTensor(), flat.narrow(0, 10, 6)));
  EXPECT_EQ(back.at("step").toInt(), 17);

  const StoragePlace wrong = [](const std::string&, at::ScalarType, int64_t) { return at::zeros({2}, at::kDouble); };
  EXPECT_THROW_MSG(torch_load_archive(bytes.size(), read, wrong), InvalidArgumentError, "was placed in a Double tensor");
  std::string damaged = bytes;
  damaged[damaged.find("PK\x07\x08") - 1] ^= 0x10;  // the first record's last byte, before its data descriptor
  const ArchiveRead read_damaged = [&](uint64_t offset, char* out, uint64_t n) {
    std::memcpy(out, damaged.data() + offset, n);
  };
  EXPECT_THROW_MSG(torch_load_archive(damaged.size(), read_damaged, nullptr), CheckpointError, "its CRC-32 does not match");

  int refused = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      torch_load_archive(n, read, nullptr);
    } catch (const CheckpointError&) {
      ++refused;
    }
  }
  EXPECT_EQ(refused, static_cast<int>(bytes.size()));  // no prefix is a whole archive
  std::mt19937 rng(50);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bad = bytes;
    bad[rng() % bad.size()] = static_cast<char>(rng());
    try {
      torch_load_archive(bad.size(), [&](uint64_t offset, char* out, uint64_t n) {
        std::memcpy(out, bad.data() + offset, n);
      }, nullptr);
    } catch (const CheckpointError&) {
    }
  }
}

TEST(CheckpointFile, RefusesPythonObjectsItDoesNotKnow) {
  // A pickle that would call os.system in Python: GLOBAL 'os system', ('echo',), REDUCE.
  const char program[] = "\x80\x02" "cos\nsystem\n" "X\x04\0\0\0echo" "\x85R.";
  const std::string evil(program, sizeof program - 1);
  StorageLoader none = [](const std::string&, at::ScalarType, int64_t) -> at::Tensor { throw CheckpointError("no storage"); };
  EXPECT_THROW_MSG(read_pickle(evil.data(), evil.size(), none), CheckpointError, "calls os.system, which datapar does not read");
}

// Note [Atomic file write], step by step: a writer that dies before the rename leaves the
// old file whole, whether it exits or is killed.
TEST(CheckpointFile, AtomicFileKeepsTheOldFileWhenTheWriterDies) {
  const testing::TempDir temp("atomic");
  const std::string path = temp.path() + "/atomic.pt";
  torch_save(IValue(std::string("old")), path);
  for (int how : {0, SIGKILL}) {
    const pid_t pid = detail::fork_child([&] {
      AtomicFile file(path);
      const std::string junk(1 << 16, 'x');
      file.write(junk.data(), junk.size());
      if (how == SIGKILL) ::raise(SIGKILL);
      std::_Exit(0);  // no destructor, no commit: like a crash between write and rename
      return 0;
    });
    const detail::ChildExit exit = detail::wait_child(pid);
    ASSERT_EQ(exit.signal, how);
    EXPECT_EQ(torch_load(path).toStringRef(), "old");
    // The interrupted write, left aside under its temporary name...
    const std::string dir = detail::parent_directory(path);
    std::vector<std::string> left;
    for (const std::string& name : detail::list_directory(dir)) {
      if (name.rfind(".atomic.pt.tmp.", 0) == 0) left.push_back(name);
    }
    ASSERT_EQ(left.size(), 1u);
    EXPECT_TRUE(is_atomic_temp_name(left[0]));
    EXPECT_NE(left[0].find("." + std::to_string(pid) + "-"), std::string::npos) << left[0];
    EXPECT_EQ(read_text(dir + "/" + left[0]).size(), size_t{1} << 16);
    // ...which the next write of the file removes: its writer is gone.
    torch_save(IValue(std::string("old")), path);
    EXPECT_FALSE(detail::exists(dir + "/" + left[0]));
  }
  torch_save(IValue(std::string("new")), path);
  EXPECT_EQ(torch_load(path).toStringRef(), "new");
  EXPECT_FALSE(is_atomic_temp_name("atomic.pt"));
  EXPECT_TRUE(is_atomic_temp_name("atomic.pt.tmp.123"));  // earlier versions' names
  EXPECT_THROW_MSG(AtomicFile("/nonexistent-dir/x.pt"), CheckpointError, "cannot create");
}

// ---- Budgets (issue 13): hostile data.pkl programs fail with a CheckpointError naming the
// limit, quickly and in bounded memory, never crash ----

const std::string kProto("\x80\x02", 2);

// Memory bounds measured in a child hold for the real allocator; AddressSanitizer's adds
// redzones to every block and keeps up to 256 MiB of freed ones in quarantine (the asan
// line of make test). The budget itself is the same there: the charges are estimates.
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kAllocatorSlack = 3;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int64_t kAllocatorSlack = 3;
#else
constexpr int64_t kAllocatorSlack = 1;
#endif
#else
constexpr int64_t kAllocatorSlack = 1;
#endif

IValue run_pickle(const std::string& program) {
  StorageLoader none = [](const std::string&, at::ScalarType, int64_t) -> at::Tensor { throw CheckpointError("no storage"); };
  return read_pickle(program.data(), program.size(), none);
}

// run_pickle in a child process (limit 20 s): its message, "loaded", or the signal that
// ended it, with its time and memory growth.
testing::ChildOutcome run_pickle_in_child(const std::string& program) {
  return testing::run_in_child(
      [&] {
        try {
          run_pickle(program);
          return std::string("loaded");
        } catch (const CheckpointError& e) {
          return std::string(e.what());
        }
      },
      /*limit_seconds=*/20);
}

// The bytes of a string literal, NULs included.
template <size_t N>
std::string bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// Each program nests a million containers, which used to end in SIGSEGV (recursion per
// level while building, and when the IValues were destroyed).
TEST(TorchFileLimits, AMillionNestedContainersAreRefusedNotACrash) {
  const size_t n = 1000000;
  const std::string lists = kProto + std::string(n, ']') + std::string(n - 1, 'a') + ".";       // [[[...]]]
  const std::string tuples = kProto + ")" + std::string(n, '\x85') + ".";                        // ((((),),),)
  const std::string marked = kProto + std::string(n, '(') + ")" + std::string(n, 't') + ".";     // MARK ... TUPLE
  const std::string dicts = kProto + repeat(bytes("}K\x00"), n) + "N" + std::string(n, 's') + ".";  // {0: {0: ...}}
  const std::string nesting = "data.pkl: nesting deeper than 200 levels (datapar's limit for a checkpoint) at byte ";
  // The million lists and dicts lie on the stack before anything nests them: the memory
  // budget (Note [Pickle budget], 4) stops them first, about halfway.
  const std::string memory = "MiB of memory to hold what it describes (64 bytes per byte of data.pkl plus 64 MiB";
  for (const auto& [program, message] : {std::make_pair(&lists, memory), std::make_pair(&tuples, nesting),
                                         std::make_pair(&marked, nesting), std::make_pair(&dicts, memory)}) {
    EXPECT_THROW_MSG(run_pickle(*program), CheckpointError, message);
  }
}

// Issue 27: a flat flood of empty containers stays under the value budget but cost 2.3 GB
// (4 million empty dicts in a 9 MB list) and 1 GB (lists) before it was refused. Memory is
// charged as it is built (Note [Pickle budget], 4): at most 64 bytes per byte of data.pkl
// plus 64 MiB.
TEST(TorchFileLimits, AFloodOfEmptyContainersCostsAtMostItsMemoryBudget) {
  const size_t n = 4000000;
  auto flood = [&](const std::string& one) {  // [one, one, ...] in APPENDS batches of 1000, as Python's pickler
    std::string program = kProto + "]";
    for (size_t i = 0; i < n; i += 1000) program += "(" + repeat(one, 1000) + "e";
    return program + ".";
  };
  for (const std::string one : {std::string("}"), std::string("]"), std::string(")")}) {
    const std::string program = flood(one);
    const testing::ChildOutcome r = run_pickle_in_child(program);
    ASSERT_TRUE(r.exited) << "ended by signal " << r.signal << " after " << r.seconds << " s";
    EXPECT_NE(r.message.find("MiB of memory to hold what it describes (64 bytes per byte of data.pkl plus 64 MiB; "
                             "datapar's limit for a checkpoint)"),
              std::string::npos)
        << one << ": " << r.message;
    const int64_t budget = static_cast<int64_t>(program.size()) * 64 + (int64_t{64} << 20);
    EXPECT_LT(r.memory_growth, budget * kAllocatorSlack) << one;
  }
}

// Issue 46: opcodes that make nothing raised the budget for free (64 bytes per byte of the
// file): 48 MB of PROTO and FRAME opcodes before the flood above let it through (2.6 GB,
// exit 0). Each padding is now charged what it brings (Note [Pickle budget], 5), so the
// flood is refused where it was without padding, whatever pads it.
TEST(TorchFileLimits, PaddingThatMakesNothingDoesNotRaiseTheMemoryBudget) {
  const size_t n = 4000000;
  std::string flood = "]";
  for (size_t i = 0; i < n; i += 1000) flood += "(" + repeat("}", 1000) + "e";
  const std::string frame = std::string("\x95") + std::string(8, '\0');  // FRAME of length 0
  const std::map<std::string, std::string> paddings = {
      {"PROTO and FRAME", repeat(kProto + frame, size_t{48} << 20 >> 4)},  // 48 MB
      {"NONE and POP", repeat("N0", size_t{24} << 20)},
      {"DUP and POP after a value", "N" + repeat("20", size_t{24} << 20) + "0"},
      {"MARK and POP_MARK", repeat("(1", size_t{24} << 20)},
      {"BINPUT over one entry", "Nq\x00" + repeat("q\x00", size_t{16} << 20) + "0"},
  };
  for (const auto& [name, padding] : paddings) {
    const std::string program = kProto + padding + flood + ".";
    const testing::ChildOutcome r = run_pickle_in_child(program);
    ASSERT_TRUE(r.exited) << name << ": ended by signal " << r.signal << " after " << r.seconds << " s";
    EXPECT_NE(r.message.find("MiB of memory to hold what it describes"), std::string::npos) << name << ": "
                                                                                               << r.message;
    // The flood's own budget: what its bytes bring, as without the padding.
    const int64_t budget = static_cast<int64_t>(flood.size()) * 64 + (int64_t{64} << 20);
    EXPECT_LT(r.memory_growth, budget * kAllocatorSlack) << name;
  }
}

TEST(TorchFileLimits, NestingUpToTheLimitLoads) {
  IValue v = run_pickle(kProto + std::string(200, ']') + std::string(199, 'a') + ".");
  int depth = 0;
  for (; v.isList(); ++depth) v = v.toListRef().empty() ? IValue() : v.toListRef()[0];
  EXPECT_EQ(depth, 200);
  EXPECT_THROW_MSG(run_pickle(kProto + std::string(201, ']') + std::string(200, 'a') + "."), CheckpointError,
                   "nesting deeper than 200 levels");
  EXPECT_EQ(run_pickle(kProto + ")" + std::string(199, '\x85') + ".").toTupleRef().elements().size(), 1u);
}

// t0 = (); t_k = (t_{k-1}, t_{k-1}), each through the memo: 244 bytes that describe 2^35
// tuples. The reader used to copy each memo entry whole and grew by ~250 MB/s.
TEST(TorchFileLimits, MemoisedTupleBombFailsFastInBoundedMemory) {
  std::string program = kProto + ")\x94";
  for (int k = 1; k <= 34; ++k) {
    const std::string get = std::string("h") + static_cast<char>(k - 1);
    program += get + get + "\x86\x94" + (k < 34 ? "0" : "");  // BINGET BINGET TUPLE2 MEMOIZE [POP]
  }
  program += ".";
  EXPECT_LT(program.size(), 250u);
  const testing::ChildOutcome r = run_pickle_in_child(program);
  ASSERT_TRUE(r.exited) << "ended by signal " << r.signal << " after " << r.seconds << " s";
  EXPECT_NE(r.message.find("data.pkl: more than 4194304 values (counting each reference to a shared one; datapar's "
                           "limit for a checkpoint)"),
            std::string::npos)
      << r.message;
  EXPECT_LT(r.seconds, 5);
  EXPECT_LT(r.memory_growth, int64_t{256} << 20);
}

// NaN dict keys: each is unequal to every other, and all have one hash, so every insert
// collided and the hash table doubled until a 125-byte file (libFuzzer, pickle_fuzz after
// 2.2M runs) asked for 448 MiB. Refused: a NaN key can never be looked up.
TEST(TorchFileLimits, NanDictKeysAreRefusedNotAMemoryBomb) {
  const std::string nan = std::string("G\x7f\xf8") + std::string(6, '\0');  // BINFLOAT nan
  const std::string program = kProto + "}(" + nan + repeat("2", 63) + "u.";      // {nan: nan, ...} by DUP
  const testing::ChildOutcome r = run_pickle_in_child(program);
  ASSERT_TRUE(r.exited) << "ended by signal " << r.signal << " after " << r.seconds << " s";
  EXPECT_NE(r.message.find("a dict key is NaN"), std::string::npos) << r.message;
  EXPECT_LT(r.memory_growth, int64_t{64} << 20);
  // Other float keys still load.
  const std::string one = std::string("G\x3f\xf0") + std::string(6, '\0');  // BINFLOAT 1.0
  EXPECT_EQ(run_pickle(kProto + "}(" + one + "K\x07u.").toGenericDict().at(1.0).toInt(), 7);
}

// A list or dict inside itself (Python's pickler writes one for l = []; l.append(l)):
// refused, since no state dict has one and every walk over it would never end.
TEST(TorchFileLimits, ContainersInsideThemselvesAreRefused) {
  const std::string programs[] = {
      bytes("]\x94h\x00" "a."),       // EMPTY_LIST MEMOIZE BINGET 0 APPEND
      bytes("]\x94(h\x00" "e."),      // EMPTY_LIST MEMOIZE MARK BINGET 0 APPENDS
      bytes("}\x94K\x01h\x00s."),     // EMPTY_DICT MEMOIZE BININT1 1 BINGET 0 SETITEM
  };
  for (const std::string& program : programs) {
    EXPECT_THROW_MSG(run_pickle(kProto + program), CheckpointError, "inside itself");
  }
}

// Python's pickler fills a list or dict before it puts it into another: changing one
// afterwards is not a torch.save file (and is how a cycle would be built).
TEST(TorchFileLimits, ChangingAContainerAfterNestingItIsRefused) {
  // L0 = []; [L0]; then L0.append(1)
  EXPECT_THROW_MSG(run_pickle(kProto + bytes("]\x94]h\x00" "a0K\x01" "a.")), CheckpointError,
                   "APPEND on a list that is already inside another container");
  // L0 = []; (L0,); then L0.append(1)
  EXPECT_THROW_MSG(run_pickle(kProto + bytes("]\x94h\x00\x85" "0K\x01" "a.")), CheckpointError,
                   "APPEND on a list that is already inside another container");
  // D0 = {}; [D0]; then D0[1] = 2
  EXPECT_THROW_MSG(run_pickle(kProto + bytes("}\x94]h\x00" "a0K\x01K\x02s.")), CheckpointError,
                   "SETITEM on a dict that is already inside another container");
  // Shared, but filled first: fine, and both references are one list.
  const IValue ok = run_pickle(kProto + bytes("]\x94K\x07" "a0(h\x00h\x00t."));
  EXPECT_EQ(ok.toTupleRef().elements()[0].toListRef()[0].toInt(), 7);
  EXPECT_TRUE(ok.toTupleRef().elements()[0].isSameIdentity(ok.toTupleRef().elements()[1]));
}

}  // namespace
}  // namespace datapar::detail
