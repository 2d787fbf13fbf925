// The flight recorder: rings of each group's last collectives and their dumps
// (datapar/process_group/flight_recorder.h); flight_analysis.cc reads the dumps.
#include "process_group/flight_recorder.h"

#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/process_group/flight_recorder.h"
#include "file_system.h"

namespace datapar {
namespace detail {
namespace {

using nlohmann::json;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Settings {
  std::mutex mutex;
  bool read_environment = false;
  size_t entries = 0;
  std::string dir = ".";
  std::vector<std::weak_ptr<FlightRecorder>> recorders;
  std::atomic<bool> dumped_on_failure{false};
};

Settings& settings() {
  static Settings* s = new Settings;  // never destroyed: dumps may come while the process exits
  return *s;
}

// SIGUSR1: the handler only posts; a thread of the recorder's own dumps.
sem_t& signal_semaphore() {
  static sem_t s;
  return s;
}

void on_sigusr1(int) { sem_post(&signal_semaphore()); }

std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void dump_then_terminate() {
  flight_recorder_on_terminate();
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

// SIGUSR1's dump, and the dump before std::terminate ends the process.
void install_signal_dump() {
  static std::once_flag once;
  std::call_once(once, [] {
    previous_terminate = std::set_terminate(dump_then_terminate);
    sem_init(&signal_semaphore(), 0, 0);
    std::thread([] {
      for (;;) {
        while (sem_wait(&signal_semaphore()) != 0) {
        }
        const std::string path = dump_flight_recorder("SIGUSR1");
        if (!path.empty()) std::fprintf(stderr, "datapar: flight recorder: wrote %s (SIGUSR1)\n", path.c_str());
      }
    }).detach();
    struct sigaction action {};
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

// DATAPAR_FLIGHT_RECORDER and _DIR, once, unless enable_flight_recorder came first.
void read_environment(Settings& s) {
  if (s.read_environment) return;
  s.read_environment = true;
  const char* n = std::getenv("DATAPAR_FLIGHT_RECORDER");
  if (n == nullptr || *n == '\0') return;
  char* end = nullptr;
  const unsigned long long entries = std::strtoull(n, &end, 10);
  DATAPAR_CHECK(*end == '\0' && entries <= 10'000'000, "DATAPAR_FLIGHT_RECORDER=", n,
                ": give the number of collectives each group keeps (0: off; at most 10000000).");
  s.entries = static_cast<size_t>(entries);
  if (const char* dir = std::getenv("DATAPAR_FLIGHT_RECORDER_DIR"); dir != nullptr && *dir != '\0') s.dir = dir;
  if (s.entries > 0) install_signal_dump();
}

}  // namespace

void CollectiveRecord::end(bool ok, std::string why) {
  int expected = kPending;
  if (ok) {
    if (state.compare_exchange_strong(expected, kCompleted)) ended_ns.store(now_ns());
    return;
  }
  // The error is written by the one thread that wins the state, before it publishes kFailed.
  static std::mutex failing;
  const std::lock_guard<std::mutex> lock(failing);
  if (state.load() != kPending) return;
  error = std::move(why);
  ended_ns.store(now_ns());
  state.store(kFailed);
}

FlightRecorder::FlightRecorder(size_t capacity, std::string backend, int rank, int size)
    : capacity_(capacity), backend_(std::move(backend)), rank_(rank), size_(size) {
  name_ = str_cat(backend_, " group of ", size_);
}

std::shared_ptr<CollectiveRecord> FlightRecorder::issue(std::string op, std::string tensors, std::string site) {
  auto record = std::make_shared<CollectiveRecord>();
  record->op = std::move(op);
  record->tensors = std::move(tensors);
  record->site = std::move(site);
  record->issued_ns = now_ns();
  const std::lock_guard<std::mutex> lock(mutex_);
  record->seq = ++seq_;
  if (ring_.size() < capacity_) {
    ring_.push_back(record);
  } else {
    ring_[next_] = record;
    next_ = (next_ + 1) % capacity_;
  }
  return record;
}

void FlightRecorder::set_name(std::string name) {
  const std::lock_guard<std::mutex> lock(mutex_);
  name_ = std::move(name);
}

std::string FlightRecorder::to_json() const {
  json group;
  json entries = json::array();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    group = {{"name", name_}, {"backend", backend_}, {"rank", rank_}, {"size", size_}, {"capacity", capacity_}};
    for (size_t i = 0; i < ring_.size(); ++i) {
      const CollectiveRecord& r = *ring_[(next_ + i) % ring_.size()];
      const int state = r.state.load();
      json e = {{"seq", r.seq}, {"op", r.op}, {"tensors", r.tensors}, {"issued_ns", r.issued_ns},
                {"state", state == CollectiveRecord::kPending ? "pending"
                          : state == CollectiveRecord::kCompleted ? "completed" : "failed"}};
      if (!r.site.empty()) e["site"] = r.site;
      if (const int64_t started = r.started_ns.load(); started != 0) e["started_ns"] = started;
      if (state != CollectiveRecord::kPending) e["ended_ns"] = r.ended_ns.load();
      if (state == CollectiveRecord::kFailed) e["error"] = r.error;
      entries.push_back(std::move(e));
    }
  }
  group["entries"] = std::move(entries);
  return group.dump();
}

std::shared_ptr<FlightRecorder> make_flight_recorder(const std::string& backend, int rank, int size) {
  Settings& s = settings();
  const std::lock_guard<std::mutex> lock(s.mutex);
  read_environment(s);
  if (s.entries == 0) return nullptr;
  auto recorder = std::make_shared<FlightRecorder>(s.entries, backend, rank, size);
  s.recorders.erase(std::remove_if(s.recorders.begin(), s.recorders.end(),
                                   [](const std::weak_ptr<FlightRecorder>& w) { return w.expired(); }),
                    s.recorders.end());
  s.recorders.push_back(recorder);
  return recorder;
}

namespace {

struct InternalGroups {
  std::mutex mutex;
  std::vector<std::pair<const ProcessGroup*, std::weak_ptr<ProcessGroup>>> groups;
};

InternalGroups& internal_groups() {
  static InternalGroups* g = new InternalGroups;
  return *g;
}

}  // namespace

void mark_internal(const std::shared_ptr<ProcessGroup>& group) {
  if (!group) return;
  InternalGroups& g = internal_groups();
  const std::lock_guard<std::mutex> lock(g.mutex);
  g.groups.erase(std::remove_if(g.groups.begin(), g.groups.end(), [](const auto& e) { return e.second.expired(); }),
                 g.groups.end());
  g.groups.emplace_back(group.get(), group);
}

bool is_internal(const ProcessGroup* group) {
  InternalGroups& g = internal_groups();
  const std::lock_guard<std::mutex> lock(g.mutex);
  for (const auto& [raw, weak] : g.groups) {
    if (raw == group && !weak.expired()) return true;
  }
  return false;
}

void flight_recorder_on_failure(const std::string& what) {
  Settings& s = settings();
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.entries == 0 || s.recorders.empty()) return;
  }
  if (s.dumped_on_failure.exchange(true)) return;
  const std::string path = dump_flight_recorder("a collective failed: " + what);
  if (!path.empty()) std::fprintf(stderr, "datapar: flight recorder: wrote %s (a collective failed)\n", path.c_str());
}

void flight_recorder_on_terminate() {
  static std::atomic<bool> dumped{false};
  if (dumped.exchange(true)) return;
  const std::string path = dump_flight_recorder("the process ends in std::terminate");
  if (!path.empty()) std::fprintf(stderr, "datapar: flight recorder: wrote %s (terminating)\n", path.c_str());
}

}  // namespace detail

void enable_flight_recorder(size_t entries, const std::string& dir) {
  detail::Settings& s = detail::settings();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.read_environment = true;
  s.entries = entries;
  s.dir = dir.empty() ? "." : dir;
  s.dumped_on_failure = false;  // the next failure dumps again
  if (entries > 0) detail::install_signal_dump();
}

size_t flight_recorder_entries() {
  detail::Settings& s = detail::settings();
  const std::lock_guard<std::mutex> lock(s.mutex);
  detail::read_environment(s);
  return s.entries;
}

std::string dump_flight_recorder(const std::string& reason) {
  detail::Settings& s = detail::settings();
  std::vector<std::shared_ptr<detail::FlightRecorder>> live;
  std::string dir;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    for (const auto& w : s.recorders) {
      if (auto r = w.lock()) live.push_back(std::move(r));
    }
    dir = s.dir;
  }
  if (live.empty()) return "";
  const std::string rank = is_initialized() ? std::to_string(get_rank()) : "pid-" + std::to_string(::getpid());
  std::string text = detail::str_cat("{\"format\":\"datapar.flight_recorder/1\",\"rank\":\"", rank, "\",\"pid\":",
                                     ::getpid(), ",\"reason\":", nlohmann::json(reason).dump(),
                                     ",\"dumped_ns\":", detail::now_ns(), ",\"groups\":[");
  for (size_t i = 0; i < live.size(); ++i) text += (i ? "," : "") + live[i]->to_json();
  text += "]}\n";
  detail::make_directories(dir);
  const std::string path = dir + "/flight-recorder-rank-" + rank + ".json";
  // A temporary of this dump's own: two threads may dump at once (a failing collective and
  // SIGUSR1, or two groups failing), and writing one file together made a corrupt dump.
  static std::atomic<uint64_t> dumps{0};
  const std::string temp = detail::str_cat(path, ".part.", ::getpid(), ".", dumps.fetch_add(1));
  FILE* f = std::fopen(temp.c_str(), "w");
  if (f == nullptr) return "";
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written || std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return "";
  }
  return path;
}

namespace {

// -1: not read from the environment yet.
std::atomic<int>& checked_state() {
  static std::atomic<int> state{-1};
  return state;
}

}  // namespace

bool collectives_checked() {
  int state = checked_state().load(std::memory_order_relaxed);
  if (state < 0) {
    const char* v = std::getenv("DATAPAR_DISTRIBUTED_DEBUG");
    state = v != nullptr && std::string(v) == "DETAIL" ? 1 : 0;
    int unread = -1;
    checked_state().compare_exchange_strong(unread, state);
    state = checked_state().load();
  }
  return state == 1;
}

void check_collectives(bool on) { checked_state().store(on ? 1 : 0); }

}  // namespace datapar
