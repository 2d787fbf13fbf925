// What a rank does with an exception nothing caught: print its message and exit with status
// 1, as a Python rank ends on an uncaught exception, instead of std::terminate's abort()
// (which the launcher can only report as "killed by signal 6", and libtorch's errors with a
// backtrace of dozens of frames). DATAPAR_ABORT_ON_UNCAUGHT=1 keeps abort(), for a core dump
// at the throw.
#pragma once

namespace datapar::detail {

// Once per process (init_process_group calls it); the terminate handler it replaces still
// handles std::terminate without an exception.
void exit_on_uncaught_exceptions();

}  // namespace datapar::detail
