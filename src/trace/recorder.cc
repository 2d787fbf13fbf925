// See trace.h and recorder.h.
//
// Note [One recorder, never freed]
// Threads the library does not control (a process group's runner, the NCCL watchdog, DDP's
// autograd hooks) record while the program may stop the recording. So the recorder is one
// static object that lives as long as the process, and so is every thread's buffer: `on`
// is the only thing an instrumented place reads when recording is off.
//
// Note [A buffer per thread]
// Each thread appends to its own buffer, under the buffer's own mutex, which only stop()
// and start() ever take besides it: uncontended, so no thread waits for another. A single
// shared lock made the training thread wait for the communication thread (and the other
// way round) whenever the scheduler had preempted the holder, which on a machine whose
// cores are all busy training cost milliseconds. An event checks `on` under its buffer's
// lock, so one that raced with stop() is either collected or dropped, never half-written.
#include "trace/recorder.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "datapar/error.h"

namespace datapar::trace {
namespace detail {
namespace {

struct ThreadBuffer {
  std::mutex mutex;
  std::vector<Event> events;  // guarded by mutex
  uint32_t row = 0;
};

struct Recorder {
  std::atomic<bool> on{false};
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> kept{0};     // events in the current recording, for the cap
  std::atomic<int64_t> dropped{0};  // events past it
  std::mutex mutex;                 // guards what follows
  Clock::time_point origin;
  std::chrono::system_clock::time_point wall_origin;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // one per thread that ever recorded
  std::vector<std::string> threads;                    // row names, by row
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // Note [One recorder, never freed]
  return *r;
}

thread_local ThreadBuffer* t_buffer = nullptr;
thread_local std::string t_name;  // from name_thread(), for a buffer made later

// The calling thread's buffer, made (and its row numbered) on first use: threads that never
// record cost nothing.
ThreadBuffer& buffer() {
  if (t_buffer) return *t_buffer;
  Recorder& r = recorder();
  auto made = std::make_shared<ThreadBuffer>();
  std::lock_guard<std::mutex> lock(r.mutex);
  made->row = static_cast<uint32_t>(r.threads.size());
  r.threads.push_back(t_name.empty() ? "thread " + std::to_string(made->row) : t_name);
  r.buffers.push_back(made);
  t_buffer = made.get();
  return *t_buffer;
}

struct Label {
  const char* kind = nullptr;
  int64_t index = -1;
  int64_t bytes = -1;
};
thread_local Label t_label;

// `event.thread` == UINT32_MAX: the calling thread's row.
void append(Event event) noexcept {
  Recorder& r = recorder();
  try {
    ThreadBuffer& b = buffer();
    if (event.thread == UINT32_MAX) event.thread = b.row;
    std::lock_guard<std::mutex> lock(b.mutex);  // Note [A buffer per thread]
    if (!r.on.load(std::memory_order_relaxed)) return;  // stopped meanwhile
    if (r.kept.fetch_add(1, std::memory_order_relaxed) >= static_cast<int64_t>(kMaxEvents)) {
      r.dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    b.events.push_back(std::move(event));
  } catch (...) {
    // Out of memory while growing the list: the event is lost, the training goes on.
  }
}

}  // namespace

Recording stop(const char* caller) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  DATAPAR_CHECK(r.on.load(), caller, ": no trace is being recorded; call datapar::trace::start() first.");
  r.on.store(false);
  Recording out;
  out.origin = r.origin;
  out.wall_origin = r.wall_origin;
  out.threads = r.threads;
  for (const auto& b : r.buffers) {
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    for (Event& e : b->events) out.events.push_back(std::move(e));
    b->events = {};
  }
  out.dropped = r.dropped.load();
  return out;
}

CollectiveLabel::CollectiveLabel(const char* kind, int64_t index, int64_t bytes) noexcept
    : kind_(t_label.kind), index_(t_label.index), bytes_(t_label.bytes) {
  t_label = {kind, index, bytes};
}

CollectiveLabel::~CollectiveLabel() { t_label = {kind_, index_, bytes_}; }

std::string collective_site() {
  if (t_label.kind == nullptr) return "";
  return std::string(t_label.kind) + " " + std::to_string(t_label.index);
}

Queued queued() noexcept {
  Queued q;
  if (!enabled()) return q;
  q.on = true;
  q.at = Clock::now();
  q.step = recorder().step.load(std::memory_order_relaxed);
  try {
    q.thread = buffer().row;
  } catch (...) {
    q.on = false;
  }
  q.kind = t_label.kind;
  q.index = t_label.index;
  q.bytes = t_label.bytes;
  return q;
}

void record_collective(const Queued& queued, const std::string& what, Clock::time_point started,
                       Clock::time_point finished) noexcept {
  if (!queued.on || !enabled()) return;
  try {
    Event e;
    e.text = queued.kind ? what + " " + queued.kind + " " + std::to_string(queued.index) : what;
    e.category = queued.kind ? queued.kind : "collective";
    e.at = started;
    e.duration = finished - started;
    e.thread = UINT32_MAX;  // the running thread
    e.step = queued.step;
    e.kind = queued.kind;
    e.index = queued.index;
    e.bytes = queued.bytes;
    e.queued = queued.at;
    if (!queued.kind) {
      append(std::move(e));
      return;
    }
    // And the moment it was queued, on the queuing thread's row.
    Event mark = e;
    mark.text = std::string("queue ") + queued.kind + " " + std::to_string(queued.index);
    mark.phase = 'i';
    mark.at = queued.at;
    mark.duration = Clock::duration{0};
    mark.thread = queued.thread;
    append(std::move(e));
    append(std::move(mark));
  } catch (...) {
  }
}

}  // namespace detail

void start() {
  detail::Recorder& r = detail::recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  DATAPAR_CHECK(!r.on.load(), "datapar::trace::start: a trace is being recorded already; save() it first.");
  for (const auto& b : r.buffers) {  // empty since stop(), but for events that raced with it
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    b->events.clear();
  }
  r.kept.store(0);
  r.dropped.store(0);
  r.origin = Clock::now();
  r.wall_origin = std::chrono::system_clock::now();
  r.on.store(true);
}

bool enabled() noexcept { return detail::recorder().on.load(std::memory_order_relaxed); }

void set_step(int64_t step) noexcept { detail::recorder().step.store(step, std::memory_order_relaxed); }

void name_thread(const std::string& name) {
  detail::t_name = name;
  if (!detail::t_buffer) return;  // named when it first records
  detail::Recorder& r = detail::recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.threads[detail::t_buffer->row] = name;
}

void mark(const std::string& text, const char* category) noexcept {
  if (!enabled()) return;
  try {
    detail::Event e;
    e.text = text;
    e.category = category;
    e.phase = 'i';
    e.at = Clock::now();
    e.thread = UINT32_MAX;
    e.step = detail::recorder().step.load(std::memory_order_relaxed);
    detail::append(std::move(e));
  } catch (...) {
  }
}

Span::Span(const char* name, const char* category) noexcept : name_(name), category_(category), on_(enabled()) {
  if (on_) start_ = Clock::now();
}

Span::~Span() {
  if (!on_) return;
  const Clock::time_point end = Clock::now();
  detail::Event e;
  e.name = name_;
  e.category = category_;
  e.at = start_;
  e.duration = end - start_;
  e.thread = UINT32_MAX;
  e.step = detail::recorder().step.load(std::memory_order_relaxed);
  detail::append(std::move(e));
}

}  // namespace datapar::trace
