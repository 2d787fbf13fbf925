// What datapar reads from (and writes into) a torch.save file's data.pkl at most: the
// budget that keeps a damaged or hostile file from costing more than an error. In one
// place so that the reader, the writer and the checkpoint code agree.
//
// Real files are far inside these limits: a state dict nests 2 levels, a checkpoint with
// an optimizer state 4, and a model of 10^5 tensors reads as about 3 * 10^5 values. A file
// past a limit fails with a CheckpointError that names it.
#pragma once

#include <cstdint>

namespace datapar::detail {

// Dicts, lists and tuples inside each other. Also bounds the recursion of anything that
// walks a value read (the writer, IValue destructors) to this depth.
inline constexpr int kMaxPickleDepth = 200;

// Values in the object read, counting a value each time it is referenced (memo entries are
// shared, so 250 bytes of pickle can describe 2^34 tuples; what counts is what a walk over
// the result would visit).
inline constexpr int64_t kMaxPickleValues = int64_t{1} << 22;  // 4,194,304

// Bytes of strings in the object read, counted the same way.
inline constexpr int64_t kMaxPickleStringBytes = int64_t{1} << 28;  // 256 MiB

// Small things that have no reason to be large: a class or function name ("torch.FloatStorage"),
// a call's arguments, a tensor's dimensions. Each bounds the work of one opcode.
inline constexpr size_t kMaxPickleGlobalName = 256;
inline constexpr size_t kMaxPickleCallArguments = 16;
inline constexpr size_t kMaxPickleTensorDims = 64;

// Tuples that hold a class (torch.save's persistent ids hold torch.FloatStorage) inside
// each other: such tuples are never data, so nothing real nests them.
inline constexpr int kMaxPickleGlobalTupleDepth = 2;

}  // namespace datapar::detail
