// CRC-32 checks for the records of a torch.save zip archive.
//
// Every zip entry carries the CRC-32 of its bytes, but libtorch's zip reader is built not
// to check it (miniz's MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS), so a flipped bit in a tensor
// loads as a silently wrong weight. torch_load checks each record it reads against the CRC
// in the archive's central directory, which this file reads by itself: the end-of-central-
// directory record (zip64 form too, for files over 4 GB), then one header per entry, with
// its size.
// Costs one extra pass over the bytes read (zlib's crc32: about 7 GB/s on one core of the
// development machine, where the hand-written slicing-by-8 before it gave 2.5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

namespace datapar::detail {

// CRC-32 (ISO-HDLC, as zip uses; zlib's crc32), continuing from `crc` (0 to start).
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// What the central directory says of one entry.
struct ZipEntry {
  uint32_t crc = 0;
  // The uncompressed size: the 32-bit field or, when that is the zip64 mark 0xffffffff, the
  // zip64 extra field's (0xffffffff without one). libtorch's reader allocates it before
  // reading a record, so torch_load checks it against the file's size first (a 2 KB file
  // announcing a 4 GB record).
  uint64_t size = 0;
  // Where the entry's local header starts (zip64's value where the 32-bit field is the mark)
  // and how its bytes are stored (0: as they are; torch.save stores every record so).
  uint64_t header_offset = 0;
  uint16_t method = 0;
};

// Each entry of the zip at `path`, by name without its top folder ("archive/data/0" ->
// "data/0"). Throws CheckpointError (without the path; the caller adds it) if the central
// directory cannot be found, runs past the end of the file, or names an entry twice (which
// of the two a reader finds is up to the reader).
std::unordered_map<std::string, ZipEntry> read_zip_entries(const std::string& path);

// The same for an archive held in memory, data[0, size).
std::unordered_map<std::string, ZipEntry> read_zip_entries(const char* data, size_t size);

// The same for an archive of `size` bytes read through `read_at(offset, n)`, which returns
// those n bytes (the caller checks that they lie within the archive).
std::unordered_map<std::string, ZipEntry> read_zip_entries(
    uint64_t size, const std::function<std::string(uint64_t offset, uint64_t n)>& read_at);

// Where the bytes of `entry` start: after its local header, whose 30 fixed bytes are `header`
// (read at entry.header_offset). Throws CheckpointError if they are not a local header.
uint64_t zip_data_offset(const ZipEntry& entry, const std::string& header);

}  // namespace datapar::detail
