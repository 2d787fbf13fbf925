// dcp::AsyncSaver. See datapar/dcp/async_save.h.
#include "datapar/dcp/async_save.h"

#include <chrono>
#include <utility>

#include "dcp/save_plan.h"
#include "serialization/background_writer.h"
#include "serialization/staging_memory.h"

namespace datapar::dcp {

struct AsyncSaver::Impl {
  std::shared_ptr<ProcessGroup> group;
  ::datapar::detail::StagingMemory staging;
  detail::PlanMemo plan_memo;  // the last save's plan, for the next of the same layout
  double last_blocked = 0;
  ::datapar::detail::BackgroundWriter writer;  // last: its thread ends before the rest goes
};

AsyncSaver::AsyncSaver(std::shared_ptr<ProcessGroup> group) : impl_(std::make_unique<Impl>()) {
  impl_->group = std::move(group);
}

AsyncSaver::~AsyncSaver() = default;
AsyncSaver::AsyncSaver(AsyncSaver&&) noexcept = default;
AsyncSaver& AsyncSaver::operator=(AsyncSaver&&) noexcept = default;

void AsyncSaver::save(const State& state, const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  s.writer.begin(dir);
  // Planned here, with every rank (save_plan.h): then only what this rank writes is staged.
  // A directory it cannot use, or ranks whose states differ, throw here, as dcp::save.
  std::shared_ptr<ProcessGroup> group = s.group;
  std::shared_ptr<const detail::SavePlan> plan = detail::plan_save(state, dir, group.get(), &s.plan_memo);
  auto staged = std::make_shared<State>(state);  // the entries' names and values; the tensors next
  s.staging.begin();
  for (size_t i = 0; i < staged->entries().size(); ++i) {
    State::Entry& entry = staged->entries()[i];
    const bool mine = detail::writes_entry(*plan, i);
    for (Shard& box : entry.boxes) box.local = mine ? s.staging.stage(box.local) : at::Tensor();
  }
  s.writer.start(dir, [staged, plan, group] { detail::write_planned(*staged, *plan, group.get()); });
  s.last_blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void AsyncSaver::check() { impl_->writer.check(); }
void AsyncSaver::wait() { impl_->writer.wait(); }
bool AsyncSaver::in_flight() const { return impl_->writer.busy(); }
double AsyncSaver::last_blocked_seconds() const { return impl_->last_blocked; }
int64_t AsyncSaver::staging_bytes() const { return impl_->staging.bytes(); }

}  // namespace datapar::dcp
