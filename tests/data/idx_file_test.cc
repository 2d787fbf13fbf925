#include "datapar/data/idx_file.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "testing/child.h"
#include "testing/expect_throw.h"
#include "testing/idx.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar {
namespace {

using datapar::testing::read_text;

// An IDX file's bytes: big-endian magic and dims, then `payload` (or prod(dims) bytes i % 251).
std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, int64_t payload = -1) {
  std::string out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put(magic);
  int64_t n = 1;
  for (uint32_t d : dims) {
    put(d);
    n *= d;
  }
  if (payload < 0) payload = n;
  for (int64_t i = 0; i < payload; ++i) out.push_back(static_cast<char>(i % 251));
  return out;
}

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

class IdxFile : public ::testing::Test {
 protected:
  const testing::TempDir temp_{"idx"};
  const std::string& dir_ = temp_.path();
};

TEST_F(IdxFile, ReadsPlainAndGzippedFilesAlike) {
  const std::string bytes = idx_bytes(kIdxImagesMagic, {3, 4, 5});
  write_plain(dir_ + "/images", bytes);
  write_gz(dir_ + "/images.gz", bytes);
  const at::Tensor plain = read_idx_file(dir_ + "/images", 3);
  const at::Tensor gz = read_idx_file(dir_ + "/images.gz", 3);
  EXPECT_EQ(plain.sizes(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(plain.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(plain, gz));
  // Row-major bytes after the 16-byte header: element [1][2][3] is byte 1*20 + 2*5 + 3.
  EXPECT_EQ(plain[1][2][3].item<int64_t>(), 33);
  EXPECT_EQ(plain[2][3][4].item<int64_t>(), 59);

  write_gz(dir_ + "/labels.gz", idx_bytes(kIdxLabelsMagic, {7}));
  EXPECT_TRUE(at::equal(read_idx_file(dir_ + "/labels.gz", 1), at::arange(7, at::kByte)));
}

// An empty split used to train to "loss -nan" and exit 0.
TEST_F(IdxFile, ZeroSamplesAreAnError) {
  write_gz(dir_ + "/none.gz", idx_bytes(kIdxLabelsMagic, {0}));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/none.gz", 1), Error,
                   dir_ + "/none.gz: holds 0 samples (its header says so); a dataset needs at least one.");
  write_plain(dir_ + "/none", idx_bytes(kIdxImagesMagic, {0, 28, 28}));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/none", 3), Error, "none: holds 0 samples");
}

TEST_F(IdxFile, WrongMagicNamesTheFileAndBothNumbers) {
  write_gz(dir_ + "/labels.gz", idx_bytes(kIdxLabelsMagic, {10}));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/labels.gz", 3), Error,
                   dir_ + "/labels.gz: magic number is 0x00000801, expected 0x00000803");
  write_plain(dir_ + "/text", "hello, this is not an IDX file at all");
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/text", 1), Error, "magic number is 0x68656c6c, expected 0x00000801");
}

TEST_F(IdxFile, TruncatedFilesSayWhereTheyEnd) {
  // 2 images of 4x4 need 16 + 32 bytes; the file has 16 + 20.
  write_plain(dir_ + "/short", idx_bytes(kIdxImagesMagic, {2, 4, 4}, 20));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/short", 3), Error,
                   dir_ + "/short: ends early: 36 of 48 bytes (the header announces 2 samples; truncated file?)");
  write_gz(dir_ + "/short.gz", idx_bytes(kIdxImagesMagic, {2, 4, 4}, 20));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/short.gz", 3), Error, "ends early: 36 of 48 bytes");

  // A gzip stream cut in the middle: zlib's own complaint is passed on.
  write_gz(dir_ + "/cut.gz", idx_bytes(kIdxImagesMagic, {50, 28, 28}));
  const std::string whole = read_text(dir_ + "/cut.gz");
  write_plain(dir_ + "/cut.gz", whole.substr(0, whole.size() / 2));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/cut.gz", 3), Error, "unexpected end of file; truncated file?");

  write_plain(dir_ + "/header", idx_bytes(kIdxImagesMagic, {2, 4, 4}).substr(0, 10));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/header", 3), Error, "the header ends early (10 of 16 bytes");
  write_plain(dir_ + "/empty", "");
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/empty", 1), Error, dir_ + "/empty: empty (0 bytes");
}

TEST_F(IdxFile, ExtraBytesAndMissingFilesAreErrors) {
  write_gz(dir_ + "/long.gz", idx_bytes(kIdxLabelsMagic, {5}, 6));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/long.gz", 1), Error, "goes on past the 13 bytes its header announces (5 samples)");
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/missing.gz", 1), InvalidArgumentError,
                   dir_ + "/missing.gz: cannot open (No such file or directory)");
  // A flipped byte inside the compressed data fails the gzip check, not silently.
  write_gz(dir_ + "/flip.gz", idx_bytes(kIdxLabelsMagic, {1000}));
  std::string bytes = read_text(dir_ + "/flip.gz");
  bytes[bytes.size() - 6] ^= 0x5a;  // inside the CRC-32 trailer
  write_plain(dir_ + "/flip.gz", bytes);
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/flip.gz", 1), Error, "corrupt gzip data");
}

