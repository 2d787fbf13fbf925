// The flight recorder's inside (datapar/process_group/flight_recorder.h): each recording
// group's ring of its last N collectives, the records their Works fill in when they end, and
// the registry every dump walks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace datapar {
class ProcessGroup;
}  // namespace datapar

namespace datapar::detail {

// One collective as the recorder keeps it; its Work says how it ended (Work::finish/fail).
struct CollectiveRecord {
  enum State : int { kPending = 0, kCompleted = 1, kFailed = 2 };
  int64_t seq = 0;          // the group's count of collectives, from 1
  std::string op;           // "all_reduce(sum)"
  std::string tensors;      // "float32[1024]", "float32[512] x2", ...
  std::string site;         // who issued it, where known: "bucket 3" (trace::detail::CollectiveLabel)
  int64_t issued_ns = 0;    // system clock
  std::atomic<int64_t> started_ns{0};  // when the backend began to run it; 0: not (yet) known
  std::atomic<int64_t> ended_ns{0};
  std::atomic<int> state{kPending};
  std::string error;        // written before state becomes kFailed

  // The first end counts (an abort may fail a Work its backend completes later).
  void end(bool ok, std::string why);
};

class FlightRecorder {
 public:
  FlightRecorder(size_t capacity, std::string backend, int rank, int size);

  // A collective issued now: its record, kept in the ring (the oldest dropped).
  std::shared_ptr<CollectiveRecord> issue(std::string op, std::string tensors, std::string site = "");
  // The group's name in dumps, the same on every rank ("default", "group/3").
  void set_name(std::string name);
  // The group and its records, oldest first, as a JSON object's text.
  std::string to_json() const;

 private:
  const size_t capacity_;
  const std::string backend_;
  const int rank_, size_;
  mutable std::mutex mutex_;
  std::string name_;
  std::vector<std::shared_ptr<CollectiveRecord>> ring_;
  size_t next_ = 0;  // where the next record goes once the ring is full
  int64_t seq_ = 0;
};

// A recorder for a new group of `backend`, registered for dumps; null when the recorder is
// off (DATAPAR_FLIGHT_RECORDER unset or 0, and enable_flight_recorder not called).
std::shared_ptr<FlightRecorder> make_flight_recorder(const std::string& backend, int rank, int size);

// `group` makes its operations on behalf of another group (the CUDA staging group's host
// group, the shared-memory group's transports), which records and checks them: it keeps no
// records and makes no DETAIL check of its own. (Recorded twice, one Work would carry two
// records, and the inner group's would shadow the one the user's group is known by.)
void mark_internal(const std::shared_ptr<ProcessGroup>& group);
bool is_internal(const ProcessGroup* group);

// A collective failed or timed out: the first time, every group's records are dumped.
void flight_recorder_on_failure(const std::string& what);
// The process is ending in std::terminate (an uncaught exception; Gloo's own threads end so
// when a peer's bytes do not fit): the records are dumped, once.
void flight_recorder_on_terminate();

}  // namespace datapar::detail
