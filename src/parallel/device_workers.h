// DeviceWorkers: one long-lived thread per device, for running replicas side by side.
//
// Python's DataParallel starts a thread per replica on every forward; threads that live as
// long as the model cost nothing per step and keep per-thread settings: each CPU device's
// thread runs with its share of the intra-op threads (2 CPU devices on 4 cores: 2 each), and
// each CUDA device's thread makes its device current. Not a general thread pool: task i
// always runs on the thread of devices[i].
#pragma once

#include <c10/core/Stream.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "datapar/devices.h"
#include "datapar/environment.h"

namespace datapar::detail {

// Whether CPU devices' threads are pinned (Note [Pinning CPU devices]): yes unless
// DATAPAR_PIN_CPU_DEVICES=0 (e.g. when an outer scheduler pins threads).
bool pin_cpu_devices(const Environment& env);

// Blocks until the calling thread's current stream on `device` has run what was queued on
// it (CUDA), so that a clock read next measures the device's work, not its queueing.
// Returns at once for a CPU device.
void wait_for_device(const Device& device);

class DeviceWorkers {
 public:
  // The workers for this device list and pinning, shared by every user of the same list in
  // this process and started on first use; they stop when the last user lets go.
  static std::shared_ptr<DeviceWorkers> for_devices(const std::vector<Device>& devices, bool pin_cpu_devices = true);

  // Starts one thread per device. CPU devices share the machine's cores evenly (at least
  // one intra-op thread each); with pin_cpu_devices, each also gets its own share of the
  // allowed CPUs when there are enough (Note [Pinning CPU devices]).
  explicit DeviceWorkers(std::vector<Device> devices, bool pin_cpu_devices = true);
  ~DeviceWorkers();

  DeviceWorkers(const DeviceWorkers&) = delete;
  DeviceWorkers& operator=(const DeviceWorkers&) = delete;

  // Runs task(i) on the thread of devices[i] for every i < n, concurrently, with the
  // caller's thread-local state (grad mode, inference mode, ...), and blocks until all are
  // done. If tasks throw, rethrows as datapar::Error naming the first failed device:
  // "<what> on cpu:1 failed: <original message>".
  // Called from one of these workers (a replica that itself runs data-parallel work), the
  // tasks run one after another on the calling thread instead of deadlocking.
  // on_caller < n runs that one task on the calling thread instead, alongside the others
  // (for a caller that is itself the thread the task must run on).
  // REQUIRES: n <= devices().size(). Thread-safe: concurrent calls run one at a time.
  static constexpr size_t kNone = static_cast<size_t>(-1);
  void run(size_t n, const std::function<void(size_t)>& task, const std::string& what,
           size_t on_caller = kNone);

  const std::vector<Device>& devices() const { return devices_; }

  // Whether run() called now runs its tasks concurrently, each on its own thread (false
  // when called from one of these workers, see run()). Tasks may wait for one another,
  // e.g. at a barrier, only when this is true.
  bool runs_concurrently() const;

  // Intra-op threads used by the worker of devices[i].
  int intra_op_threads(size_t i) const;

 private:
  struct Worker;
  void loop(size_t index);
  // The calling thread's current stream on each CUDA device of the pool (none on CPUs).
  std::vector<c10::Stream> callers_cuda_streams() const;

  std::vector<Device> devices_;
  std::vector<std::unique_ptr<Worker>> workers_;
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

}  // namespace datapar::detail
