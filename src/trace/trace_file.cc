// The Chrome trace document (trace.h): events as the format wants them, and one file for the
// whole job, written by rank 0 from every rank's events sent through the job's store.
//
// Note [One clock for the job]
// Each rank records on its steady clock from its own origin. To line the ranks up, rank 0
// puts its wall-clock origin in the store and every rank shifts its times by the difference
// of the two wall-clock origins: exact on one machine, as good as the hosts' clock
// synchronisation across machines (NTP: well under a millisecond, against steps of tens).
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "datapar/error.h"
#include "datapar/rendezvous/store.h"
#include "serialization/atomic_file.h"
#include "trace/recorder.h"

namespace datapar::trace {
namespace detail {
namespace {

using datapar::detail::str_cat;

const char* const kPrefix = "datapar/trace/";
constexpr size_t kChunkBytes = size_t{4} << 20;  // per store value, far below a frame's limit
// A rank's events as rank 0 takes them at most: kMaxEvents (recorder.h) of about 200 bytes.
constexpr size_t kMaxRankBytes = size_t{2} << 30;

void append_escaped(std::string& out, const char* s) {
  out += '"';
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// Microseconds, the format's unit, with nanosecond digits.
void append_us(std::string& out, Clock::duration d) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%" PRId64 ".%03" PRId64, ns < 0 ? "-" : "", (ns < 0 ? -ns : ns) / 1000,
                (ns < 0 ? -ns : ns) % 1000);
  out += buf;
}

void append_metadata(std::string& out, const char* what, int rank, int64_t thread, const std::string& name) {
  out += str_cat(R"({"ph":"M","name":")", what, R"(","pid":)", rank);
  if (thread >= 0) out += str_cat(R"(,"tid":)", thread);
  out += R"(,"args":{"name":)";
  append_escaped(out, name.c_str());
  out += "}}";
}

}  // namespace

std::string events_json(const Recording& recording, int rank, Clock::duration shift) {
  std::string out;
  out.reserve(recording.events.size() * 160 + 256);
  append_metadata(out, "process_name", rank, -1, "rank " + std::to_string(rank));
  out += str_cat(R"(,{"ph":"M","name":"process_sort_index","pid":)", rank, R"(,"args":{"sort_index":)", rank, "}}");
  for (size_t t = 0; t < recording.threads.size(); ++t) {
    out += ',';
    append_metadata(out, "thread_name", rank, static_cast<int64_t>(t), recording.threads[t]);
  }
  for (const Event& e : recording.events) {
    out += R"(,{"name":)";
    append_escaped(out, e.name ? e.name : e.text.c_str());
    out += R"(,"cat":)";
    append_escaped(out, e.category);
    out += R"(,"ph":")";
    out += e.phase;
    out += R"(","ts":)";
    append_us(out, e.at - recording.origin + shift);
    if (e.phase == 'X') {
      out += R"(,"dur":)";
      append_us(out, e.duration);
    } else {
      out += R"(,"s":"t")";
    }
    out += str_cat(R"(,"pid":)", rank, R"(,"tid":)", e.thread, R"(,"args":{"rank":)", rank, R"(,"step":)", e.step);
    if (e.kind) {
      out += str_cat(R"(,")", e.kind, R"(":)", e.index, R"(,"bytes":)", e.bytes, R"(,"queued_ts":)");
      append_us(out, e.queued - recording.origin + shift);
    }
    out += "}}";
  }
  if (recording.dropped > 0) {
    out += str_cat(R"(,{"name":"events dropped","cat":"trace","ph":"i","s":"p","ts":0,"pid":)", rank,
                   R"(,"tid":0,"args":{"rank":)", rank, R"(,"dropped":)", recording.dropped, "}}");
  }
  return out;
}

namespace {

// A document is the prologue, comma-separated events, the epilogue.
const char* const kPrologue = R"({"displayTimeUnit":"ms","traceEvents":[)";
const char* const kEpilogue = "]}\n";

int64_t wall_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

void write_file(const std::string& path, const std::vector<std::string>& parts) {
  datapar::detail::AtomicFile file(path);
  for (const std::string& part : parts) file.write(part.data(), part.size());
  file.commit();
}

}  // namespace

