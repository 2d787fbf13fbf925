// DeviceWorkers. See device_workers.h.
//
// Note [Intra-op threads per CPU device]
// ATen's OpenMP backend keeps the thread count per thread (OpenMP's nthreads-var), but
// at::set_num_threads also stores a process-wide default that threads pick up when they
// first touch ATen. Each CPU worker therefore sets its own count once at start, and the
// constructor puts the process-wide default back after all workers have started, so the
// caller's own intra-op setting is unchanged.
#include "device_workers.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

thread_local const DeviceWorkers* current_workers = nullptr;

// Note [Spin before sleeping]
// Waking a sleeping thread costs tens of microseconds, more in a virtual machine (an
// interrupt to another CPU, which must leave its idle state), and a DataParallel step
// hands work to the devices' threads and back several times. So a waiting thread first
// polls for a short while, and sleeps only when nothing arrives: workers poll for the next
// task, the caller for the results of short tasks.
constexpr auto kWorkerSpin = std::chrono::microseconds(200);
constexpr auto kCallerSpin = std::chrono::microseconds(30);

// Polls `ready` for up to `budget`; true if it became true.
template <typename Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (int i = 1;; ++i) {
    if (ready()) return true;
    if (i % 16 == 0 && std::chrono::steady_clock::now() > deadline) return false;
    // Yield, not pause: the device threads may occupy every core, and the caller thread,
    // which has the next task to hand out, must still get one.
    std::this_thread::yield();
  }
}

// The CPUs this process may run on (taskset, cgroups), in order.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

struct DeviceWorkers::Worker {
  std::thread thread;
  int intra_op_threads = 1;
  std::vector<int> cpus;  // pinned to these CPUs; empty: not pinned
};

struct DeviceWorkers::Shared {
  std::mutex run_mutex;  // one run() at a time

  std::mutex mutex;
  std::condition_variable wake;  // workers wait here for a new generation
  std::condition_variable done;  // run() waits here for pending == 0
  std::atomic<uint64_t> generation{0};  // written under mutex, also read while spinning
  size_t active = 0;   // workers [0, active) take part in this generation
  size_t skip = DeviceWorkers::kNone;  // ... except this one, run by the caller
  std::atomic<size_t> pending{0};  // of those, how many have not finished
  size_t started = 0;  // workers that finished their setup
  bool stopping = false;
  const std::function<void(size_t)>* task = nullptr;
  const at::ThreadLocalState* state = nullptr;
  const std::vector<c10::Stream>* streams = nullptr;  // the caller's current CUDA streams
  std::vector<std::exception_ptr> errors;
};

// Note [The caller's streams]
// CUDA's current stream is per thread and per device, and at::ThreadLocalState does not
// carry it. A worker runs its task on the streams that are current in the thread that
// called run(), on every CUDA device of the pool, as PyTorch's parallel_apply does: the
// replica's kernels, and the copies that refresh it from the master (whose source lives
// on the master's device), are then ordered after what the caller queued, e.g. its
// optimizer step on a stream of its own.
std::vector<c10::Stream> DeviceWorkers::callers_cuda_streams() const {
  std::vector<c10::Stream> streams;
  for (const Device& device : devices_) {
    if (!device.is_cuda()) continue;
    const c10::Device d = device.torch_device();
    if (std::any_of(streams.begin(), streams.end(), [&](const c10::Stream& s) { return s.device() == d; })) continue;
    streams.push_back(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(d));
  }
  return streams;
}

void wait_for_device(const Device& device) {
  if (!device.is_cuda()) return;
  const c10::Device d = device.torch_device();
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(d.type());
  impl->synchronizeStream(impl->getStream(d));
}

bool pin_cpu_devices(const Environment& env) { return env("DATAPAR_PIN_CPU_DEVICES").value_or("1") != "0"; }

std::shared_ptr<DeviceWorkers> DeviceWorkers::for_devices(const std::vector<Device>& devices, bool pin_cpu_devices) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<DeviceWorkers>> pools;
  std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<DeviceWorkers>& slot = pools[to_string(devices) + (pin_cpu_devices ? "" : " unpinned")];
  if (auto pool = slot.lock()) return pool;
  auto pool = std::make_shared<DeviceWorkers>(devices, pin_cpu_devices);
  slot = pool;
  return pool;
}

