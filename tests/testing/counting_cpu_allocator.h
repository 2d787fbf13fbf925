// The bytes of CPU tensors a process holds, and their peak: an allocator installed over
// libtorch's CPU allocator (c10::SetCPUAllocator) that counts what it hands out and gets
// back. Process-wide: install it in a process of its own (a forked member of a test job),
// before the tensors it should count are made; tensors made before keep their own deleter
// and are not counted.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace datapar::testing {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  CountingCpuAllocator() : base_(c10::GetCPUAllocator()) {}

  // From now on every CPU tensor is allocated here. The allocator must outlive them (a
  // static, in a process that ends without freeing them all).
  void install() { c10::SetCPUAllocator(this, /*priority=*/100); }

  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  // The peak from now on starts at what is live now.
  void reset_peak() { peak_.store(live_.load()); }

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return counted(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return counted(n); }
#endif

 private:
  struct Block {
    c10::DataPtr inner;
    int64_t bytes;
    CountingCpuAllocator* owner;
  };

  static void release(void* context) {
    auto* block = static_cast<Block*>(context);
    block->owner->live_ -= block->bytes;
    delete block;  // frees the memory through the base allocator's deleter
  }

  c10::DataPtr counted(size_t n) const {
    auto* self = const_cast<CountingCpuAllocator*>(this);
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    auto* block = new Block{std::move(inner), static_cast<int64_t>(n), self};
    const int64_t now = self->live_ += static_cast<int64_t>(n);
    int64_t peak = self->peak_.load();
    while (now > peak && !self->peak_.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(data, block, &release, c10::Device(c10::DeviceType::CPU));
  }

  c10::Allocator* base_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace datapar::testing
