#include "datapar/ddp/comm_hook.h"

#include <ATen/ATen.h>

namespace datapar {
namespace {

class AllReduceHook : public CommHook {
 public:
  std::shared_ptr<Work> run(ProcessGroup& group, GradBucket& bucket) override {
    return group.all_reduce(bucket.buffer, ReduceOp::kSum);
  }
};

class CompressHook : public CommHook {
 public:
  explicit CompressHook(at::ScalarType wire_type) : wire_type_(wire_type) {}

  std::shared_ptr<Work> run(ProcessGroup& group, GradBucket& bucket) override {
    if (bucket.buffer.scalar_type() == wire_type_) return group.all_reduce(bucket.buffer, ReduceOp::kSum);
    bucket.scratch = bucket.buffer.to(wire_type_);
    return group.all_reduce(bucket.scratch, ReduceOp::kSum);
  }

  void finish(GradBucket& bucket) override {
    if (bucket.scratch.defined()) bucket.buffer.copy_(bucket.scratch);
    bucket.scratch.reset();
  }

 private:
  at::ScalarType wire_type_;
};

}  // namespace

std::shared_ptr<CommHook> all_reduce_hook() { return std::make_shared<AllReduceHook>(); }
std::shared_ptr<CommHook> bf16_compress_hook() { return std::make_shared<CompressHook>(at::kBFloat16); }
std::shared_ptr<CommHook> fp16_compress_hook() { return std::make_shared<CompressHook>(at::kHalf); }

}  // namespace datapar
