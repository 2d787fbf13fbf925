// torch_save / torch_load. See torch_file.h.
#include "serialization/torch_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "serialization/atomic_file.h"
#include "serialization/pickle_reader.h"
#include "serialization/pickle_writer.h"
#include "serialization/zip_crc.h"

namespace datapar::detail {
namespace {

using caffe2::serialize::PyTorchStreamReader;
using caffe2::serialize::PyTorchStreamWriter;

// Why the zip layer refused the file, judged from its first bytes.
std::string describe_unreadable(const std::string& path, size_t size) {
  char head[4] = {0, 0, 0, 0};
  std::ifstream(path, std::ios::binary).read(head, sizeof head);
  if (size == 0) return "the file is empty (a write that never happened?)";
  if (std::memcmp(head, "PK\x03\x04", 4) == 0) {
    return "a zip archive whose end is missing or damaged (truncated, or copied while being written?)";
  }
  if (static_cast<unsigned char>(head[0]) == 0x80) {
    return "a raw pickle, not a zip archive: the legacy torch.save format (PyTorch < 1.6, or "
           "_use_new_zipfile_serialization=False), which datapar does not read. Re-save it with a current torch.save";
  }
  return "not a torch.save file (it does not start like a zip archive; truncated, or another kind of file?)";
}

std::string reader_message(const c10::Error& e) {
  std::string what = e.what_without_backtrace();
  if (what.size() > 200) what = what.substr(0, 200) + "...";
  return what;
}

}  // namespace

std::string python_type_name(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return "bool";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isString()) return "str";
  if (v.isTensor()) return "Tensor";
  if (v.isGenericDict()) return "dict";
  if (v.isList()) return "list";
  if (v.isTuple()) return "tuple";
  return v.tagKind();
}

namespace {

// The records of a torch.save archive of `pickle` and its storages.
void write_archive(PyTorchStreamWriter& writer, const std::string& pickle, const std::vector<at::Tensor>& storages) {
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  const char order[] = "little";
  writer.writeRecord("byteorder", order, sizeof order - 1);
  for (size_t i = 0; i < storages.size(); ++i) {
    const at::Tensor& t = storages[i];
    writer.writeRecord("data/" + std::to_string(i), t.data_ptr(), t.numel() * t.element_size());
  }
  writer.writeEndOfFile();
}

}  // namespace

void torch_save(const c10::IValue& root, const std::string& path) {
  std::vector<at::Tensor> storages;
  const std::string pickle = write_pickle(root, &storages);  // throws before any file exists

  AtomicFile file(path);
  {
    // The writer never sees a failed write (AtomicFile::write reports everything written
    // and remembers the error for commit()): PyTorchStreamWriter may throw from its
    // destructor when a write fails, which would end the process.
    PyTorchStreamWriter writer([&file](const void* data, size_t size) { return file.write(data, size); });
    write_archive(writer, pickle, storages);
  }
  file.commit();
}

std::string torch_save_bytes(const c10::IValue& root) {
  std::vector<at::Tensor> storages;
  const std::string pickle = write_pickle(root, &storages);
  std::string out;
  {
    PyTorchStreamWriter writer([&out](const void* data, size_t size) {
      out.append(static_cast<const char*>(data), size);
      return size;
    });
    write_archive(writer, pickle, storages);
  }
  return out;
}

uint64_t torch_save_to(const c10::IValue& root, const std::function<size_t(const void* data, size_t size)>& write) {
  std::vector<at::Tensor> storages;
  const std::string pickle = write_pickle(root, &storages);
  uint64_t written = 0;
  {
    PyTorchStreamWriter writer([&](const void* data, size_t size) {
      const size_t n = write(data, size);
      written += n;
      return n;
    });
    write_archive(writer, pickle, storages);
  }
  return written;
}

bool torch_file_is_intact(const std::string& path) noexcept {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  try {
    return PyTorchStreamReader(path).hasRecord("data.pkl");
  } catch (...) {
    return false;
  }
}