void save_alone(const std::string& path) {
  DATAPAR_CHECK(!path.empty(), "datapar::trace::save: the path is empty.");
  const Recording recording = stop("datapar::trace::save");
  write_file(path, {kPrologue, events_json(recording, 0, Clock::duration{0}), kEpilogue});
}

}  // namespace detail

std::string stop_to_json(int rank) {
  const detail::Recording recording = detail::stop("datapar::trace::stop_to_json");
  return detail::kPrologue + detail::events_json(recording, rank, Clock::duration{0}) + detail::kEpilogue;
}

void save(const std::string& path, Store& store, int rank, int world) {
  using datapar::detail::str_cat;
  DATAPAR_CHECK(!path.empty(), "datapar::trace::save: the path is empty.");
  DATAPAR_CHECK(world >= 1 && rank >= 0 && rank < world, "datapar::trace::save: rank ", rank, " of ", world,
                " is not a rank of the job.");
  const detail::Recording recording = detail::stop("datapar::trace::save");
  const std::string origin_key = std::string(detail::kPrefix) + "origin";
  // Note [One clock for the job]
  if (rank == 0) store.set(origin_key, std::to_string(detail::wall_ns(recording.wall_origin)));
  int64_t origin = 0;
  try {
    origin = std::stoll(store.get_string(origin_key));
  } catch (const std::logic_error&) {
    throw Error("datapar::trace::save: the job's trace origin in the store is not a number.");
  }
  const Clock::duration shift = std::chrono::nanoseconds(detail::wall_ns(recording.wall_origin) - origin);
  std::string mine = detail::events_json(recording, rank, shift);
  const std::string key = str_cat(detail::kPrefix, rank);
  if (rank != 0) {
    size_t chunks = 0;
    for (size_t at = 0; at < mine.size(); at += detail::kChunkBytes, ++chunks) {
      store.set(str_cat(key, "/", chunks), mine.substr(at, detail::kChunkBytes));
    }
    store.set(key, std::to_string(chunks));  // last: rank 0 reads the chunks once it sees this
    return;
  }
  // Rank 0: its own events, then each rank's as they come, freed from the store as read.
  std::vector<std::string> parts;
  parts.emplace_back(detail::kPrologue);
  parts.push_back(std::move(mine));
  for (int r = 1; r < world; ++r) {
    const std::string their = str_cat(detail::kPrefix, r);
    size_t chunks = 0;
    try {
      chunks = std::stoul(store.get_string(their));
    } catch (const TimeoutError&) {
      throw TimeoutError(str_cat("datapar::trace::save: rank ", r, " sent no trace events within ",
                                 store.timeout().count(), " ms. Every rank of the job must call save()."));
    } catch (const std::logic_error&) {
      throw Error(str_cat("datapar::trace::save: rank ", r, "'s chunk count in the store is not a number."));
    }
    // What a rank sends is checked before a byte of it is written (issue 27): its size, and
    // that it is events rank 0 can put in the document, so that a damaged part fails the
    // save instead of writing a file no viewer opens.
    if (chunks > detail::kMaxRankBytes / detail::kChunkBytes) {
      throw Error(str_cat("datapar::trace::save: rank ", r, " would send ", chunks, " chunks of trace events, more than ",
                          detail::kMaxRankBytes >> 30, " GiB; not written."));
    }
    std::string events;
    for (size_t c = 0; c < chunks; ++c) {
      const std::string chunk = store.get_string(str_cat(their, "/", c));
      store.delete_key(str_cat(their, "/", c));
      if (chunk.size() > detail::kChunkBytes) {
        throw Error(str_cat("datapar::trace::save: rank ", r, "'s chunk ", c, " holds ", chunk.size(),
                            " bytes, more than a chunk's ", detail::kChunkBytes, "; not written."));
      }
      events += chunk;
    }
    store.delete_key(their);
    if (!nlohmann::json::accept("[" + events + "]")) {
      throw Error(str_cat("datapar::trace::save: rank ", r, "'s trace events are not JSON (", events.size(),
                          " bytes); ", path, " was not written. Did every rank run the same datapar?"));
    }
    if (events.empty()) continue;
    parts.emplace_back(",");
    parts.push_back(std::move(events));
  }
  store.delete_key(origin_key);  // every rank read it before sending
  parts.emplace_back(detail::kEpilogue);
  detail::write_file(path, parts);
}

}  // namespace datapar::trace
