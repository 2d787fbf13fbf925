// See flat_buffers.h.
#include "fsdp/flat_buffers.h"

#include <mutex>
#include <string>
#include <unordered_map>

#include "datapar/fsdp/fully_shard.h"
#include "fsdp/fsdp_unit.h"

namespace datapar::detail {
namespace {

struct FlatBuffers {
  std::mutex mutex;
  std::unordered_map<const c10::StorageImpl*, const FsdpUnit*> units;
};

FlatBuffers& flat_buffers() {
  static FlatBuffers* buffers = new FlatBuffers;  // never destroyed: units may outlive static destruction
  return *buffers;
}

}  // namespace

void add_flat_buffer(const c10::StorageImpl* storage, const FsdpUnit* unit) {
  FlatBuffers& buffers = flat_buffers();
  const std::lock_guard<std::mutex> lock(buffers.mutex);
  buffers.units[storage] = unit;
}

void remove_flat_buffer(const c10::StorageImpl* storage) {
  FlatBuffers& buffers = flat_buffers();
  const std::lock_guard<std::mutex> lock(buffers.mutex);
  buffers.units.erase(storage);
}

const FsdpUnit* unit_holding(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return nullptr;
  FlatBuffers& buffers = flat_buffers();
  const std::lock_guard<std::mutex> lock(buffers.mutex);
  const auto it = buffers.units.find(tensor.storage().unsafeGetStorageImpl());
  return it == buffers.units.end() ? nullptr : it->second;
}

bool fsdp_units_alive() {
  FlatBuffers& buffers = flat_buffers();
  const std::lock_guard<std::mutex> lock(buffers.mutex);
  return !buffers.units.empty();
}

std::string fsdp_unit_holding(const at::Tensor& tensor) {
  FlatBuffers& buffers = flat_buffers();
  const std::lock_guard<std::mutex> lock(buffers.mutex);  // the unit stays alive while its name is read
  if (!tensor.defined() || !tensor.has_storage()) return "";
  const auto it = buffers.units.find(tensor.storage().unsafeGetStorageImpl());
  return it == buffers.units.end() ? "" : it->second->name();
}

}  // namespace datapar::detail
