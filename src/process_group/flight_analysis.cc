// What a job's flight recorder dumps say: analyze_flight_records
// (datapar/process_group/flight_recorder.h), behind `datapar analyze DIR`.
//
// Note [Reading a job's dumps]
// Each group numbers its collectives from 1 on every rank alike, so the records of one
// sequence number on every rank are the same call, if the program is right. The analysis
// walks the numbers every rank still holds (a ring drops the oldest) and stops at the first
// where the ranks part: one that has no record of it (it has not issued it: asleep, stuck
// elsewhere, or it skipped a collective and the others wait), or records that differ in the
// operation, the dtypes or the sizes (the bytes of one collective met another's). Failing
// that, the last number says where each rank is: completed, failed (and why) or pending.
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/flight_recorder.h"
#include "file_system.h"

namespace datapar {
namespace {

using detail::str_cat;
using nlohmann::json;

struct Entry {
  int64_t seq = 0;
  std::string op, tensors, state, error, site;
  int64_t issued_ns = 0, started_ns = 0, ended_ns = 0;
  std::string call() const { return tensors.empty() ? op : op + " on " + tensors; }
};

struct RankRecords {
  std::vector<Entry> entries;  // by seq
  int64_t dumped_ns = 0;
  std::string reason;
};

struct Group {
  int size = 0;
  std::string backend;
  std::map<int, RankRecords> ranks;
};

// "ranks 0, 2" / "rank 1".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

const Entry* find(const RankRecords& r, int64_t seq) {
  const auto it = std::lower_bound(r.entries.begin(), r.entries.end(), seq,
                                   [](const Entry& e, int64_t s) { return e.seq < s; });
  return it != r.entries.end() && it->seq == seq ? &*it : nullptr;
}

std::string seconds_before(int64_t then_ns, int64_t now_ns) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << (now_ns - then_ns) / 1e9 << " s before its dump";
  return s.str();
}

// Where `rank` is: its last record.
std::string last_of(int rank, const RankRecords& r) {
  if (r.entries.empty()) return str_cat("rank ", rank, " has issued no collective on it");
  const Entry& e = r.entries.back();
  std::string text = str_cat("rank ", rank, "'s last is #", e.seq, " ", e.call(),
                             e.site.empty() ? "" : " (" + e.site + ")", ", ", e.state);
  if (e.state == "pending") {
    text += " since " + seconds_before(e.issued_ns, r.dumped_ns);
    // Issued long before it ran: the group's earlier work held it back.
    if (e.started_ns != 0 && e.started_ns - e.issued_ns >= 100'000'000) {
      text += str_cat(" (running from ", seconds_before(e.started_ns, r.dumped_ns), ")");
    }
    return text;
  }
  if (e.state == "failed") return text + " (" + e.error + ")";
  return text + " " + seconds_before(e.ended_ns, r.dumped_ns);
}

// Where the ranks part at `seq`: the calls that differ there, and the ranks that have not issued it.
std::string parting(const Group& g, int64_t seq, const std::vector<std::pair<std::string, std::vector<int>>>& by_call,
                    const std::vector<int>& absent) {
  std::string text = str_cat("the ranks part at collective #", seq, ". ");
  if (by_call.size() > 1) {
    text += "They called different collectives there: ";
    size_t i = 0;
    for (const auto& [call, ranks] : by_call) {
      text += str_cat(i++ ? "; " : "", ranks_text(ranks), " called ", call);
    }
    text += ". Each collective must be called by every rank with the same operation, dtype and sizes, in the "
            "same order: find where the program takes another path";
    // The fewest ranks that agree are the likely odd ones out, when they are fewer than the rest.
    const auto fewest = std::min_element(by_call.begin(), by_call.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size();
    });
    const size_t as_few = std::count_if(by_call.begin(), by_call.end(), [&](const auto& c) {
      return c.second.size() == fewest->second.size();
    });
    text += as_few == 1 ? " on " + ranks_text(fewest->second) + "." : ".";
  }
  if (!absent.empty()) {
    if (by_call.size() > 1) text += " ";
    const auto& [call, waiting] = by_call.front();
    text += str_cat(ranks_text(absent), absent.size() == 1 ? " has" : " have", " not issued it",
                    by_call.size() == 1 ? str_cat(" (", call, ", which ", ranks_text(waiting), " issued)") : "",
                    ": ");
    for (size_t i = 0; i < absent.size(); ++i) text += (i ? "; " : "") + last_of(absent[i], g.ranks.at(absent[i]));
    text += ". A rank that is slow, asleep or stuck outside the collectives, or one that skipped a collective, "
            "keeps the others waiting.";
  }
  return text;
}

