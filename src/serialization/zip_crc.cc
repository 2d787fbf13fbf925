// crc32 (zlib's) and read_zip_entries. See zip_crc.h. Zip layout: PKWARE's APPNOTE.TXT,
// sections 4.3.12 (central directory header), 4.3.14-4.3.16 (zip64 and plain end of central
// directory), 4.5.3 (the zip64 extended information extra field).
#include "serialization/zip_crc.h"

#include <algorithm>
#include <fstream>

#include <zlib.h>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;

// Little-endian fields; callers check bounds first.
uint64_t field(const std::string& s, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(s[at + i])) << (8 * i);
  return v;
}

[[noreturn]] void damaged(const char* what) {
  throw CheckpointError(str_cat("the zip directory is damaged (", what, ")"));
}

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  // zlib's lengths are uInt: a record over 4 GiB goes in pieces.
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, n));
    p += n, size -= n;
  }
  return crc;
}

namespace {

// `read_at(offset, n)`: n bytes of the archive from offset, or damaged() if past its end.
template <typename ReadAt>
std::unordered_map<std::string, ZipEntry> read_entries(uint64_t size, const ReadAt& read_at) {

  // The end record is the last thing in the file but for a comment of up to 64 KB.
  const uint64_t tail_size = std::min<uint64_t>(size, 22 + 0xffff);
  const std::string tail = read_at(size - tail_size, tail_size);
  size_t end = std::string::npos;
  for (size_t i = tail.size() >= 22 ? tail.size() - 22 + 1 : 0; i-- > 0;) {
    if (field(tail, i, 4) == kEndOfDirectory) {
      end = i;
      break;
    }
  }
  if (end == std::string::npos) damaged("no end record");
  uint64_t entries = field(tail, end + 10, 2);
  uint64_t directory_size = field(tail, end + 12, 4);
  uint64_t directory_offset = field(tail, end + 16, 4);
  if (entries == 0xffff || directory_size == 0xffffffff || directory_offset == 0xffffffff) {
    const uint64_t end_offset = size - tail_size + end;
    if (end_offset < 20) damaged("no zip64 locator");
    const std::string locator = read_at(end_offset - 20, 20);
    if (field(locator, 0, 4) != kZip64Locator) damaged("no zip64 locator");
    const std::string zip64 = read_at(field(locator, 8, 8), 56);
    if (field(zip64, 0, 4) != kZip64End) damaged("no zip64 end record");
    entries = field(zip64, 32, 8);
    directory_size = field(zip64, 40, 8);
    directory_offset = field(zip64, 48, 8);
  }

  const std::string directory = read_at(directory_offset, directory_size);
  std::unordered_map<std::string, ZipEntry> found;
  size_t pos = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (directory.size() - pos < 46 || field(directory, pos, 4) != kCentralHeader) damaged("a bad entry header");
    const size_t name = field(directory, pos + 28, 2);
    const size_t extra = field(directory, pos + 30, 2);
    const size_t rest = name + extra + field(directory, pos + 32, 2);
    if (directory.size() - pos - 46 < rest) damaged("an entry runs past the directory");
    const std::string full = directory.substr(pos + 46, name);
    const size_t slash = full.find('/');
    // What libtorch's zip reader (miniz) refuses, refused here too: an encrypted entry, or one
    // on another disk of a multi-disk archive (a flipped bit of the directory, in practice).
    if (field(directory, pos + 8, 2) & 1) damaged("an encrypted entry");
    if (field(directory, pos + 34, 2) != 0) damaged("an entry on another disk");
    ZipEntry entry;
    entry.method = static_cast<uint16_t>(field(directory, pos + 10, 2));
    entry.crc = static_cast<uint32_t>(field(directory, pos + 16, 4));
    const uint64_t compressed = field(directory, pos + 20, 4);
    entry.size = field(directory, pos + 24, 4);
    entry.header_offset = field(directory, pos + 42, 4);
    if (entry.size == 0xffffffff || compressed == 0xffffffff || entry.header_offset == 0xffffffff) {
      // The zip64 extra field (id 1) holds, in this order, 8 bytes for each of the
      // uncompressed size, the compressed size and the local header's offset whose 32-bit
      // field is the mark: the values a zip reader (libtorch's miniz) takes.
      for (size_t at = pos + 46 + name; at + 4 <= pos + 46 + name + extra;) {
        const uint64_t id = field(directory, at, 2), length = field(directory, at + 2, 2);
        if (at + 4 + length > pos + 46 + name + extra) break;
        if (id == 1) {
          size_t value = at + 4;
          const auto take = [&](uint64_t* out) {
            if (value + 8 > at + 4 + length) damaged("a short zip64 field");
            *out = field(directory, value, 8);
            value += 8;
          };
          uint64_t ignored = 0;
          if (entry.size == 0xffffffff) take(&entry.size);
          if (compressed == 0xffffffff) take(&ignored);
          if (entry.header_offset == 0xffffffff) take(&entry.header_offset);
        }
        at += 4 + length;
      }
    }
    if (!found.emplace(slash == std::string::npos ? full : full.substr(slash + 1), entry).second) {
      damaged("an entry is named twice");
    }
    pos += 46 + rest;
  }
  return found;
}

}  // namespace

std::unordered_map<std::string, ZipEntry> read_zip_entries(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  return read_entries(size, [&](uint64_t offset, uint64_t n) {
    if (!in || offset > size || n > size - offset) damaged("it points past the end of the file");
    std::string out(n, '\0');
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(&out[0], static_cast<std::streamsize>(n));
    if (!in) damaged("a read failed");
    return out;
  });
}

std::unordered_map<std::string, ZipEntry> read_zip_entries(
    uint64_t size, const std::function<std::string(uint64_t offset, uint64_t n)>& read_at) {
  return read_entries(size, read_at);
}

uint64_t zip_data_offset(const ZipEntry& entry, const std::string& header) {
  if (header.size() < 30 || field(header, 0, 4) != kLocalHeader) damaged("an entry's local header is missing");
  return entry.header_offset + 30 + field(header, 26, 2) + field(header, 28, 2);
}

std::unordered_map<std::string, ZipEntry> read_zip_entries(const char* data, size_t size) {
  return read_entries(size, [&](uint64_t offset, uint64_t n) {
    if (offset > size || n > size - offset) damaged("it points past the end of the archive");
    return std::string(data + offset, n);
  });
}

}  // namespace datapar::detail
