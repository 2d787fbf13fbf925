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

// Memory (Note [Pickle budget], 4): what reading data.pkl allocates, charged as the
// machine builds it, may reach kMaxPickleMemoryPerByte bytes per byte of data.pkl plus
// kPickleMemoryAllowance (the tensors' own data is the file's records, bounded by its
// size). A flood of empty dicts in 9 MB cost 2.3 GB before; now at most 640 MiB. Real files
// are charged 45 to 55 bytes per byte of data.pkl (state dicts, SGD and Adam states, as
// PyTorch 1.13 writes them), inside the allowance up to a data.pkl of about 3 MB.
inline constexpr int64_t kMaxPickleMemoryPerByte = 64;
inline constexpr int64_t kPickleMemoryAllowance = int64_t{64} << 20;  // 64 MiB

// One allowance for many reads (the objects of one DCP checkpoint, issue 46): each read may
// charge kMaxPickleMemoryPerByte per byte of its own, and what it charges beyond that comes
// out of `left`, so that a thousand small items cannot each claim the whole allowance.
struct PickleAllowance {
  int64_t left = kPickleMemoryAllowance;
};

// What each thing read costs, in bytes: measured with libtorch 1.13 and 2.15 (x86-64,
// glibc), a million of each, rounded up; each container's includes its entry in the
// machine's table of containers.
inline constexpr int64_t kPickleDictCost = 512;       // an empty dict: 492
inline constexpr int64_t kPickleDictEntryCost = 256;  // a dict's entry: 224
inline constexpr int64_t kPickleListCost = 160;       // an empty list: 156
inline constexpr int64_t kPickleTupleCost = 192;      // an empty tuple: 188
inline constexpr int64_t kPickleSlotCost = 32;        // a list's or tuple's element (16, doubled by growth)
inline constexpr int64_t kPickleStringCost = 144;     // a string, besides its bytes: 140
inline constexpr int64_t kPickleTensorCost = 448;     // a tensor or storage view: 428
inline constexpr int64_t kPickleStackSlotCost = 48;   // a value on the stack (an Item), at its highest
inline constexpr int64_t kPickleMemoEntryCost = 96;   // a memo entry

// Small things that have no reason to be large: a class or function name ("torch.FloatStorage"),
// a call's arguments, a tensor's dimensions. Each bounds the work of one opcode.
inline constexpr size_t kMaxPickleGlobalName = 256;
inline constexpr size_t kMaxPickleCallArguments = 16;
inline constexpr size_t kMaxPickleTensorDims = 64;

// Tuples that hold a class (torch.save's persistent ids hold torch.FloatStorage) inside
// each other: such tuples are never data, so nothing real nests them.
inline constexpr int kMaxPickleGlobalTupleDepth = 2;

}  // namespace datapar::detail