namespace {

// The object in `reader`'s archive (file_size bytes), each record checked against the CRC-32
// of the zip directory that `read_entries()` returns.
template <typename Entries>
c10::IValue load_archive(PyTorchStreamReader& archive, const Entries& read_entries, size_t file_size,
                         uint32_t* digest, PickleAllowance* allowance = nullptr) {
  uint32_t records_digest = 0;
  PyTorchStreamReader* reader = &archive;
  {
    if (!reader->hasRecord("data.pkl")) {
      throw CheckpointError("the archive has no data.pkl; it is not a torch.save file");
    }
    // Each record is checked against the CRC-32 the archive holds for it (zip_crc.h), and
    // its announced size against the file's before libtorch allocates that size.
    const auto entries = read_entries();
    auto record = [&](const std::string& name) {
      const auto entry = entries.find(name);
      if (entry == entries.end()) {
        throw CheckpointError(str_cat("record ", name, " is not in the zip directory (a damaged archive?)",
                                      ". Load an earlier checkpoint"));
      }
      if (entry->second.size > file_size) {
        throw CheckpointError(str_cat("record ", name, " claims ", entry->second.size, " bytes, more than the whole file (",
                                      file_size, " bytes): the zip directory is damaged. Load an earlier checkpoint"));
      }
      at::DataPtr data;
      size_t size = 0;
      std::tie(data, size) = reader->getRecord(name);
      if (crc32(data.get(), size) != entry->second.crc) {
        throw CheckpointError(str_cat("record ", name, " is damaged (its CRC-32 does not match: a changed bit on disk or in a copy?)",
                                      ". Load an earlier checkpoint"));
      }
      records_digest = crc32(&entry->second.crc, sizeof(entry->second.crc), records_digest);
      return std::make_pair(std::move(data), size);
    };
    if (reader->hasRecord("byteorder")) {
      const auto order = record("byteorder");
      const std::string byteorder(static_cast<const char*>(order.first.get()), order.second);
      if (byteorder != "little") {
        throw CheckpointError(str_cat("the file was written on a \"", byteorder, "\"-endian machine; datapar reads little-endian files"));
      }
    }
    const auto pickle = record("data.pkl");

    StorageLoader load = [&reader, &record](const std::string& key, at::ScalarType dtype, int64_t numel) {
      const std::string name = "data/" + key;
      if (!reader->hasRecord(name)) throw CheckpointError(str_cat("storage ", key, " has no record ", name, " in the archive"));
      const auto data = record(name);
      const size_t size = data.second;
      const size_t element = c10::elementSize(dtype);
      if (numel < 0 || static_cast<uint64_t>(numel) > std::numeric_limits<size_t>::max() / element ||
          static_cast<size_t>(numel) * element != size) {
        throw CheckpointError(str_cat("storage ", key, " should hold ", numel, " ", c10::toString(dtype), " elements but record ",
                                      name, " has ", size, " bytes"));
      }
      at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
      if (size > 0) std::memcpy(t.data_ptr(), data.first.get(), size);
      return t;
    };
    c10::IValue value =
        read_pickle(static_cast<const char*>(pickle.first.get()), pickle.second, load, nullptr, allowance);
    if (digest != nullptr) *digest = records_digest;
    return value;
  }
}

}  // namespace

c10::IValue torch_load(const std::string& path, uint32_t* digest) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw CheckpointError(str_cat(path, ": cannot open (", std::strerror(errno), "). Check the path."));
  }
  if (S_ISDIR(st.st_mode)) throw CheckpointError(str_cat(path, ": cannot open (is a directory). Give a file."));
  const size_t file_size = static_cast<size_t>(st.st_size);

  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    throw CheckpointError(str_cat(path, ": cannot read (", file_size, " bytes): ", describe_unreadable(path, file_size),
                                  ". [zip reader: ", reader_message(e), "]"));
  }
  try {
    return load_archive(*reader, [&] { return read_zip_entries(path); }, file_size, digest);
  } catch (const CheckpointError& e) {
    throw CheckpointError(str_cat(path, ": ", e.what(), "."));
  } catch (const c10::Error& e) {
    throw CheckpointError(str_cat(path, ": the archive is damaged (", reader_message(e),
                                  "). Load an earlier checkpoint, or re-save this one."));
  }
}

