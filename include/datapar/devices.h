// Devices that data-parallel work runs on, and the parser for device lists.
//
// A datapar::Device is either a CUDA device (cuda:K, as CUDA numbers the visible devices) or
// a logical CPU device (cpu:K). CPU devices are first-class: N CPU devices are N worker
// threads in one process, each given its share of the intra-op threads, so DataParallel
// runs and speeds up without a GPU. All CPU devices map to the one torch CPU device.
//
// Device lists are written as in PyTorch: "cpu:0,cpu:1", "cuda:0,cuda:3", "cuda" (every
// visible CUDA device) or "cpu:4" style counts via cpu_devices(4). CUDA_VISIBLE_DEVICES is
// honoured as CUDA does: the visible devices are renumbered from 0.
#pragma once

#include <c10/core/Device.h>

#include <ostream>
#include <string>
#include <vector>

#include "datapar/environment.h"

namespace datapar {

struct Device {
  c10::DeviceType type = c10::DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(c10::DeviceType type, int index) : type(type), index(index) {}

  static Device cpu(int index = 0) { return Device(c10::DeviceType::CPU, index); }
  static Device cuda(int index) { return Device(c10::DeviceType::CUDA, index); }

  bool is_cpu() const { return type == c10::DeviceType::CPU; }
  bool is_cuda() const { return type == c10::DeviceType::CUDA; }

  // The torch device tensors live on: cpu:K -> cpu, cuda:K -> cuda:K.
  c10::Device torch_device() const;

  // "cpu:1", "cuda:0".
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

std::ostream& operator<<(std::ostream& out, const Device& device);

// "cpu:0,cpu:1".
std::string to_string(const std::vector<Device>& devices);

// What devices exist, as seen by this process. detect() asks libtorch and `env`
// (CUDA_VISIBLE_DEVICES); tests build one by hand to exercise machines they do not have.
struct DeviceInventory {
  // Logical CPU devices cpu:0 .. cpu:(cpu_count - 1) may be used.
  int cpu_count = 0;
  // Cores of this machine, for messages and for sharing intra-op threads.
  int cpu_cores = 1;
  // CUDA devices visible to this process (already filtered by CUDA_VISIBLE_DEVICES).
  int cuda_count = 0;
  // The value of CUDA_VISIBLE_DEVICES, and whether it was set at all.
  bool cuda_visible_devices_set = false;
  std::string cuda_visible_devices;

  static DeviceInventory detect(const Environment& env = process_environment());
};

// At most this many logical CPU devices (worker threads) in one process.
constexpr int kMaxCpuDevices = 64;

// Parses one device ("cpu", "cpu:2", "cuda:1"). "cpu" means cpu:0.
// Throws InvalidArgumentError for a malformed, unknown or absent device; the message names
// the devices that exist.
Device parse_device(const std::string& spec, const DeviceInventory& inventory);
Device parse_device(const std::string& spec);

// Parses a comma-separated device list. "cuda" alone expands to every visible CUDA device
// and "cpu" alone to cpu:0. CPU and CUDA devices may be mixed ("cuda:0,cpu:0": DataParallel
// over unlike devices). Throws InvalidArgumentError for an empty list, a device listed twice,
// or any device parse_device rejects.
std::vector<Device> parse_devices(const std::string& spec, const DeviceInventory& inventory);
std::vector<Device> parse_devices(const std::string& spec);

// cpu:0 .. cpu:(count - 1).
std::vector<Device> cpu_devices(int count);

// Every visible CUDA device, cuda:0 .. cuda:(n - 1); empty without CUDA.
std::vector<Device> cuda_devices();

// Physical device ids that CUDA_VISIBLE_DEVICES makes visible, in order, parsed as CUDA
// does: entries up to the first invalid one count; "" or a leading "-1" hides all devices.
// Entries may be integers or GPU UUIDs; UUIDs are returned as written.
std::vector<std::string> parse_cuda_visible_devices(const std::string& value);

}  // namespace datapar
