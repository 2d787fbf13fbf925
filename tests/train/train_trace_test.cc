// `datapar train --trace`: two ranks under the launcher write one timeline, every rank's
// steps in it, and it shows what DDP is for: gradient buckets all-reduced while backward
// still computes (ResNet-18: three buckets, the first ready long before backward ends).
// scripts/trace_to_html.py draws it.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "testing/processes.h"
#include "testing/python.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace {

using datapar::testing::count;
using datapar::testing::read_text;
using nlohmann::json;

const std::string kBin = std::string(DATAPAR_BIN_DIR) + "/datapar";

struct Step {
  std::map<std::string, json> spans;  // forward, backward, optimizer step, wait for buckets
  std::vector<json> buckets;          // their all-reduces
};

TEST(TrainTrace, TwoRanksInOneFileWithBucketsOverlappingBackward) {
  const datapar::testing::TempDir temp("train_trace");
  const std::string path = temp.path() + "/run.json";
  const auto results = datapar::testing::run_processes(
      {{kBin, "launch", "--nproc-per-node", "2", "--", kBin, "train", "--mode", "ddp", "--model", "resnet18", "--data",
        "synthetic", "--epochs", "1", "--limit", "64", "--batch-size", "32", "--workers", "1", "--trace", path}},
      temp.path(), std::chrono::seconds(240));
  ASSERT_EQ(results.at(0).exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].output.find("trace: " + path), std::string::npos) << results[0].output;

  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  const json doc = json::parse(in);
  std::map<int, std::map<int64_t, Step>> ranks;  // rank -> step -> what happened
  std::set<std::string> processes;
  int events_of_steps_0_and_1 = 0;
  for (const json& e : doc.at("traceEvents")) {
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
      continue;
    }
    const int rank = e.at("pid");
    ASSERT_EQ(e.at("args").at("rank"), rank) << e.dump();  // rank and step in every event
    const int64_t step = e.at("args").at("step");
    const std::string name = e.at("name");
    if (step == 0 || step == 1) ++events_of_steps_0_and_1;
    if (step < 0) continue;
    Step& s = ranks[rank][step];
    if (e["ph"] == "X" && e["cat"] == "bucket") {
      s.buckets.push_back(e);
    } else if (e["ph"] == "X") {
      s.spans[name] = e;
    }
  }
  EXPECT_EQ(processes, (std::set<std::string>{"rank 0", "rank 1"}));
  ASSERT_EQ(ranks.size(), 2u);

  // 64 samples, 16 per rank and step: steps 0 and 1 on each rank. (Step 2 has the last
  // data wait, which found the epoch over, and the evaluation.)
  for (const auto& [rank, steps] : ranks) {
    ASSERT_EQ(steps.size(), 3u) << "rank " << rank;
    EXPECT_TRUE(steps.at(2).spans.count("evaluate"));
    EXPECT_FALSE(steps.at(2).spans.count("forward"));
    int overlapping = 0;
    for (const auto& [step, s] : steps) {
      if (step == 2) continue;
      for (const char* name : {"data wait", "forward", "backward", "optimizer step", "wait for buckets"}) {
        ASSERT_TRUE(s.spans.count(name)) << name << " missing on rank " << rank << ", step " << step;
      }
      const json& backward = s.spans.at("backward");
      const double backward_start = backward["ts"], backward_end = backward_start + backward["dur"].get<double>();
      // Backward computes until DDP starts waiting for its buckets.
      const double computed_until = s.spans.at("wait for buckets")["ts"];
      EXPECT_GE(s.spans.at("optimizer step")["ts"].get<double>(), backward_end - 1.0);
      ASSERT_EQ(s.buckets.size(), 3u) << "rank " << rank << ", step " << step;
      std::set<int64_t> seen;
      for (const json& b : s.buckets) {
        seen.insert(b["args"]["bucket"].get<int64_t>());
        const double queued = b["args"]["queued_ts"], started = b["ts"];
        EXPECT_LE(backward_start, queued);
        EXPECT_LE(queued, started);
        EXPECT_LE(started + b["dur"].get<double>(), backward_end + 1.0);
        if (started < computed_until) ++overlapping;
      }
      EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2}));
    }
    // Bucket 0 (and 1) start while backward computes the rest of the network, every step.
    EXPECT_GE(overlapping, 2 * 2) << "rank " << rank;
  }

  // The page docs/training.md shows how to make: a row per thread of each rank, and each event of
  // the steps asked for drawn once (a bar, or a tick for an instant), its step in its tooltip.
  const std::string script = std::string(DATAPAR_SOURCE_DIR) + "/scripts/trace_to_html.py";
  const std::string page = temp.path() + "/run.html", log = temp.path() + "/trace_to_html.log";
  ASSERT_EQ(datapar::testing::run_python_file(script, "'" + path + "' --steps 0 1 -o '" + page + "' > '" + log +
                                                          "' 2>&1"),
            0)
      << read_text(log);
  const std::string html = read_text(page);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* row : {">rank 0: ", ">rank 1: "}) EXPECT_NE(html.find(row), std::string::npos) << row;
  EXPECT_EQ(count(html, "<g><title>"), events_of_steps_0_and_1);
  EXPECT_GT(count(html, "<title>backward (step 1): "), 0);
  EXPECT_EQ(count(html, "(step 2)"), 0) << "step 2 was not asked for";

  // Steps the trace does not have: an error that says so, and no page.
  const std::string none = temp.path() + "/none.html";
  EXPECT_NE(datapar::testing::run_python_file(script, "'" + path + "' --steps 7 9 -o '" + none + "' > '" + log +
                                                          "' 2>&1"),
            0);
  EXPECT_NE(read_text(log).find("trace_to_html: no events to draw in steps 7-9"), std::string::npos) << read_text(log);
  EXPECT_FALSE(std::ifstream(none).good());
}

}  // namespace
