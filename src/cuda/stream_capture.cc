// See stream_capture.h. Compiled only where Torch has CUDA.
#include "cuda/stream_capture.h"

#include <c10/cuda/CUDAStream.h>

namespace datapar::detail {

bool stream_capturing(const c10::Device& device) {
  if (!device.is_cuda()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace datapar::detail
