// See cpu_allocator.h.
#include "datapar/cpu_allocator.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace datapar {

bool tune_cpu_allocator() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's largest mmap threshold on 64-bit; setting it also turns off glibc's
  // own adjustment of the threshold, which would lower it again.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace datapar
