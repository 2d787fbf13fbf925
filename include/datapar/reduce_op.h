// How a collective combines the members' values: ProcessGroup's all_reduce, reduce and
// reduce_scatter take one, and so do the algorithms below the groups (src/collectives/).
#pragma once

namespace datapar {

enum class ReduceOp { kSum, kAvg, kMin, kMax, kProduct };

// "sum", "avg", "min", "max", "product".
const char* to_string(ReduceOp op);

}  // namespace datapar
