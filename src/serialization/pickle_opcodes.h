// The Python pickle opcodes that torch.save files use (protocol 2, plus the few protocol 4
// ones a newer Python may emit). Values are Python's (Lib/pickle.py); the layout of
// data.pkl in a torch.save file is described in docs/checkpoint_format.md.
#pragma once

#include <cstdint>

namespace datapar::detail::pickle {

enum Op : uint8_t {
  kMark = '(',            // push a mark: the start of a TUPLE, SETITEMS or APPENDS run
  kStop = '.',            // end of the pickle; the top of the stack is the result
  kPop = '0',             // discard the top of the stack
  kPopMark = '1',         // discard everything down to the last mark
  kDup = '2',             // push a copy of the top
  kBinInt = 'J',          // int32, little-endian
  kBinInt1 = 'K',         // uint8
  kBinInt2 = 'M',         // uint16, little-endian
  kNone = 'N',
  kBinPersId = 'Q',       // persistent_load(top): torch.save's storages
  kReduce = 'R',          // call: stack [callable, args-tuple] -> result
  kBinUnicode = 'X',      // uint32 length + UTF-8 bytes
  kAppend = 'a',
  kBuild = 'b',           // obj.__setstate__(state), or obj.__dict__.update(state)
  kGlobal = 'c',          // "module\nname\n": push a class or function
  kAppends = 'e',
  kBinGet = 'h',          // push memo[uint8]
  kLongBinGet = 'j',      // push memo[uint32]
  kEmptyList = ']',
  kBinPut = 'q',          // memo[uint8] = top
  kLongBinPut = 'r',      // memo[uint32] = top
  kSetItem = 's',
  kTuple = 't',           // tuple of everything down to the last mark
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',        // float64, big-endian
  kEmptyDict = '}',
  kProto = 0x80,          // uint8 protocol version
  kNewObj = 0x81,         // cls.__new__(cls, *args): stack [cls, args] -> object (dcp metadata)
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,          // uint8 length + little-endian two's complement integer
  kShortBinUnicode = 0x8c,  // protocol 4: uint8 length + UTF-8 bytes
  kStackGlobal = 0x93,      // protocol 4: GLOBAL with module and name from the stack
  kMemoize = 0x94,          // protocol 4: memo[len(memo)] = top
  kFrame = 0x95,            // protocol 4: uint64 frame length (a hint; ignored)
};

}  // namespace datapar::detail::pickle
