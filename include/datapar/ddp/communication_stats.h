// How much of DistributedDataParallel's communication backward could not hide
// (DistributedDataParallel::communication_stats()).
#pragma once

#include <chrono>
#include <cstdint>

namespace datapar {

struct CommunicationStats {
  int64_t synchronised_passes = 0;  // backward passes that all-reduced gradients
  // Summed over those passes: how long backward waited for its buckets' collectives after
  // its last gradient was ready, i.e. the communication not hidden behind backward. For a
  // model on the CPU, the host's wait; on a GPU, how long the model's CUDA stream waited
  // (timed by CUDA events: nccl's wait() does not block the host), so reading the stats
  // waits until the GPU has run the last pass.
  std::chrono::nanoseconds exposed_wait{0};
};

}  // namespace datapar
