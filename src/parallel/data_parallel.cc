// Out-of-line pieces of DataParallel. See data_parallel.h.
#include "datapar/parallel/data_parallel.h"

#include <algorithm>
#include <thread>

namespace datapar::detail {

std::vector<Device> default_data_parallel_devices() {
  std::vector<Device> devices = cuda_devices();
  if (!devices.empty()) return devices;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return cpu_devices(std::min(cores, kMaxCpuDevices));
}

void check_data_parallel_options(const DataParallelOptions& options) {
  const auto& devices = options.devices;
  DATAPAR_CHECK(!devices.empty(), "DataParallel: no devices given.");
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      DATAPAR_CHECK(devices[i] != devices[j], "DataParallel: ", devices[i], " is listed twice in ",
                    to_string(devices), ". List each device once.");
    }
    DATAPAR_CHECK(devices[i].type == devices.front().type, "DataParallel: ", to_string(devices),
                  " mixes CPU and CUDA devices. Use only cpu:K or only cuda:K devices.");
  }
  DATAPAR_CHECK(options.device_weights.empty() || options.device_weights.size() == devices.size(),
                "DataParallel: ", options.device_weights.size(), " device weights for ", devices.size(),
                " devices (", to_string(devices), "). Give one weight per device.");
  if (!options.device_weights.empty()) weighted_chunk_sizes(static_cast<int64_t>(devices.size()), options.device_weights);
}

}  // namespace datapar::detail