DeviceWorkers::DeviceWorkers(std::vector<Device> devices, bool pin_cpu_devices)
    : devices_(std::move(devices)), shared_(std::make_unique<Shared>()) {
  DATAPAR_CHECK(!devices_.empty(), "DeviceWorkers: no devices given.");
  const std::vector<int> cpus = allowed_cpus();
  // The cores this process may use (taskset, cgroups), else the machine's.
  const int cores = cpus.empty() ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                                 : static_cast<int>(cpus.size());
  const int cpu_devices = static_cast<int>(
      std::count_if(devices_.begin(), devices_.end(), [](const Device& d) { return d.is_cpu(); }));
  const int process_default = at::get_num_threads();
  shared_->errors.resize(devices_.size());
  // Note [Pinning CPU devices]
  // Woken together, two workers can land on one core while the other idles: the scheduler
  // places a woken thread near its waker. Measured here (2 cores, MLP step): the replicas'
  // forwards ran one after the other in about a third of the steps. So when there are at
  // least as many allowed CPUs as CPU devices, each CPU device's thread (and the intra-op
  // threads it starts, which inherit it) is pinned to a disjoint share of the allowed CPUs.
  // pin_cpu_devices = false turns it off (DATAPAR_PIN_CPU_DEVICES=0, e.g. when an outer
  // scheduler pins threads).
  const bool pin = pin_cpu_devices && cpu_devices > 0 && static_cast<int>(cpus.size()) >= cpu_devices;
  const int per_device = pin ? static_cast<int>(cpus.size()) / cpu_devices : 0;
  int cpu_index = 0;
  int next_cpu = 0;
  for (size_t i = 0; i < devices_.size(); ++i) {
    auto worker = std::make_unique<Worker>();
    if (devices_[i].is_cpu()) {
      // Cores shared evenly; the first devices take the remainder.
      worker->intra_op_threads = std::max(1, cores / cpu_devices + (cpu_index < cores % cpu_devices));
      if (pin) {
        const int take = per_device + (cpu_index < static_cast<int>(cpus.size()) % cpu_devices);
        worker->cpus.assign(cpus.begin() + next_cpu, cpus.begin() + next_cpu + take);
        next_cpu += take;
      }
      ++cpu_index;
    } else {
      worker->intra_op_threads = process_default;
    }
    workers_.push_back(std::move(worker));
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    workers_[i]->thread = std::thread([this, i] { loop(i); });
  }
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->done.wait(lock, [&] { return shared_->started == devices_.size(); });
  lock.unlock();
  at::set_num_threads(process_default);  // Note [Intra-op threads per CPU device]
}

DeviceWorkers::~DeviceWorkers() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->wake.notify_all();
  for (auto& worker : workers_) worker->thread.join();
}

bool DeviceWorkers::runs_concurrently() const { return current_workers != this; }

int DeviceWorkers::intra_op_threads(size_t i) const { return workers_.at(i)->intra_op_threads; }

void DeviceWorkers::loop(size_t index) {
  current_workers = this;
  const Device device = devices_[index];
  if (!workers_[index]->cpus.empty()) {  // Note [Pinning CPU devices]
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : workers_[index]->cpus) CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);  // best effort: unpinned still works
  }
  // Note [Intra-op threads per CPU device]. get_num_threads() runs ATen's once-per-thread
  // initialisation first; otherwise it would run at the first parallel op and overwrite
  // this thread's count with the process-wide one.
  at::get_num_threads();
  at::set_num_threads(workers_[index]->intra_op_threads);
  Shared& s = *shared_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.started;
  }
  s.done.notify_all();

  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return s.generation.load(std::memory_order_acquire) != seen; }, kWorkerSpin);
    std::unique_lock<std::mutex> lock(s.mutex);
    s.wake.wait(lock, [&] { return s.stopping || (s.generation != seen && index < s.active && index != s.skip); });
    if (s.stopping) return;
    seen = s.generation;
    const auto* task = s.task;
    const auto* state = s.state;
    const auto* streams = s.streams;
    lock.unlock();

    std::exception_ptr error;
    try {
      at::ThreadLocalStateGuard tls(*state);
      if (device.is_cuda()) {
        // Note [The caller's streams]
        c10::MultiStreamGuard on_callers_streams(*streams);
        c10::DeviceGuard guard(device.torch_device());
        (*task)(index);
      } else if (!streams->empty()) {
        // A CPU device beside CUDA ones: its copies from and to the GPUs are ordered after
        // the caller's work too (Note [The caller's streams]).
        c10::MultiStreamGuard on_callers_streams(*streams);
        (*task)(index);
      } else {
        (*task)(index);
      }
    } catch (...) {
      error = std::current_exception();
    }

    lock.lock();
    s.errors[index] = error;
    const bool last = --s.pending == 0;
    lock.unlock();
    if (last) s.done.notify_all();
  }
}

void DeviceWorkers::run(size_t n, const std::function<void(size_t)>& task, const std::string& what,
                        size_t on_caller) {
  DATAPAR_INTERNAL_ASSERT(n <= devices_.size(), "run(", n, ") on ", devices_.size(), " devices");
  if (n == 0) return;
  std::vector<std::exception_ptr> errors(n);
  if (current_workers == this) {
    // Nested use from one of our own threads: the others may be busy with the outer call.
    for (size_t i = 0; i < n; ++i) {
      try {
        task(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  } else {
    std::lock_guard<std::mutex> one_at_a_time(shared_->run_mutex);
    const at::ThreadLocalState state;
    const std::vector<c10::Stream> streams = callers_cuda_streams();
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->task = &task;
      shared_->state = &state;
      shared_->streams = &streams;
      shared_->active = n;
      shared_->skip = on_caller;
      shared_->pending = on_caller < n ? n - 1 : n;
      ++shared_->generation;
    }
    shared_->wake.notify_all();
    if (on_caller < n) {
      try {
        task(on_caller);
      } catch (...) {
        errors[on_caller] = std::current_exception();
      }
    }
    spin_until([&] { return shared_->pending.load(std::memory_order_acquire) == 0; }, kCallerSpin);
    std::unique_lock<std::mutex> lock(shared_->mutex);
    shared_->done.wait(lock, [&] { return shared_->pending == 0; });
    for (size_t i = 0; i < n; ++i) {
      if (i != on_caller) errors[i] = std::exchange(shared_->errors[i], nullptr);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const c10::Error& e) {
      throw Error(str_cat(what, " on ", devices_[i].str(), " failed: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      throw Error(str_cat(what, " on ", devices_[i].str(), " failed: ", e.what()));
    } catch (...) {
      throw Error(str_cat(what, " on ", devices_[i].str(), " failed with an unknown exception."));
    }
  }
}

}  // namespace datapar::detail
