// Keeping freed memory in the process, for CPU training.
//
// libtorch allocates CPU tensors with malloc. glibc hands large blocks back to the kernel
// when they are freed, so every training step page-faults its activations and gradients
// in again; in a process whose threads run on several cores (DataParallel on CPU devices,
// or intra-op threads) each unmap also interrupts the other cores to flush their TLBs.
// Measured here on an MLP step at batch 256: 500-700 page faults and 1.3-4 ms of system
// time per step by default, about 20 faults and under 1 ms after tune_cpu_allocator().
// PyTorch's CPU performance guide recommends jemalloc or tcmalloc for the same reason;
// this is the no-dependency equivalent for glibc.
#pragma once

namespace datapar {

// Asks glibc's malloc to serve blocks up to 32 MiB from its heaps and to keep freed memory
// instead of returning it to the kernel (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). Process-wide
// and permanent: the process keeps its peak heap size. Call it once at startup, before
// training; programs that replace malloc (jemalloc, tcmalloc) need not. Returns false when
// the C library is not glibc or refused the settings. Thread-safe.
bool tune_cpu_allocator();

}  // namespace datapar
