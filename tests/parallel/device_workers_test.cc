#include "parallel/device_workers.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <thread>

#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar::detail {
namespace {

int allowed_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

// Regression: ATen's once-per-thread initialisation used to run at a worker's first
// parallel op and reset its thread count to the caller's.
TEST(DeviceWorkers, EachCpuDeviceKeepsItsShareOfIntraOpThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(7);
  DeviceWorkers workers(cpu_devices(2));
  std::vector<int> seen(2);
  workers.run(2, [&](size_t i) {
    (void)(at::ones({4096}) * 2).sum();  // a first parallel op on this thread
    seen[i] = at::get_num_threads();
  }, "probe");
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(seen[i], workers.intra_op_threads(i));
    EXPECT_GE(seen[i], 1);
  }
  EXPECT_EQ(at::get_num_threads(), 7);  // the caller's own setting is unchanged
  at::set_num_threads(before);
}

TEST(DeviceWorkers, PinsCpuDevicesToDistinctCpus) {
  if (allowed_cpu_count() < 2) GTEST_SKIP() << "needs 2 CPUs";
  DeviceWorkers workers(cpu_devices(2));
  std::vector<cpu_set_t> sets(2);
  workers.run(2, [&](size_t i) { sched_getaffinity(0, sizeof(cpu_set_t), &sets[i]); }, "probe");
  cpu_set_t both;
  CPU_AND(&both, &sets[0], &sets[1]);
  EXPECT_EQ(CPU_COUNT(&both), 0);  // disjoint
  EXPECT_GE(CPU_COUNT(&sets[0]), 1);

  DeviceWorkers unpinned(cpu_devices(2), /*pin_cpu_devices=*/false);
  int count = 0;
  unpinned.run(1, [&](size_t) {
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    count = CPU_COUNT(&set);
  }, "probe");
  EXPECT_EQ(count, allowed_cpu_count());
}

// DATAPAR_PIN_CPU_DEVICES, read through an Environment (ReplicaSet passes the process's).
TEST(DeviceWorkers, PinningFollowsTheVariableAndKeysTheSharedPool) {
  const auto env = [](std::optional<std::string> value) -> Environment {
    return [value](const std::string& name) { return name == "DATAPAR_PIN_CPU_DEVICES" ? value : std::nullopt; };
  };
  EXPECT_TRUE(pin_cpu_devices(env(std::nullopt)));
  EXPECT_TRUE(pin_cpu_devices(env("1")));
  EXPECT_FALSE(pin_cpu_devices(env("0")));
  const auto pinned = DeviceWorkers::for_devices(cpu_devices(2), true);
  EXPECT_EQ(DeviceWorkers::for_devices(cpu_devices(2), true), pinned);
  EXPECT_NE(DeviceWorkers::for_devices(cpu_devices(2), false), pinned);
}

TEST(DeviceWorkers, RunsEveryTaskOnItsOwnThreadAndNamesFailures) {
  DeviceWorkers workers(cpu_devices(3));
  std::vector<std::thread::id> ids(3);
  workers.run(3, [&](size_t i) { ids[i] = std::this_thread::get_id(); }, "probe");
  EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), 3u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), std::this_thread::get_id()), 0);
  EXPECT_THROW_MSG(workers.run(3, [](size_t i) {
    if (i == 2) throw std::runtime_error("boom");
  }, "step"), Error, "step on cpu:2 failed: boom");
  // Nested use from a worker runs inline instead of deadlocking.
  int inner = 0;
  workers.run(1, [&](size_t) { workers.run(3, [&](size_t) { ++inner; }, "inner"); }, "outer");
  EXPECT_EQ(inner, 3);
}

}  // namespace
}  // namespace datapar::detail
