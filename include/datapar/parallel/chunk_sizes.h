// How a batch of n rows is split over devices.
//
// chunk_sizes() is torch.chunk's rule, which DataParallel uses: every chunk holds ceil(n/k)
// rows except the last, and when n is small there are fewer chunks than devices
// (30 over 4 -> 8,8,8,6; 25 -> 7,7,7,4; 10 -> 3,3,3,1; 15 over 2 -> 8,7; 2 over 4 -> 1,1).
// weighted_chunk_sizes() gives unlike devices unlike shares, e.g. a smaller first chunk for
// the device that also gathers the outputs (the "balanced" DataParallel), or a larger one for
// a faster device.
#pragma once

#include <cstdint>
#include <vector>

namespace datapar {

// torch.chunk(n, k) sizes: at most k chunks, each >= 1, summing to n.
// REQUIRES: n >= 1, num_chunks >= 1 (InvalidArgumentError otherwise).
std::vector<int64_t> chunk_sizes(int64_t n, int64_t num_chunks);

// Sizes proportional to weights (largest remainder), one per weight, each >= 1, summing to n.
// When n is smaller than the number of weights, the first n devices get one row each (as
// torch.chunk does), so the result has n entries.
// REQUIRES: n >= 1, weights non-empty, every weight >= 0, and some weight > 0.
std::vector<int64_t> weighted_chunk_sizes(int64_t n, const std::vector<double>& weights);

// Checks explicit sizes against n rows on num_devices devices: at most num_devices entries,
// each >= 1, summing to n. Throws InvalidArgumentError saying what does not add up.
void check_chunk_sizes(const std::vector<int64_t>& sizes, int64_t n, int64_t num_devices);

}  // namespace datapar
