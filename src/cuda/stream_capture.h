// Whether work queued now on a device's current stream is being captured into a CUDA graph
// (train/cuda_graph_step.h): what cannot be captured (a host read, a timing event, a Work the
// watchdog polls) asks here. Always false on the CPU and in builds without CUDA.
#pragma once

#include <c10/core/Device.h>

namespace datapar::detail {

bool stream_capturing(const c10::Device& device);

}  // namespace datapar::detail