// A few hundred KB of gzip announcing (and holding) 300,000 images: a limit reads only
// what it asks for, so memory and time follow the limit, not the file.
TEST_F(IdxFile, MaxSamplesReadsOnlyTheFirstSamples) {
  const std::string big = dir_ + "/big.gz";
  testing::write_zero_idx_gz(big, kIdxImagesMagic, {300000, 28, 28});
  const testing::ChildOutcome r = testing::run_in_child(
      [&] {
        const at::Tensor t = read_idx_file(big, 3, 64);
        return std::to_string(t.size(0)) + "x" + std::to_string(t.size(1)) + "x" + std::to_string(t.size(2));
      },
      /*limit_seconds=*/20);
  ASSERT_TRUE(r.exited) << "signal " << r.signal;
  EXPECT_EQ(r.message, "64x28x28");
  EXPECT_LT(r.seconds, 2);
  EXPECT_LT(r.memory_growth, int64_t{32} << 20);  // the whole file would be 235 MB

  // The first samples are the file's first samples, and a limit past the count reads all.
  const std::string bytes = idx_bytes(kIdxImagesMagic, {5, 2, 3});
  write_gz(dir_ + "/five.gz", bytes);
  const at::Tensor all = read_idx_file(dir_ + "/five.gz", 3);
  EXPECT_TRUE(at::equal(read_idx_file(dir_ + "/five.gz", 3, 2), all.slice(0, 0, 2)));
  EXPECT_TRUE(at::equal(read_idx_file(dir_ + "/five.gz", 3, 5), all));
  EXPECT_TRUE(at::equal(read_idx_file(dir_ + "/five.gz", 3, 1000), all));
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/five.gz", 3, -1), InvalidArgumentError, "max_samples is -1");
  EXPECT_EQ(read_idx_dims(dir_ + "/five.gz", 3), (std::vector<int64_t>{5, 2, 3}));
}

// A header alone can announce 16 GiB; memory must follow the bytes that are there (found by
// idx_fuzz: a 45-byte file asked for a 4 GiB allocation). The child may map only 256 MiB
// more than it has, so an allocation of what the header says fails the test.
TEST_F(IdxFile, AHugeHeaderOverFewBytesCostsOnlyTheBytes) {
  const std::string path = dir_ + "/huge-header";
  write_gz(path, idx_bytes(kIdxImagesMagic, {4, 16384, 16384}, /*payload=*/100));
  const testing::ChildOutcome r = testing::run_in_child(
      [&] {
        std::ifstream status("/proc/self/status");
        std::string line;
        int64_t vm_kb = 0;
        while (std::getline(status, line)) {
          if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoll(line.substr(7));
        }
        const rlimit limit{static_cast<rlim_t>((vm_kb << 10) + (int64_t{256} << 20)), RLIM_INFINITY};
        ::setrlimit(RLIMIT_AS, &limit);
        try {
          read_idx_file(path, 3);
          return std::string("read");
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      },
      /*limit_seconds=*/20);
  ASSERT_TRUE(r.exited) << "signal " << r.signal;
  EXPECT_NE(r.message.find("ends early"), std::string::npos) << r.message;
}

TEST_F(IdxFile, MaxSamplesChecksWhatItReads) {
  // 4 samples announced, 2.5 present: the first 2 read; 3 end early.
  write_plain(dir_ + "/short", idx_bytes(kIdxImagesMagic, {4, 2, 2}, 10));
  EXPECT_EQ(read_idx_file(dir_ + "/short", 3, 2).size(0), 2);
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/short", 3, 3), Error,
                   "ends early: 26 of 28 bytes (the header announces 4 samples, of which the first 3 are read");
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/short", 3), Error, "ends early: 26 of 32 bytes");
  // Bytes after the samples read are not looked at; with every sample read (a limit of the
  // count or more), a byte past the data is an error as without a limit.
  write_plain(dir_ + "/long", idx_bytes(kIdxLabelsMagic, {5}, 6));
  EXPECT_EQ(read_idx_file(dir_ + "/long", 1, 4).size(0), 4);
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/long", 1, 5), Error, "goes on past the 13 bytes");
  EXPECT_THROW_MSG(read_idx_file(dir_ + "/long", 1, 6), Error, "goes on past the 13 bytes");
}

}  // namespace
}  // namespace datapar