c10::IValue torch_load_bytes(const char* data, size_t size, PickleAllowance* allowance) {
  if (size < 4 || std::memcmp(data, "PK\x03\x04", 4) != 0) {
    throw CheckpointError(str_cat("not a torch.save archive (", size, " bytes that do not start like a zip)"));
  }
  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(std::make_shared<caffe2::serialize::MemoryReadAdapter>(data, size));
    return load_archive(*reader, [&] { return read_zip_entries(data, size); }, size, nullptr, allowance);
  } catch (const c10::Error& e) {
    throw CheckpointError(str_cat("a damaged torch.save archive (", reader_message(e), ")"));
  }
}

c10::IValue torch_load_archive(uint64_t size, const ArchiveRead& read, const StoragePlace& place,
                               PickleAllowance* allowance) {
  const auto bytes_at = [&](uint64_t offset, uint64_t n) {
    if (offset > size || n > size - offset) {
      throw CheckpointError(str_cat("a damaged torch.save archive (", size, " bytes, but something in it points at ",
                                    offset, "..", offset + n, ")"));
    }
    std::string out(n, '\0');
    if (n > 0) read(offset, out.data(), n);
    return out;
  };
  std::string head = bytes_at(0, std::min<uint64_t>(4, size));
  if (head != "PK\x03\x04") {
    throw CheckpointError(str_cat("not a torch.save archive (", size, " bytes that do not start like a zip)"));
  }
  const auto entries = read_zip_entries(size, bytes_at);
  // Where record `name`'s bytes lie, after checking its entry and local header.
  const auto locate = [&](const std::string& name) {
    const auto entry = entries.find(name);
    if (entry == entries.end()) {
      throw CheckpointError(str_cat("a damaged torch.save archive (record ", name, " is not in its zip directory)"));
    }
    if (entry->second.method != 0) {
      throw CheckpointError(str_cat("record ", name, " is compressed (zip method ", entry->second.method,
                                    "): not an archive torch.save wrote"));
    }
    const uint64_t offset = zip_data_offset(entry->second, bytes_at(entry->second.header_offset, 30));
    if (offset > size || entry->second.size > size - offset) {
      throw CheckpointError(str_cat("record ", name, " claims ", entry->second.size, " bytes at ", offset,
                                    ", past the end of its archive (", size, " bytes): a damaged archive"));
    }
    return std::make_pair(offset, entry->second);
  };
  const auto check = [](const std::string& name, const ZipEntry& entry, const void* data, size_t n) {
    if (crc32(data, n) != entry.crc) {
      throw CheckpointError(str_cat("record ", name, " is damaged (its CRC-32 does not match: a changed bit on disk ",
                                    "or in a copy?). Load an earlier checkpoint"));
    }
  };
  const auto small_record = [&](const std::string& name) {
    const auto [offset, entry] = locate(name);
    std::string data = bytes_at(offset, entry.size);
    check(name, entry, data.data(), data.size());
    return data;
  };
  if (entries.count("byteorder") != 0) {
    const std::string order = small_record("byteorder");
    if (order != "little") {
      throw CheckpointError(str_cat("the archive was written on a \"", order, "\"-endian machine; datapar reads little-endian files"));
    }
  }
  const std::string pickle = small_record("data.pkl");
  const StorageLoader load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const std::string name = "data/" + key;
    const auto [offset, entry] = locate(name);
    const size_t element = c10::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > std::numeric_limits<size_t>::max() / element ||
        static_cast<uint64_t>(numel) * element != entry.size) {
      throw CheckpointError(str_cat("storage ", key, " should hold ", numel, " ", c10::toString(dtype), " elements but record ",
                                    name, " has ", entry.size, " bytes"));
    }
    at::Tensor storage = place ? place(key, dtype, numel) : at::Tensor();
    if (!storage.defined()) storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (storage.scalar_type() != dtype || storage.numel() != numel || !storage.is_contiguous() ||
        !storage.device().is_cpu()) {
      throw InvalidArgumentError(str_cat("torch_load_archive: storage ", key, " was placed in a ", storage.scalar_type(),
                                         " tensor of ", storage.numel(), " elements on ", storage.device(),
                                         "; it needs a contiguous CPU ", c10::toString(dtype), " tensor of ", numel));
    }
    if (entry.size > 0) {
      read(offset, static_cast<char*>(storage.data_ptr()), entry.size);
      check(name, entry, storage.data_ptr(), entry.size);
    }
    return storage;
  };
  return read_pickle(pickle.data(), pickle.size(), load, nullptr, allowance);
}

}  // namespace datapar::detail
