// The timeline (trace.h): off costs nothing and records nothing; on, spans carry their step
// and thread, collectives carry their DDP bucket and the moments they were queued, started
// and finished; the document is what Perfetto and chrome://tracing read.
#include "datapar/trace.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/error.h"
#include "datapar/process_group/gloo.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/tcp_store.h"
#include "process_group/ordered_runner.h"
#include "testing/expect_throw.h"
#include "testing/ports.h"
#include "testing/temp_dir.h"
#include "trace/recorder.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::vector<json> named(const json& doc, const std::string& name) {
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["name"] == name) out.push_back(e);
  }
  return out;
}

// Row index -> name, from the thread_name metadata.
std::map<int64_t, std::string> rows(const json& doc) {
  std::map<int64_t, std::string> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") out[e["tid"]] = e["args"]["name"];
  }
  return out;
}

TEST(Trace, OffRecordsNothingAndSavingSaysHowToStart) {
  ASSERT_FALSE(trace::enabled());
  { const trace::Span span("forward", "step"); }
  EXPECT_THROW_MSG(trace::stop_to_json(), InvalidArgumentError, "call datapar::trace::start() first");
  const testing::TempDir temp("trace_off");
  EXPECT_THROW_MSG(trace::save(temp.path() + "/t.json"), InvalidArgumentError, "no trace is being recorded");
  EXPECT_FALSE(std::ifstream(temp.path() + "/t.json").good());
}

TEST(Trace, SpansNestAndCarryTheirStepAndThread) {
  trace::start();
  EXPECT_THROW_MSG(trace::start(), InvalidArgumentError, "being recorded already");
  trace::name_thread("main");
  trace::set_step(7);
  {
    const trace::Span outer("backward", "step");
    const trace::Span inner("wait for buckets", "ddp");
    std::this_thread::sleep_for(2ms);
  }
  std::thread([] {
    trace::name_thread("helper");
    trace::set_step(8);
    const trace::Span span("loading", "data");
  }).join();
  const json doc = json::parse(trace::stop_to_json(3));
  EXPECT_FALSE(trace::enabled());
  EXPECT_EQ(doc["displayTimeUnit"], "ms");

  const auto outer = named(doc, "backward"), inner = named(doc, "wait for buckets"), other = named(doc, "loading");
  ASSERT_EQ(outer.size(), 1u);
  ASSERT_EQ(inner.size(), 1u);
  ASSERT_EQ(other.size(), 1u);
  for (const json& e : {outer[0], inner[0], other[0]}) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_EQ(e["pid"], 3);
    EXPECT_EQ(e["args"]["rank"], 3);
  }
  EXPECT_EQ(outer[0]["args"]["step"], 7);
  EXPECT_EQ(other[0]["args"]["step"], 8);
  EXPECT_EQ(outer[0]["cat"], "step");
  EXPECT_EQ(inner[0]["cat"], "ddp");
  // Nested: inner within outer, on the same row; at least the 2 ms slept.
  const double o_start = outer[0]["ts"], o_end = o_start + outer[0]["dur"].get<double>();
  const double i_start = inner[0]["ts"], i_end = i_start + inner[0]["dur"].get<double>();
  EXPECT_LE(o_start, i_start);
  EXPECT_LE(i_end, o_end);
  EXPECT_GE(inner[0]["dur"].get<double>(), 2000.0);
  EXPECT_EQ(outer[0]["tid"], inner[0]["tid"]);
  const auto names = rows(doc);
  EXPECT_EQ(names.at(outer[0]["tid"]), "main");
  EXPECT_EQ(names.at(other[0]["tid"]), "helper");

  // A new recording starts empty.
  trace::start();
  const json again = json::parse(trace::stop_to_json());
  EXPECT_TRUE(named(again, "backward").empty());
}

TEST(Trace, ARunnersCollectiveCarriesItsBucketAndItsThreeMoments) {
  detail::OrderedRunner runner("test collectives");
  trace::start();
  trace::name_thread("main");
  trace::set_step(2);
  std::shared_ptr<Work> work;
  {
    const trace::detail::CollectiveLabel label("bucket", 4, 1024);
    work = runner.push("all_reduce(sum) on rank 0 of 1 (test)", [] { std::this_thread::sleep_for(3ms); });
  }
  work->wait(10s);
  runner.push("barrier", [] {})->wait(10s);  // unlabelled, after the label's scope
  const json doc = json::parse(trace::stop_to_json());

  const auto ran = named(doc, "all_reduce(sum) bucket 4"), queued = named(doc, "queue bucket 4");
  ASSERT_EQ(ran.size(), 1u) << doc.dump();
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(ran[0]["cat"], "bucket");
  EXPECT_EQ(ran[0]["args"]["bucket"], 4);
  EXPECT_EQ(ran[0]["args"]["bytes"], 1024);
  EXPECT_EQ(ran[0]["args"]["step"], 2);
  EXPECT_GE(ran[0]["dur"].get<double>(), 3000.0);
  EXPECT_LE(ran[0]["args"]["queued_ts"].get<double>(), ran[0]["ts"].get<double>());
  EXPECT_EQ(queued[0]["ph"], "i");
  EXPECT_EQ(queued[0]["ts"], ran[0]["args"]["queued_ts"]);
  const auto names = rows(doc);
  EXPECT_EQ(names.at(ran[0]["tid"]), "test collectives");
  EXPECT_EQ(names.at(queued[0]["tid"]), "main");
  const auto plain = named(doc, "barrier");
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0]["cat"], "collective");
  EXPECT_FALSE(plain[0]["args"].contains("bucket"));
}

