// CRC-32 checks for the records of a torch.save zip archive.
//
// Every zip entry carries the CRC-32 of its bytes, but libtorch's zip reader is built not
// to check it (miniz's MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS), so a flipped bit in a tensor
// loads as a silently wrong weight. torch_load checks each record it reads against the CRC
// in the archive's central directory, which this file reads by itself: the end-of-central-
// directory record (zip64 form too, for files over 4 GB), then one header per entry.
// Costs one extra pass over the bytes read (about 1-2 GB/s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace datapar::detail {

// CRC-32 (ISO-HDLC, as zip and zlib use), continuing from `crc` (0 to start).
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// The CRC-32 of each entry of the zip at `path`, by name without its top folder
// ("archive/data/0" -> "data/0"). Throws CheckpointError (without the path; the caller
// adds it) if the central directory cannot be found or runs past the end of the file.
std::unordered_map<std::string, uint32_t> read_zip_crcs(const std::string& path);

}  // namespace datapar::detail
