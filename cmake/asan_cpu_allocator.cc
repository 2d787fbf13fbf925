// Linked into every program of a DATAPAR_SANITIZE=address build that links Torch
// (cmake/datapar_sanitize.cmake): libtorch's CPU allocator, with large blocks reused the way
// AddressSanitizer's own quarantine would allow.
//
// Note [Large blocks under AddressSanitizer]
// ASan's allocator maps every allocation above 128 KiB afresh and unmaps it when it leaves the
// quarantine, so under ASan each training step's activations and gradients fault in new pages
// (and their shadow): the fault-tolerance scenario tests spent 37% of their CPU in the kernel,
// with 20x the page faults of the same run unsanitized. This allocator keeps freed large blocks
// instead, poisoned, and hands one out again only for a request of the same size class and only
// after another 256 MiB of large blocks were freed, ASan's default quarantine window. What ASan
// catches, this still catches: an access to a freed block (as use-after-poison) for as long as
// ASan would have, an overflow (the block's redzones stay ASan's, and the tail of a size class
// beyond the size asked for stays poisoned), a double free (the block is already in the cache).
// The cache is bounded; past the bound the oldest blocks go back to ASan. Measured on the HSDP
// kill test (LaunchFaultTolerant): page faults 5.5 M -> 2.9 M, CPU 50.9 -> 42.8 s.
// DATAPAR_ASAN_PLAIN_CPU_ALLOCATOR=1 leaves Torch's allocator in place (to compare, or to rule
// this out).
#include <sanitizer/asan_interface.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_map>

namespace {

constexpr size_t kLargeBlock = size_t{128} << 10;  // ASan's secondary allocator from here up
constexpr size_t kReuseWindow = size_t{256} << 20; // ASan's default quarantine_size_mb
constexpr size_t kCapacity = size_t{512} << 20;    // freed blocks kept at most

class LargeBlockReuse final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t bytes) const override {
    void* data = bytes >= kLargeBlock ? self().take(bytes, size_class(bytes)) : c10::alloc_cpu(bytes);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  static LargeBlockReuse& self() {
    static auto* instance = new LargeBlockReuse; // never destroyed: tensors outlive statics
    return *instance;
  }

private:
  struct Freed {
    void* data;
    size_t bytes;
    uint64_t freed_at; // freed_bytes_ when this block was freed
  };

  // Sizes rounded up to eight classes per power of two (at most 12.5% more), so that the
  // varying sizes of a step (a last batch, a shard) still find a block; the tail beyond the
  // size asked for stays poisoned, so an overflow into it is caught as before.
  static size_t size_class(size_t bytes) {
    size_t step = size_t{1} << (63 - __builtin_clzll(bytes) - 3);
    return (bytes + step - 1) / step * step;
  }

  void* take(size_t wanted, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto same_size = by_size_.find(bytes);
      if (same_size != by_size_.end() && !same_size->second.empty() &&
          freed_bytes_ - same_size->second.front()->freed_at >= kReuseWindow) {
        auto oldest = same_size->second.front();
        same_size->second.pop_front();
        void* data = oldest->data;
        cached_bytes_ -= bytes;
        freed_.erase(oldest);
        live_.emplace(data, bytes);
        ASAN_UNPOISON_MEMORY_REGION(data, wanted);
        return data;
      }
    }
    void* data = c10::alloc_cpu(bytes);
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(data) + wanted, bytes - wanted);
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(data, bytes);
    return data;
  }

  static void release(void* data) {
    if (data != nullptr) {
      self().give_back(data);
    }
  }

  void give_back(void* data) {
    std::deque<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto live = live_.find(data);
      if (live == live_.end()) {
        if (__asan_address_is_poisoned(data) != 0 && cached(data)) {
          std::fprintf(stderr, "asan_cpu_allocator: double free of the CPU block at %p\n", data);
          std::abort();
        }
        c10::free_cpu(data); // a small block: ASan's own
        return;
      }
      size_t bytes = live->second;
      live_.erase(live);
      ASAN_POISON_MEMORY_REGION(data, bytes);
      freed_bytes_ += bytes;
      cached_bytes_ += bytes;
      by_size_[bytes].push_back(freed_.insert(freed_.end(), Freed{data, bytes, freed_bytes_}));
      while (cached_bytes_ > kCapacity) {
        Freed oldest = freed_.front();
        by_size_[oldest.bytes].pop_front(); // the oldest of its size is the oldest of all
        freed_.pop_front();
        cached_bytes_ -= oldest.bytes;
        evicted.push_back(oldest.data);
      }
    }
    for (void* block : evicted) {
      c10::free_cpu(block); // ASan takes it into its quarantine from here
    }
  }

  bool cached(void* data) const {
    for (const Freed& block : freed_) {
      if (block.data == data) {
        return true;
      }
    }
    return false;
  }

  std::mutex mutex_;
  std::unordered_map<void*, size_t> live_; // large blocks handed out
  std::list<Freed> freed_;                 // oldest first
  std::unordered_map<size_t, std::deque<std::list<Freed>::iterator>> by_size_;
  uint64_t freed_bytes_ = 0;
  size_t cached_bytes_ = 0;
};

const bool installed = [] {
  if (std::getenv("DATAPAR_ASAN_PLAIN_CPU_ALLOCATOR") == nullptr) {
    c10::SetCPUAllocator(&LargeBlockReuse::self(), /*priority=*/1);
  }
  return true;
}();

} // namespace