// DDP over a one-rank Gloo group: every bucket's all-reduce is in the timeline, named for
// its bucket, queued during backward, and the wait for them closes backward.
TEST(Trace, DdpLabelsEveryBucketsAllReduce) {
  testing::ThreadJobStore job(30s);
  auto group = new_gloo_process_group(job.join(0), 0, 1, {"127.0.0.1", 30s});
  torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::Linear(256, 256), torch::nn::Linear(256, 10));
  DdpOptions options;
  options.first_bucket_cap_mb = 0.01;  // one bucket per layer or so
  options.bucket_cap_mb = 0.2;
  DistributedDataParallel<torch::nn::SequentialImpl> ddp(model.ptr(), group, options);
  const size_t buckets = ddp.bucket_indices().size();
  ASSERT_GE(buckets, 2u);

  trace::start();
  trace::set_step(0);
  at::Tensor loss;
  {
    const trace::Span span("backward", "step");
    ddp.forward(at::randn({32, 64})).sum().backward();
  }
  const json doc = json::parse(trace::stop_to_json());
  const auto backward = named(doc, "backward"), waiting = named(doc, "wait for buckets");
  ASSERT_EQ(backward.size(), 1u);
  ASSERT_EQ(waiting.size(), 1u);
  const double wait_end = waiting[0]["ts"].get<double>() + waiting[0]["dur"].get<double>();
  for (size_t b = 0; b < buckets; ++b) {
    const auto ran = named(doc, "all_reduce(sum) bucket " + std::to_string(b));
    ASSERT_EQ(ran.size(), 1u) << "bucket " << b << " in " << doc.dump();
    const double queued = ran[0]["args"]["queued_ts"], started = ran[0]["ts"];
    const double finished = started + ran[0]["dur"].get<double>();
    EXPECT_LE(backward[0]["ts"].get<double>(), queued);
    EXPECT_LE(queued, started);
    EXPECT_LE(finished, wait_end + 1.0);  // µs rounding
  }
}

TEST(Trace, SaveOutsideAJobWritesTheDocument) {
  const testing::TempDir temp("trace_save");
  trace::start();
  { const trace::Span span("optimizer step", "step"); }
  const std::string path = temp.path() + "/run.json";
  trace::save(path);
  std::ifstream in(path);
  const json doc = json::parse(in);
  EXPECT_EQ(named(doc, "optimizer step").size(), 1u);
  EXPECT_EQ(named(doc, "process_name").at(0)["args"]["name"], "rank 0");
  EXPECT_THROW_MSG(trace::save(path), InvalidArgumentError, "no trace is being recorded");
}

// A job that is not the default group's merges through the store it gives (here a job of
// one); the keys it used are gone afterwards.
TEST(Trace, SaveThroughAStoreTheCallerGives) {
  const testing::TempDir temp("trace_save");
  TcpStore store(TcpStoreOptions{"127.0.0.1", 0, /*is_server=*/true, "trace-test", std::chrono::seconds(10), ""});
  trace::start();
  { const trace::Span span("optimizer step", "step"); }
  const std::string path = temp.path() + "/run.json";
  EXPECT_THROW_MSG(trace::save(path, store, 2, 2), InvalidArgumentError, "rank 2 of 2 is not a rank of the job");
  EXPECT_TRUE(trace::enabled()) << "a refused call stops nothing";
  trace::save(path, store, 0, 1);
  std::ifstream in(path);
  EXPECT_EQ(named(json::parse(in), "optimizer step").size(), 1u);
  EXPECT_FALSE(store.check({"datapar/trace/origin"}));
}

TEST(Trace, SaveIntoAMissingDirectoryIsACheckpointErrorAndStopsRecording) {
  trace::start();
  EXPECT_THROW(trace::save("/nonexistent/dir/t.json"), CheckpointError);
  EXPECT_FALSE(trace::enabled());
}

}  // namespace
}  // namespace datapar
