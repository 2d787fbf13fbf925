#include "datapar/devices.h"

#include <gtest/gtest.h>

#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

DeviceInventory machine(int cuda_count, const char* visible = nullptr) {
  DeviceInventory inv;
  inv.cpu_cores = 2;
  inv.cpu_count = kMaxCpuDevices;
  inv.cuda_count = cuda_count;
  if (visible) {
    inv.cuda_visible_devices_set = true;
    inv.cuda_visible_devices = visible;
  }
  return inv;
}

TEST(Devices, ParsesCpuLists) {
  auto devices = parse_devices("cpu:0,cpu:1,cpu:2", machine(0));
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[2], Device::cpu(2));
  EXPECT_EQ(to_string(devices), "cpu:0,cpu:1,cpu:2");
  EXPECT_EQ(devices[1].torch_device(), c10::Device(c10::kCPU));  // every CPU device is torch's CPU
  EXPECT_EQ(parse_devices("cpu", machine(0)), std::vector<Device>{Device::cpu(0)});
  EXPECT_EQ(parse_devices(" cpu:1 , cpu:0 ", machine(0)), (std::vector<Device>{Device::cpu(1), Device::cpu(0)}));
}

TEST(Devices, ParsesCudaLists) {
  auto devices = parse_devices("cuda:0,cuda:3", machine(4));
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1], Device::cuda(3));
  EXPECT_EQ(devices[1].torch_device(), c10::Device(c10::kCUDA, 3));
  EXPECT_EQ(parse_devices("cuda", machine(3)).size(), 3u);
  EXPECT_EQ(parse_devices("cuda", machine(3))[2], Device::cuda(2));
}

TEST(Devices, AbsentDeviceNamesTheDevicesThatExist) {
  EXPECT_THROW_MSG(parse_devices("cuda:0", machine(0)), InvalidArgumentError, "no CUDA devices are visible");
  EXPECT_THROW_MSG(parse_devices("cuda:4", machine(4)), InvalidArgumentError,
                   "the CUDA devices are cuda:0, cuda:1, cuda:2, cuda:3");
  EXPECT_THROW_MSG(parse_devices("cuda", machine(0)), InvalidArgumentError, "no CUDA devices are visible");
  EXPECT_THROW_MSG(parse_devices("cpu:64", machine(0)), InvalidArgumentError, "cpu:0 .. cpu:63");
}

TEST(Devices, HonoursCudaVisibleDevices) {
  // Physical GPUs 2 and 3 visible: CUDA calls them cuda:0 and cuda:1.
  auto inv = machine(2, "2,3");
  EXPECT_EQ(parse_devices("cuda", inv), (std::vector<Device>{Device::cuda(0), Device::cuda(1)}));
  EXPECT_THROW_MSG(parse_devices("cuda:3", inv), InvalidArgumentError,
                   "cuda:0 (physical 2), cuda:1 (physical 3); CUDA_VISIBLE_DEVICES=\"2,3\"");
  EXPECT_THROW_MSG(parse_devices("cuda:0", machine(0, "")), InvalidArgumentError, "CUDA_VISIBLE_DEVICES=\"\"");
}

TEST(Devices, CudaVisibleDevicesParsesAsCudaDoes) {
  EXPECT_EQ(parse_cuda_visible_devices("2,3"), (std::vector<std::string>{"2", "3"}));
  EXPECT_EQ(parse_cuda_visible_devices("1,x,2"), (std::vector<std::string>{"1"}));  // stops at invalid
  EXPECT_EQ(parse_cuda_visible_devices("-1,0"), std::vector<std::string>{});
  EXPECT_EQ(parse_cuda_visible_devices(""), std::vector<std::string>{});
  EXPECT_EQ(parse_cuda_visible_devices("0,0,1"), (std::vector<std::string>{"0"}));  // repeat stops too
  EXPECT_EQ(parse_cuda_visible_devices("GPU-8f2a,1"), (std::vector<std::string>{"GPU-8f2a", "1"}));
}

TEST(Devices, RejectsBadLists) {
  EXPECT_THROW_MSG(parse_devices("", machine(0)), InvalidArgumentError, "empty");
  EXPECT_THROW_MSG(parse_devices("tpu:0", machine(0)), InvalidArgumentError, "unknown device type \"tpu\"");
  EXPECT_THROW_MSG(parse_devices("cpu:0,cpu:0", machine(0)), InvalidArgumentError, "listed twice");
  EXPECT_THROW_MSG(parse_devices("cpu:0,,cpu:1", machine(0)), InvalidArgumentError, "empty entry");
  EXPECT_THROW_MSG(parse_devices("cpu:x", machine(0)), InvalidArgumentError, "non-negative integer");
  EXPECT_THROW_MSG(parse_devices("cpu:-1", machine(0)), InvalidArgumentError, "non-negative integer");
  EXPECT_THROW_MSG(parse_devices("cuda:0,cpu:0,cuda:0", machine(1)), InvalidArgumentError, "listed twice");
}

// Unlike devices side by side (DataParallel over a GPU and CPU cores), in the order given.
TEST(Devices, MixesCudaAndCpuDevicesInTheOrderGiven) {
  EXPECT_EQ(parse_devices("cuda:0,cpu:0,cpu:1", machine(1)),
            (std::vector<Device>{Device::cuda(0), Device::cpu(0), Device::cpu(1)}));
  EXPECT_EQ(parse_devices("cpu:0,cuda:0", machine(1)), (std::vector<Device>{Device::cpu(0), Device::cuda(0)}));
  EXPECT_THROW_MSG(parse_devices("cuda:0,cpu:0", machine(0)), InvalidArgumentError, "cuda:0");
}

TEST(Devices, DetectsThisMachine) {
  const DeviceInventory inv = DeviceInventory::detect();
  EXPECT_GE(inv.cpu_cores, 1);
  EXPECT_GE(inv.cpu_count, inv.cpu_cores);
  EXPECT_EQ(cpu_devices(4).size(), 4u);
  EXPECT_EQ(static_cast<int>(cuda_devices().size()), inv.cuda_count);
}

}  // namespace
}  // namespace datapar
