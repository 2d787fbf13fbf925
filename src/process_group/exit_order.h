// A default process group the program leaves at exit is released then, and must be released
// before the CUDA runtime unloads: tensors, events and communicators freed after it threw
// ("driver shutting down") or crashed. Exit handlers run last-registered first, and the
// CUDA runtime registers its own when CUDA starts, so the release is registered again once
// a group knows CUDA runs: by init_process_group after the group is made (nccl starts CUDA
// there), and by a group's first operation on CUDA tensors (gloo's staging, cuda_staging.cc).
#pragma once

namespace datapar::detail {

// Registers, again, the exit handler that releases a default group still there (without
// destroy_process_group's barrier). Cheap and harmless to call more than once.
void release_default_group_at_exit();

// True once that handler has begun: the program is exiting, and a library's lazily made
// statics (libtorch's among them) may be gone already, whatever the order above. What
// would free memory a CUDA allocator handed out leaks it instead: the process ends anyway.
bool process_exiting();

}  // namespace datapar::detail
