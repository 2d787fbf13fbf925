// Device parsing and discovery. See devices.h for the grammar.
#include "datapar/devices.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "datapar/error.h"

namespace datapar {
namespace {

std::string trim(const std::string& s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

bool parse_index(const std::string& text, int* index) {
  if (text.empty() || text.size() > 9) return false;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  *index = std::stoi(text);
  return true;
}

// "cuda:0 (physical 2), cuda:1 (physical 3)" or "none".
std::string describe_cuda(const DeviceInventory& inventory) {
  if (inventory.cuda_count == 0) {
    std::string why = "no CUDA devices are visible to this process";
    if (inventory.cuda_visible_devices_set) {
      why += " (CUDA_VISIBLE_DEVICES=\"" + inventory.cuda_visible_devices + "\")";
    }
    return why;
  }
  std::vector<std::string> physical;
  if (inventory.cuda_visible_devices_set) {
    physical = parse_cuda_visible_devices(inventory.cuda_visible_devices);
  }
  std::ostringstream out;
  out << "the CUDA devices are ";
  for (int i = 0; i < inventory.cuda_count; ++i) {
    out << (i ? ", " : "") << "cuda:" << i;
    if (i < static_cast<int>(physical.size())) out << " (physical " << physical[i] << ")";
  }
  if (inventory.cuda_visible_devices_set) {
    out << "; CUDA_VISIBLE_DEVICES=\"" << inventory.cuda_visible_devices
        << "\" renumbers the visible devices from 0";
  }
  return out.str();
}

std::string describe_cpu(const DeviceInventory& inventory) {
  return detail::str_cat("the CPU devices are cpu:0 .. cpu:", inventory.cpu_count - 1,
                         " (worker threads; this machine has ", inventory.cpu_cores,
                         " cores)");
}

}  // namespace

c10::Device Device::torch_device() const {
  if (is_cpu()) return c10::Device(c10::DeviceType::CPU);
  return c10::Device(type, static_cast<c10::DeviceIndex>(index));
}

std::string Device::str() const {
  return detail::str_cat(c10::DeviceTypeName(type, /*lower_case=*/true), ":", index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

std::string to_string(const std::vector<Device>& devices) {
  std::string out;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (i) out += ",";
    out += devices[i].str();
  }
  return out;
}

DeviceInventory DeviceInventory::detect(const Environment& env) {
  DeviceInventory inventory;
  inventory.cpu_cores = std::max(1u, std::thread::hardware_concurrency());
  inventory.cpu_count = std::max(kMaxCpuDevices, inventory.cpu_cores);
  inventory.cuda_count = static_cast<int>(torch::cuda::device_count());
  if (const auto visible = env("CUDA_VISIBLE_DEVICES")) {
    inventory.cuda_visible_devices_set = true;
    inventory.cuda_visible_devices = *visible;
  }
  return inventory;
}

std::vector<std::string> parse_cuda_visible_devices(const std::string& value) {
  std::vector<std::string> visible;
  for (const std::string& raw : split(value, ',')) {
    std::string entry = trim(raw);
    int index = 0;
    if (parse_index(entry, &index)) {
      // CUDA stops at the first invalid or repeated ordinal.
      if (std::find(visible.begin(), visible.end(), entry) != visible.end()) break;
      visible.push_back(std::to_string(index));
    } else if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
      visible.push_back(entry);
    } else {
      break;  // "-1", "", garbage: nothing after this is visible.
    }
  }
  return visible;
}

Device parse_device(const std::string& raw_spec, const DeviceInventory& inventory) {
  const std::string spec = trim(raw_spec);
  DATAPAR_CHECK(!spec.empty(), "device: empty device name. Write cpu:0 or cuda:0.");
  const size_t colon = spec.find(':');
  std::string type_name = spec.substr(0, colon);
  std::transform(type_name.begin(), type_name.end(), type_name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  int index = 0;
  if (colon != std::string::npos) {
    DATAPAR_CHECK(parse_index(spec.substr(colon + 1), &index), "device \"", spec,
                  "\": the index after ':' must be a non-negative integer, as in cpu:1 or cuda:0.");
  }
  if (type_name == "cpu") {
    DATAPAR_CHECK(index < inventory.cpu_count, "device \"", spec, "\" does not exist: ",
                  describe_cpu(inventory), ".");
    return Device::cpu(index);
  }
  if (type_name == "cuda" || type_name == "gpu") {
    DATAPAR_CHECK(index < inventory.cuda_count, "device \"", spec, "\" does not exist: ",
                  describe_cuda(inventory), ".");
    return Device::cuda(index);
  }
  throw InvalidArgumentError(detail::str_cat(
      "device \"", spec, "\": unknown device type \"", type_name,
      "\". datapar runs on cpu:K and cuda:K devices; ", describe_cpu(inventory), "; ",
      describe_cuda(inventory), "."));
}

Device parse_device(const std::string& spec) {
  return parse_device(spec, DeviceInventory::detect());
}

std::vector<Device> parse_devices(const std::string& raw_spec, const DeviceInventory& inventory) {
  const std::string spec = trim(raw_spec);
  DATAPAR_CHECK(!spec.empty(),
                "devices: the device list is empty. Write e.g. cpu:0,cpu:1 or cuda:0,cuda:1 or cuda.");
  if (spec == "cuda" || spec == "gpu") {
    DATAPAR_CHECK(inventory.cuda_count > 0, "devices \"", spec, "\": ", describe_cuda(inventory),
                  ". Use CPU devices instead, e.g. cpu:0,cpu:1.");
    std::vector<Device> all;
    for (int i = 0; i < inventory.cuda_count; ++i) all.push_back(Device::cuda(i));
    return all;
  }
  std::vector<Device> devices;
  for (const std::string& part : split(spec, ',')) {
    DATAPAR_CHECK(!trim(part).empty(), "devices \"", spec,
                  "\": empty entry in the list. Separate devices with single commas.");
    Device device = parse_device(part, inventory);
    DATAPAR_CHECK(std::find(devices.begin(), devices.end(), device) == devices.end(),
                  "devices \"", spec, "\": ", device.str(),
                  " is listed twice. List each device once.");
    devices.push_back(device);
  }
  return devices;
}

std::vector<Device> parse_devices(const std::string& spec) {
  return parse_devices(spec, DeviceInventory::detect());
}

std::vector<Device> cpu_devices(int count) {
  DATAPAR_CHECK(count >= 1 && count <= kMaxCpuDevices, "cpu_devices: asked for ", count,
                " CPU devices; use 1 .. ", kMaxCpuDevices, ".");
  std::vector<Device> devices;
  for (int i = 0; i < count; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

std::vector<Device> cuda_devices() {
  std::vector<Device> devices;
  const int count = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < count; ++i) devices.push_back(Device::cuda(i));
  return devices;
}

}  // namespace datapar
