// Out-of-line pieces of DataParallel. See data_parallel.h.
#include "datapar/parallel/data_parallel.h"

#include <algorithm>
#include <thread>

#include "parallel/device_workers.h"

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
  }
  DATAPAR_CHECK(options.device_weights.empty() || options.device_weights.size() == devices.size(),
                "DataParallel: ", options.device_weights.size(), " device weights for ", devices.size(),
                " devices (", to_string(devices), "). Give one weight per device.");
  if (!options.device_weights.empty()) weighted_chunk_sizes(static_cast<int64_t>(devices.size()), options.device_weights);
  if (options.auto_balance) {
    LoadBalancer(devices.size(), data_parallel_balance(options), options.device_weights);  // checks them
  }
}

LoadBalancerOptions data_parallel_balance(const DataParallelOptions& options) {
  LoadBalancerOptions balance = options.balance;
  if (balance.takes_part.empty()) balance.takes_part.assign(options.devices.size(), false);
  balance.takes_part[0] = true;  // devices is not empty (checked first)
  return balance;
}

std::vector<size_t> devices_taking_part(const std::vector<double>& weights) {
  std::vector<size_t> part;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (i == 0 || weights[i] > 0) part.push_back(i);
  }
  return part;
}

void record_balanced_step(LoadBalancer& balancer, ReplicaTimes& times, const std::vector<int64_t>& rows,
                          double gather_seconds, const std::vector<Device>& devices, const Device& output_device) {
  std::vector<size_t> ran;  // the device of each chunk
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] > 0) ran.push_back(i);
  }
  const size_t chunks = times.forward.size();
  const bool complete = chunks > 0 && chunks == ran.size() &&
                        std::all_of(times.backward.begin(), times.backward.end(), [](double s) { return s >= 0; });
  if (!complete) return;
  std::vector<int64_t> all_rows(devices.size(), 0);
  std::vector<double> busy(devices.size(), 0.0);
  for (size_t k = 0; k < chunks; ++k) {
    all_rows[ran[k]] = rows[ran[k]];
    busy[ran[k]] = times.forward[k] + times.backward[k];
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == output_device && all_rows[i] > 0) busy[i] += gather_seconds;
  }
  times.forward.clear();  // recorded: a forward without backward in between records nothing
  times.backward.clear();
  balancer.record(all_rows, busy);
}

double seconds_until_done(std::chrono::steady_clock::time_point start, const Device& device) {
  wait_for_device(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace datapar::detail
