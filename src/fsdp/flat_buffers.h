// The flat buffers of the FSDP units alive in this process, by storage: a parameter viewing
// one belongs to that unit (a module is sharded once; a sharded module's parameters are not
// read as a plain module's; fully_shard.h's fsdp_unit_holding).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace datapar::detail {

class FsdpUnit;

// A unit's flat buffer, from its construction to its destruction.
void add_flat_buffer(const c10::StorageImpl* storage, const FsdpUnit* unit);
void remove_flat_buffer(const c10::StorageImpl* storage);

// The unit whose flat buffer `tensor` views, if any. Read its name on the thread that owns it.
const FsdpUnit* unit_holding(const at::Tensor& tensor);

// Whether any unit is alive in this process (for the hint of an uncaught exception).
bool fsdp_units_alive();

}  // namespace datapar::detail
