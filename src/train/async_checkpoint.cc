// train::AsyncCheckpointWriter. See datapar/train/async_checkpoint.h.
#include "datapar/train/async_checkpoint.h"

#include <chrono>
#include <utility>

#include "datapar/dcp/async_save.h"
#include "datapar/train/dcp_checkpoint.h"
#include "serialization/background_writer.h"
#include "serialization/staging_memory.h"

namespace datapar::train {

struct AsyncCheckpointWriter::Impl {
  explicit Impl(std::shared_ptr<ProcessGroup> group) : dcp(std::move(group)) {}
  dcp::AsyncSaver dcp;  // save_dcp
  ::datapar::detail::StagingMemory staging;  // save: the torch format's
  double last_blocked = 0;
  ::datapar::detail::BackgroundWriter writer;  // last: its thread ends before the staging goes
};

AsyncCheckpointWriter::AsyncCheckpointWriter(std::shared_ptr<ProcessGroup> dcp_group)
    : impl_(std::make_unique<Impl>(std::move(dcp_group))) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() = default;

void AsyncCheckpointWriter::save(const Checkpoint& c, const std::string& path, int64_t rank) {
  if (rank != 0) return;  // as save_checkpoint: rank 0 writes
  const auto start = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  s.writer.begin(path);
  auto staged = std::make_shared<Checkpoint>();
  s.staging.begin();
  for (const auto& item : c.model) staged->model.insert(item.key(), s.staging.stage(item.value()));
  staged->optimizer = s.staging.stage(c10::IValue(c.optimizer)).toGenericDict();
  staged->epoch = c.epoch;
  staged->progress = c.progress;
  staged->rng.cpu = s.staging.stage(c.rng.cpu);
  for (const at::Tensor& t : c.rng.cuda) staged->rng.cuda.push_back(s.staging.stage(t));
  s.writer.start(path, [staged, path] { save_checkpoint(*staged, path, 0); });
  s.last_blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void AsyncCheckpointWriter::save_dcp(const Checkpoint& c, const torch::nn::Module& module, const std::string& path,
                                     ZeroRedundancyOptimizer* zero) {
  impl_->dcp.save(dcp_checkpoint_state(c, module, zero), path);
  impl_->last_blocked = impl_->dcp.last_blocked_seconds();
}

void AsyncCheckpointWriter::check() {
  impl_->writer.check();
  impl_->dcp.check();
}

void AsyncCheckpointWriter::wait() {
  impl_->writer.wait();
  impl_->dcp.wait();
}

bool AsyncCheckpointWriter::in_flight() const { return impl_->writer.busy() || impl_->dcp.in_flight(); }
double AsyncCheckpointWriter::last_blocked_seconds() const { return impl_->last_blocked; }

}  // namespace datapar::train