// No rank parts from the others in [first, last]: where each rank is at the last.
std::string agreement(const Group& g, int64_t first, int64_t last) {
  std::vector<int> completed, pending, failed;
  std::string error;
  Entry last_entry;
  for (const auto& [rank, r] : g.ranks) {
    const Entry* e = find(r, last);
    last_entry = *e;
    if (e->state == "completed") completed.push_back(rank);
    if (e->state == "pending") pending.push_back(rank);
    if (e->state == "failed") {
      failed.push_back(rank);
      if (error.empty()) error = e->error;
    }
  }
  const int64_t count = last - first + 1;
  std::string text = count == 1 ? str_cat("every rank issued the same collective, #", last, ", ", last_entry.call(), ", ")
                                : str_cat("every rank issued the same ", count, " collectives (#", first, " to #", last,
                                          "); the last, ", last_entry.call(), ", ");
  if (pending.empty() && failed.empty()) return text + "completed on every rank.";
  std::vector<std::string> parts;
  if (!completed.empty()) parts.push_back("completed on " + ranks_text(completed));
  if (!pending.empty()) parts.push_back("is pending on " + ranks_text(pending));
  if (!failed.empty()) parts.push_back("failed on " + ranks_text(failed) + " (" + error + ")");
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text + ".";
}

std::string analyze_group(const std::string& name, const Group& g) {
  const std::string head = str_cat("Group \"", name, "\" (", g.backend, ", ", g.size, " ranks): ");
  std::vector<int> missing;
  for (int r = 0; r < g.size; ++r) {
    if (g.ranks.count(r) == 0) missing.push_back(r);
  }
  std::string missing_text;
  if (!missing.empty()) {
    missing_text = str_cat(" ", ranks_text(missing), " left no dump (",
                           "hung or gone: send it SIGUSR1 to have it write one).");
  }
  // The numbers every rank still holds: from the newest oldest to the newest newest.
  int64_t first = 1, last = 0;
  for (const auto& [rank, r] : g.ranks) {
    if (!r.entries.empty()) {
      first = std::max(first, r.entries.front().seq);
      last = std::max(last, r.entries.back().seq);
    }
  }
  for (int64_t seq = first; seq <= last; ++seq) {
    std::vector<std::pair<std::string, std::vector<int>>> by_call;  // in the order of their first rank
    std::vector<int> absent;
    for (const auto& [rank, r] : g.ranks) {
      const Entry* e = find(r, seq);
      if (e == nullptr) {
        absent.push_back(rank);
        continue;
      }
      const auto same = std::find_if(by_call.begin(), by_call.end(), [&](const auto& c) { return c.first == e->call(); });
      if (same == by_call.end()) {
        by_call.push_back({e->call(), {rank}});
      } else {
        same->second.push_back(rank);
      }
    }
    if (absent.empty() && by_call.size() <= 1) continue;
    return head + parting(g, seq, by_call, absent) + missing_text;
  }
  if (last == 0) return head + "no collective recorded." + missing_text;
  return head + agreement(g, first, last) + missing_text;
}

}  // namespace

std::string analyze_flight_records(const std::string& dir) {
  std::map<std::string, Group> groups;
  int files = 0;
  for (const std::string& name : detail::list_directory(dir)) {
    if (name.rfind("flight-recorder-rank-", 0) != 0 || name.size() < 5 || name.substr(name.size() - 5) != ".json") {
      continue;
    }
    std::ifstream in(dir + "/" + name);
    json dump;
    try {
      dump = json::parse(in);
    } catch (const json::exception& e) {
      throw InvalidArgumentError(str_cat(dir, "/", name, ": not a flight recorder dump (", e.what(), ")."));
    }
    DATAPAR_CHECK(dump.is_object() && dump.value("format", "") == "datapar.flight_recorder/1" &&
                      dump.contains("groups") && dump["groups"].is_array(),
                  dir, "/", name, ": not a flight recorder dump (no datapar.flight_recorder/1 format).");
    ++files;
    try {
      for (const json& g : dump["groups"]) {
        Group& group = groups[g.at("name").get<std::string>()];
        group.size = g.at("size").get<int>();
        group.backend = g.at("backend").get<std::string>();
        RankRecords& r = group.ranks[g.at("rank").get<int>()];
        r.dumped_ns = dump.at("dumped_ns").get<int64_t>();
        r.reason = dump.at("reason").get<std::string>();
        r.entries.clear();
        for (const json& e : g.at("entries")) {
          Entry entry;
          entry.seq = e.at("seq").get<int64_t>();
          entry.op = e.at("op").get<std::string>();
          entry.tensors = e.at("tensors").get<std::string>();
          entry.state = e.at("state").get<std::string>();
          entry.issued_ns = e.at("issued_ns").get<int64_t>();
          entry.started_ns = e.value("started_ns", int64_t(0));
          entry.ended_ns = e.value("ended_ns", int64_t(0));
          entry.site = e.value("site", "");
          entry.error = e.value("error", "");
          r.entries.push_back(std::move(entry));
        }
        std::sort(r.entries.begin(), r.entries.end(), [](const Entry& a, const Entry& b) { return a.seq < b.seq; });
      }
    } catch (const json::exception& e) {
      throw InvalidArgumentError(str_cat(dir, "/", name, ": a damaged flight recorder dump (", e.what(), ")."));
    }
  }
  DATAPAR_CHECK(files > 0, dir, ": no flight recorder dump (flight-recorder-rank-*.json) here. Run the job with ",
                "DATAPAR_FLIGHT_RECORDER=N and DATAPAR_FLIGHT_RECORDER_DIR=", dir, ".");
  std::string out;
  for (const auto& [name, group] : groups) out += (out.empty() ? "" : " ") + analyze_group(name, group);
  return out;
}

}  // namespace datapar
