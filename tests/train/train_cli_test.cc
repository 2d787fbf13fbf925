// `datapar train` end to end: each mode trains a short epoch and reports it (line, JSON
// metrics, PNG); ddp's test accuracy is exact over ranks; resuming equals an uninterrupted
// run; bad options fail before any work with exit code 2. ddp jobs are started here the way
// a launcher would: two processes with torchrun's variables.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/version.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <map>
#include <algorithm>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "datapar/dcp/checkpoint.h"
#include "datapar/state_dict.h"
#include "datapar/train/checkpoint.h"
#include "datapar/train/metrics.h"
#include "datapar/train/plot.h"
#include "testing/idx.h"
#include "testing/ports.h"
#include "testing/processes.h"
#include "testing/temp_dir.h"
#include "testing/text.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)

namespace {

using datapar::testing::read_text;
using datapar::testing::TempDir;

struct CliRun {
  int code = -1;
  std::string output;
};

const std::string kCli = std::string(DATAPAR_BIN_DIR) + "/datapar";
// Small and fast: an MLP on 512 synthetic samples (and 512 test samples).
const std::string kSmall = " train --model mlp --data synthetic --limit 512 --batch-size 64 --lr 0.1 --workers 1";

// `datapar ARGS`, with the environment variables `env` ("NAME=value ...") set for it alone.
CliRun cli(const std::string& args, const std::string& env = "") {
  const datapar::testing::ProcessResult r =
      datapar::testing::run_shell((env.empty() ? "" : "env " + env + " ") + kCli + " " + args);
  return {r.exit_code, r.output};
}

std::vector<std::string> split(const std::string& args) {
  std::vector<std::string> out;
  std::istringstream in(args);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A ddp job of `world` local ranks, each `datapar <args>` with torchrun's variables.
// MASTER_PORT must be known before rank 0 binds it, as under torchrun: a ReservedPort.
std::vector<datapar::testing::ProcessResult> ddp_job(const std::string& args, int world, const std::string& dir,
                                                    const std::vector<std::string>& per_rank_args = {}) {
  const datapar::ReservedPort reserved;
  const std::string port = std::to_string(reserved.port());
  std::vector<std::vector<std::string>> commands;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> c = {"/usr/bin/env", "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                                  "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                  "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, kCli};
    for (const std::string& a : split(args)) c.push_back(a);
    if (r < static_cast<int>(per_rank_args.size())) {
      for (const std::string& a : split(per_rank_args[r])) c.push_back(a);
    }
    commands.push_back(c);
  }
  datapar::detail::make_directories(dir);
  return datapar::testing::run_processes(commands, dir, std::chrono::seconds(120));
}

const std::regex kEpochLine(
    R"(epoch 1/1  loss \d+\.\d{3}  train acc \d\.\d{3}  test acc \d\.\d{3}  \d+\.\d s  \d+ samples/s  devices )");

void expect_metrics_file(const std::string& path, const std::string& mode, int64_t test_samples) {
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << path;
  const nlohmann::json j = nlohmann::json::parse(line);
  for (const char* key : {"epoch", "epochs", "train_loss", "train_accuracy", "test_accuracy", "test_correct",
                          "test_samples", "train_samples", "seconds", "samples_per_second", "eval_seconds",
                          "data_wait_seconds", "data_wait_share", "model", "mode", "devices", "world_size",
                          "batch_size", "lr"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
  }
  EXPECT_EQ(j["mode"], mode);
  EXPECT_EQ(j["test_samples"], test_samples);
  EXPECT_GT(j["samples_per_second"].get<double>(), 0);
  EXPECT_FALSE(std::getline(in, line)) << "one line per epoch";
}

void expect_png(const std::string& path) {
  if (datapar::train::find_gnuplot().empty()) {
    std::printf("[ SKIPPED  ] plot check: gnuplot is not installed\n");
    return;
  }
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << path;
}

std::string report_flags(const std::string& dir) {
  const bool plot = !datapar::train::find_gnuplot().empty();
  return " --metrics " + dir + "/m.jsonl" + (plot ? " --plot " + dir + "/p.png" : "");
}

TEST(TrainCli, SingleModeTrainsAnEpochAndReports) {
  const TempDir temp("train_cli_single");
  const std::string& dir = temp.path();
  const CliRun r = cli(kSmall + " --epochs 1 --mode single" + report_flags(dir));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, kEpochLine)) << r.output;
  EXPECT_NE(r.output.find("devices cpu:0 (single)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "no progress bar when stdout is a pipe";
  expect_metrics_file(dir + "/m.jsonl", "single", 512);
  expect_png(dir + "/p.png");
}

TEST(TrainCli, DataParallelModeSplitsOverTwoCpuDevices) {
  const TempDir temp("train_cli_dp");
  const std::string& dir = temp.path();
  const CliRun r = cli(kSmall + " --model lenet --epochs 1 --mode dp --devices cpu:0,cpu:1 --scale-lr" + report_flags(dir));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, kEpochLine)) << r.output;
  EXPECT_NE(r.output.find("devices cpu:0,cpu:1 (dp)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("batch 128 (64 per device), lr 0.2"), std::string::npos) << r.output;  // --scale-lr
  expect_metrics_file(dir + "/m.jsonl", "dp", 512);
  expect_png(dir + "/p.png");
}

// --replicas copy takes the path of several GPUs (a copy of the parameters per extra
// device, refreshed every forward); it must train exactly as shared replicas do.
TEST(TrainCli, CopyReplicasTrainLikeSharedOnes) {
  std::map<std::string, nlohmann::json> metrics;
  for (const std::string kind : {"shared", "copy"}) {
    const TempDir temp("train_cli_dp_" + kind);
    const std::string& dir = temp.path();
    const CliRun r = cli(kSmall + " --epochs 2 --mode dp --devices cpu:0,cpu:1,cpu:2 --replicas " + kind +
                         " --metrics " + dir + "/m.jsonl");
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(dir + "/m.jsonl");
    std::string line;
    while (std::getline(in, line)) metrics[kind] = nlohmann::json::parse(line);  // the last epoch's
  }
  for (const char* key : {"train_loss", "train_accuracy", "test_accuracy"}) {
    EXPECT_NEAR(metrics["copy"][key].get<double>(), metrics["shared"][key].get<double>(), 1e-6) << key;
  }
}

TEST(TrainCli, DdpBackendMustFitTheDevice) {
  const TempDir temp("train_cli_ddp_backend");
  const std::string& dir = temp.path();
  for (const auto& p : ddp_job(kSmall + " --epochs 1 --mode ddp --backend nccl", 2, dir)) {
    EXPECT_EQ(p.exit_code, 2) << p.output;
    EXPECT_NE(p.output.find("--backend nccl: this rank trains on cpu:"), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("nccl moves CUDA tensors only"), std::string::npos) << p.output;
  }
}

TEST(TrainCli, DdpModeRunsAsTwoRanksAndOnlyRankZeroReports) {
  const TempDir temp("train_cli_ddp");
  const std::string& dir = temp.path();
  const auto results = ddp_job(kSmall + " --epochs 1 --mode ddp", 2, dir,
                               {report_flags(dir), " --metrics " + dir + "/rank1.jsonl --plot " + dir + "/rank1.png"});
  for (const auto& p : results) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(std::regex_search(results[0].output, kEpochLine)) << results[0].output;
  EXPECT_NE(results[0].output.find("devices cpu:0,cpu:1 (ddp, 2 ranks)"), std::string::npos) << results[0].output;
  EXPECT_EQ(results[1].output.find("epoch 1/1"), std::string::npos) << results[1].output;
  expect_metrics_file(dir + "/m.jsonl", "ddp", 512);
  expect_png(dir + "/p.png");
  EXPECT_FALSE(datapar::detail::exists(dir + "/rank1.jsonl"));
  EXPECT_FALSE(datapar::detail::exists(dir + "/rank1.png"));
}

// "test acc 0.7830 (783/999)" from an --evaluate run.
std::string test_accuracy(const std::string& output) {
  std::smatch m;
  const std::regex re(R"(test acc \d\.\d{4} \((\d+/\d+)\))");
  return std::regex_search(output, m, re) ? m[1].str() : "none in: " + output;
}

TEST(TrainCli, DdpTestAccuracyIsExactOverRanks) {
  // 999 test samples do not split over 2 ranks: the sampler pads one, which must not count.
  const TempDir temp("train_cli_exact");
  const std::string& dir = temp.path();
  const std::string args =
      " train --model mlp --data synthetic --limit 999 --batch-size 64 --workers 1 --checkpoint-dir " + dir;
  ASSERT_EQ(cli(args + " --epochs 1").code, 0);
  const CliRun single = cli(args + " --evaluate");
  ASSERT_EQ(single.code, 0) << single.output;
  const std::string expected = test_accuracy(single.output);
  EXPECT_TRUE(std::regex_match(expected, std::regex(R"(\d+/999)"))) << expected;
  const auto ddp = ddp_job(args + " --evaluate --mode ddp", 2, dir + "/logs");
  for (const auto& p : ddp) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(test_accuracy(ddp[0].output), expected);
  const CliRun dp = cli(args + " --evaluate --mode dp --devices cpu:0,cpu:1");
  EXPECT_EQ(test_accuracy(dp.output), expected);
}

// The parameters of two checkpoints agree within 1e-6.
void expect_same_parameters(const std::string& a, const std::string& b) {
  const auto ca = datapar::train::load_checkpoint(a), cb = datapar::train::load_checkpoint(b);
  ASSERT_EQ(ca.model.size(), cb.model.size());
  for (const auto& item : ca.model) {
    const at::Tensor* other = cb.model.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::allclose(item.value(), *other, 0, 1e-6)) << item.key();
  }
  EXPECT_EQ(ca.epoch, cb.epoch);
}

// Every parameter's optimizer state in two checkpoints (SGD's momentum, Adam's moments and
// step), equal within `tolerance` (0: bit for bit).
void expect_same_optimizer_state(const std::string& a, const std::string& b, double tolerance) {
  const auto want = datapar::train::load_checkpoint(a).optimizer.at("state").toGenericDict();
  const auto got = datapar::train::load_checkpoint(b).optimizer.at("state").toGenericDict();
  ASSERT_EQ(got.size(), want.size()) << b;
  for (const auto& entry : want) {
    const auto w = entry.value().toGenericDict(), g = got.at(entry.key()).toGenericDict();
    ASSERT_EQ(g.size(), w.size()) << b << ", parameter " << entry.key();
    for (const auto& field : w) {
      const c10::IValue& other = g.at(field.key());
      const auto tensor = [](const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::scalar_tensor(v.toDouble()); };
      const at::Tensor x = tensor(field.value()), y = tensor(other);
      EXPECT_TRUE(tolerance == 0 ? at::equal(x.to(at::kDouble), y.to(at::kDouble))
                                 : at::allclose(x.to(at::kDouble), y.to(at::kDouble), 0, tolerance))
          << b << ", " << field.key().toStringRef() << " of parameter " << entry.key();
    }
  }
}

TEST(TrainCli, ResumeEqualsAnUninterruptedRunSingle) {
  const TempDir straight_temp("train_cli_resume_straight"), resumed_temp("train_cli_resume_resumed");
  const std::string& straight = straight_temp.path();
  const std::string& resumed = resumed_temp.path();
  const std::string args = kSmall + " --model lenet --seed 3 --checkpoint-dir ";
  ASSERT_EQ(cli(args + straight + " --epochs 4").code, 0);
  // The resumed run writes its checkpoints in the background (--checkpoint-async): the same files.
  ASSERT_EQ(cli(args + resumed + " --epochs 2 --checkpoint-async --metrics " + resumed + "/m.jsonl").code, 0);
  const CliRun r = cli(args + resumed + " --epochs 4 --resume --checkpoint-async --metrics " + resumed + "/m.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(2 epochs done)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("epoch 2/4"), std::string::npos) << "resumed runs skip done epochs: " << r.output;
  EXPECT_NE(r.output.find("epoch 3/4"), std::string::npos) << r.output;
  expect_same_parameters(straight + "/checkpoint-epoch-4.pt", resumed + "/checkpoint-epoch-4.pt");
  std::ifstream in(resumed + "/m.jsonl");  // the metrics file covers the whole run
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 4);
}

TEST(TrainCli, ResumeEqualsAnUninterruptedRunDdp) {
  const TempDir straight_temp("train_cli_ddp_resume_straight"), resumed_temp("train_cli_ddp_resume_resumed");
  const std::string& straight = straight_temp.path();
  const std::string& resumed = resumed_temp.path();
  const std::string args = kSmall + " --mode ddp --seed 5 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + straight + " --epochs 4", 2, straight + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  for (const auto& p : ddp_job(args + resumed + " --epochs 2", 2, resumed + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  // A restarted job (DATAPAR_RESTART_COUNT > 0) resumes without --resume.
  ::setenv("DATAPAR_RESTART_COUNT", "1", 1);
  const auto results = ddp_job(args + resumed + " --epochs 4", 2, resumed + "/logs2");
  ::unsetenv("DATAPAR_RESTART_COUNT");
  for (const auto& p : results) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(results[0].output.find("(2 epochs done)"), std::string::npos) << results[0].output;
  expect_same_parameters(straight + "/checkpoint-epoch-4.pt", resumed + "/checkpoint-epoch-4.pt");
}

// --checkpoint-async: a write that fails in the background stops the run at the next step,
// or at the end for the last checkpoint, with exit code 1 and the reason; never silently.
TEST(TrainCli, ABackgroundCheckpointThatFailsIsReportedAtTheNextStepOrAtTheEnd) {
  const TempDir temp("train_cli_async_failure");
  const std::string dir = temp.path();
  // A directory where the file must go: the rename that puts it in place fails.
  datapar::detail::make_directories(dir + "/checkpoint-epoch-1.pt/in-the-way");
  const std::string args = kSmall + " --checkpoint-async --checkpoint-dir " + dir;
  const CliRun next_step = cli(args + " --epochs 3");
  EXPECT_EQ(next_step.code, 1) << next_step.output;
  EXPECT_NE(next_step.output.find("the checkpoint " + dir + "/checkpoint-epoch-1.pt was not written (it was being "
                                  "written in the background)"), std::string::npos) << next_step.output;
  EXPECT_NE(next_step.output.find("(Is a directory)"), std::string::npos) << next_step.output;
  EXPECT_EQ(next_step.output.find("epoch 2/3"), std::string::npos) << "reported at epoch 2's first step: "
                                                                      << next_step.output;
  const CliRun at_end = cli(args + " --epochs 1");
  EXPECT_EQ(at_end.code, 1) << at_end.output;
  EXPECT_NE(at_end.output.find("epoch 1/1"), std::string::npos) << at_end.output;
  EXPECT_NE(at_end.output.find("checkpoint-epoch-1.pt was not written"), std::string::npos) << at_end.output;
}

// `datapar analyze DIR` on two ranks' flight recorder dumps (the format flight_recorder.cc
// writes) that part at collective #2; and on a directory without dumps, exit code 2.
TEST(TrainCli, DataparAnalyzeSaysWhereTheRanksOfADumpedJobPart) {
  const TempDir temp("train_cli_analyze");
  const auto dump = [&](int rank, const std::string& second) {
    std::ofstream(temp.path() + "/flight-recorder-rank-" + std::to_string(rank) + ".json")
        << R"J({"format":"datapar.flight_recorder/1","rank":")J" << rank
        << R"J(","pid":1,"reason":"SIGUSR1","dumped_ns":5000000000,"groups":[{"name":"default","backend":"gloo",)J"
        << R"J("rank":)J" << rank << R"J(,"size":2,"capacity":2000,"entries":[)J"
        << R"J({"seq":1,"op":"all_reduce(sum)","tensors":"float32[8]","issued_ns":1000000000,"state":"completed",)J"
        << R"J("ended_ns":1100000000},{"seq":2,"op":")J" << second
        << R"J(","tensors":"float32[8]","issued_ns":1200000000,"state":"pending"}]}]})J";
  };
  dump(0, "all_reduce(sum)");
  dump(1, "all_gather");
  const CliRun said = cli("analyze " + temp.path());
  EXPECT_EQ(said.code, 0) << said.output;
  EXPECT_NE(said.output.find("Group \"default\" (gloo, 2 ranks): the ranks part at collective #2. They called "
                             "different collectives there: rank 0 called all_reduce(sum) on float32[8]; rank 1 called "
                             "all_gather on float32[8]."),
            std::string::npos) << said.output;
  const TempDir empty("train_cli_analyze_empty");
  const CliRun nothing = cli("analyze " + empty.path());
  EXPECT_EQ(nothing.code, 2) << nothing.output;
  EXPECT_NE(nothing.output.find("no flight recorder dump (flight-recorder-rank-*.json) here"), std::string::npos)
      << nothing.output;
}

// Issue 49: a rank slowed to 1.5x (a sleep per step, --slow-step) is named by the epoch line,
// the metrics file and the trace; in the same job without it, none is. An epoch is 12 steps (the 6000
// synthetic samples, batch 512).
TEST(TrainCli, ARankSlowedToOneAndAHalfTimesIsNamedAndNoneWithout) {
  const TempDir temp("train_cli_stragglers");
  const std::string args = " train --mode ddp --model lenet --data synthetic --limit 10240 --batch-size 512 "
                           "--lr 0.1 --workers 1 --epochs 1 --metrics ";
  const auto even = ddp_job(args + temp.path() + "/even.jsonl", 2, temp.path() + "/even");
  for (const auto& p : even) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(even[0].output.find("straggler"), std::string::npos) << even[0].output;
  const datapar::train::EpochMetrics m = datapar::train::from_json(
      datapar::testing::read_text(temp.path() + "/even.jsonl"));
  ASSERT_EQ(m.straggler_scores.size(), 2u);
  EXPECT_EQ(m.straggler, -1);
  // Half a step more on rank 1: its work per step 1.5x the other's.
  const double steps = static_cast<double>((m.train_samples + 511) / 512);
  const double half_step_ms = m.seconds / steps / 2 * 1e3;
  const auto slowed = ddp_job(args + temp.path() + "/slowed.jsonl --trace " + temp.path() + "/slowed.trace.json", 2,
                              temp.path() + "/slowed", {"", "--slow-step " + std::to_string(half_step_ms)});
  for (const auto& p : slowed) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(slowed[0].output.find("straggler: rank 1 ("), std::string::npos) << slowed[0].output;
  const datapar::train::EpochMetrics n = datapar::train::from_json(
      datapar::testing::read_text(temp.path() + "/slowed.jsonl"));
  EXPECT_EQ(n.straggler, 1);
  // And on the timeline, at the epoch's end, on every rank's row.
  const std::string trace = datapar::testing::read_text(temp.path() + "/slowed.trace.json");
  EXPECT_EQ(datapar::testing::count(trace, "; straggler: rank 1\""), 2) << trace.substr(0, 2000);
}

// Issue 27: ranks with checkpoint directories of their own (node-local) that found
// different checkpoints, or none, must not train on out of step: a restart in which rank
// 1's directory is empty (it would start from epoch 1) or holds an older checkpoint stops
// every rank, naming what each found.
TEST(TrainCli, RanksThatFoundDifferentCheckpointsDoNotResume) {
  const TempDir temp("train_cli_ddp_resume_apart");
  const std::string shared = temp.path() + "/rank0", empty = temp.path() + "/empty", older = temp.path() + "/older";
  const std::string args = kSmall + " --mode ddp --seed 5";
  for (const auto& p : ddp_job(args + " --epochs 2 --checkpoint-dir " + shared, 2, temp.path() + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  datapar::detail::make_directories(empty);
  datapar::detail::make_directories(older);
  ASSERT_EQ(std::system(("cp " + shared + "/checkpoint-epoch-1.pt " + older + "/").c_str()), 0);
  ::setenv("DATAPAR_RESTART_COUNT", "1", 1);  // a launcher's restart: resumes without --resume
  for (const auto& [dir, found] : {std::make_pair(empty, std::string("rank 1: no checkpoint")),
                                   std::make_pair(older, std::string("rank 1: epoch 1, crc "))}) {
    const auto results = ddp_job(args + " --epochs 4", 2, dir + "/logs",
                                 {"--checkpoint-dir " + shared, "--checkpoint-dir " + dir});
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(results[r].exit_code, 0) << results[r].output;
      EXPECT_NE(results[r].output.find("resume: the ranks found different checkpoints"), std::string::npos)
          << results[r].output;
      EXPECT_NE(results[r].output.find("rank 0: epoch 2, crc "), std::string::npos) << results[r].output;
      EXPECT_NE(results[r].output.find(found), std::string::npos) << results[r].output;
      EXPECT_EQ(results[r].output.find("epoch 3/4"), std::string::npos) << "no rank trained:\n" << results[r].output;
    }
  }
  ::unsetenv("DATAPAR_RESTART_COUNT");
  EXPECT_FALSE(datapar::detail::exists(shared + "/checkpoint-epoch-3.pt"));
}

// --zero (ZeRO-1): the same parameters and checkpoints as plain DDP, bit for bit (each
// parameter's update is the same arithmetic, made on its owner); a checkpoint written
// sharded resumes sharded or not, and holds the whole momentum.
TEST(TrainCli, ZeroTrainsLikeDdpAndItsCheckpointsResumeEitherWay) {
  const TempDir temp("train_cli_zero");
  const std::string straight = temp.path() + "/straight", zero = temp.path() + "/zero", mixed = temp.path() + "/mixed";
  const std::string args = kSmall + " --mode ddp --seed 5 --momentum 0.9 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + straight + " --epochs 3", 2, straight + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  const auto first = ddp_job(args + zero + " --epochs 2 --zero", 2, zero + "/logs");
  for (const auto& p : first) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(first[0].output.find("optimizer state sharded (ZeRO-1)"), std::string::npos) << first[0].output;
  datapar::detail::make_directories(mixed);
  {
    std::ifstream from(zero + "/checkpoint-epoch-2.pt", std::ios::binary);
    std::ofstream(mixed + "/checkpoint-epoch-2.pt", std::ios::binary) << from.rdbuf();
  }
  for (const auto& p : ddp_job(args + zero + " --epochs 3 --zero --resume", 2, zero + "/logs2")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const auto& p : ddp_job(args + mixed + " --epochs 3 --resume", 2, mixed + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const std::string& dir : {zero, mixed}) {
    expect_same_parameters(straight + "/checkpoint-epoch-3.pt", dir + "/checkpoint-epoch-3.pt");
    expect_same_optimizer_state(straight + "/checkpoint-epoch-3.pt", dir + "/checkpoint-epoch-3.pt", 0);
  }
}

// --mode fsdp: the same training as DDP (each rank holding half of everything), with
// checkpoints in plain SGD's layout that resume sharded or under DDP; and the fsdp-only
// flags are accepted (resharding off, bf16 parameters).
TEST(TrainCli, FsdpTrainsLikeDdpAndItsCheckpointsResumeEitherWay) {
  const TempDir temp("train_cli_fsdp");
  const std::string straight = temp.path() + "/straight", fsdp = temp.path() + "/fsdp", mixed = temp.path() + "/mixed";
  const std::string args = kSmall + " --seed 5 --momentum 0.9 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + straight + " --mode ddp --epochs 3", 2, straight + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const auto first = ddp_job(args + fsdp + " --mode fsdp --epochs 2", 2, fsdp + "/logs");
  for (const auto& p : first) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(first[0].output.find("fsdp on cpu:0,cpu:1, 2 ranks on gloo, resharded after forward"), std::string::npos)
      << first[0].output;
  datapar::detail::make_directories(mixed);
  {
    std::ifstream from(fsdp + "/checkpoint-epoch-2.pt", std::ios::binary);
    std::ofstream(mixed + "/checkpoint-epoch-2.pt", std::ios::binary) << from.rdbuf();
  }
  for (const auto& p : ddp_job(args + fsdp + " --mode fsdp --epochs 3 --resume", 2, fsdp + "/logs2")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const auto& p : ddp_job(args + mixed + " --mode ddp --epochs 3 --resume", 2, mixed + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const std::string& dir : {fsdp, mixed}) {
    expect_same_parameters(straight + "/checkpoint-epoch-3.pt", dir + "/checkpoint-epoch-3.pt");
    expect_same_optimizer_state(straight + "/checkpoint-epoch-3.pt", dir + "/checkpoint-epoch-3.pt", 1e-5);
  }
  const std::string other = temp.path() + "/other";
  const auto flags = ddp_job(kSmall + " --mode fsdp --epochs 1 --no-reshard --mp bf16", 2, other);
  for (const auto& p : flags) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(flags[0].output.find("kept until backward, parameters in bf16"), std::string::npos) << flags[0].output;
  EXPECT_TRUE(std::regex_search(flags[0].output, kEpochLine)) << flags[0].output;
}

// --weight-decay (torch.optim.SGD's weight_decay) reaches every optimizer a mode makes: ddp's
// and fsdp's shards' train alike with it, and it shrinks the weights against a run without.
TEST(TrainCli, WeightDecayShrinksTheWeightsAndTrainsAlikeUnderDdpAndFsdp) {
  const TempDir temp("train_cli_weight_decay");
  const std::string args = kSmall + " --seed 5 --momentum 0.9 --epochs 2 --checkpoint-dir ";
  const std::string plain = temp.path() + "/plain", ddp = temp.path() + "/ddp", fsdp = temp.path() + "/fsdp";
  for (const auto& [dir, flags] : {std::make_pair(plain, std::string(" --mode ddp")),
                                   std::make_pair(ddp, std::string(" --mode ddp --weight-decay 0.05")),
                                   std::make_pair(fsdp, std::string(" --mode fsdp --weight-decay 0.05"))}) {
    for (const auto& p : ddp_job(args + dir + flags, 2, dir + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  expect_same_parameters(ddp + "/checkpoint-epoch-2.pt", fsdp + "/checkpoint-epoch-2.pt");
  const auto norm = [](const std::string& path) {
    double sum = 0;
    for (const auto& item : datapar::train::load_checkpoint(path).model) {
      if (item.key().find("weight") != std::string::npos) sum += item.value().pow(2).sum().item<double>();
    }
    return sum;
  };
  EXPECT_LT(norm(ddp + "/checkpoint-epoch-2.pt"), 0.98 * norm(plain + "/checkpoint-epoch-2.pt"));
}

// The loss of `epoch` in a train run's output ("epoch N/M  loss X ..."), or -1.
double epoch_loss(const std::string& output, int epoch) {
  const std::regex line("epoch " + std::to_string(epoch) + "/\\d+ +loss ([0-9.]+)");
  std::smatch m;
  return std::regex_search(output, m, line) ? std::stod(m[1]) : -1;
}

// --optimizer adamw (torch.optim.AdamW, its default weight decay 0.01): ddp's checkpoint of
// epoch 1 resumes under --zero and under fsdp, whose sharded AdamWs end epoch 2 where ddp's
// whole one does, moments and step included; DiLoCo's inner Adam resumes from its state
// beside the checkpoint as if never stopped.
TEST(TrainCli, AdamWTrainsAlikeWholeAndShardedAndResumesExactly) {
  const TempDir temp("train_cli_adamw");
  const std::string args = kSmall + " --seed 5 --optimizer adamw --lr 0.01 --checkpoint-dir ";
  const std::string straight = temp.path() + "/straight", zero = temp.path() + "/zero", fsdp = temp.path() + "/fsdp";
  const auto run = ddp_job(args + straight + " --mode ddp --epochs 2", 2, straight + "/logs");
  for (const auto& p : run) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(run[0].output.find("lr 0.01 (adamw, weight decay 0.01)"), std::string::npos) << run[0].output;
  EXPECT_LT(epoch_loss(run[0].output, 2), epoch_loss(run[0].output, 1)) << run[0].output;
  for (const auto& [dir, mode] : {std::make_pair(zero, std::string(" --mode ddp --zero")),
                                  std::make_pair(fsdp, std::string(" --mode fsdp"))}) {
    datapar::detail::make_directories(dir);
    std::ifstream from(straight + "/checkpoint-epoch-1.pt", std::ios::binary);
    std::ofstream(dir + "/checkpoint-epoch-1.pt", std::ios::binary) << from.rdbuf();
    for (const auto& p : ddp_job(args + dir + mode + " --epochs 2 --resume", 2, dir + "/logs")) {
      ASSERT_EQ(p.exit_code, 0) << p.output;
    }
    expect_same_parameters(straight + "/checkpoint-epoch-2.pt", dir + "/checkpoint-epoch-2.pt");
    expect_same_optimizer_state(straight + "/checkpoint-epoch-2.pt", dir + "/checkpoint-epoch-2.pt", 1e-6);
  }
  const std::string diloco = " --mode ddp --optimizer adam --sync-every 3 --outer-lr 0.5";
  const std::string whole = temp.path() + "/diloco", resumed = temp.path() + "/diloco_resumed";
  for (const auto& p : ddp_job(args + whole + diloco + " --epochs 2", 2, whole + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const auto& p : ddp_job(args + resumed + diloco + " --epochs 1", 2, resumed + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const auto again = ddp_job(args + resumed + diloco + " --epochs 2 --resume", 2, resumed + "/logs2");
  for (const auto& p : again) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(again[0].output.find("no DiLoCo state"), std::string::npos) << again[0].output;
  expect_same_parameters(whole + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt");
  expect_same_optimizer_state(whole + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt", 0);
}

// The mean test accuracy of epochs 4-6 of a 6-epoch run's output, or -1.
double last_epochs_accuracy(const std::string& output) {
  double sum = 0;
  for (int epoch = 4; epoch <= 6; ++epoch) {
    std::smatch m;
    if (!std::regex_search(output, m, std::regex("epoch " + std::to_string(epoch) + "/6 .*test acc ([0-9.]+)"))) {
      return -1.0;
    }
    sum += std::stod(m[1]);
  }
  return sum / 3;
}

// --amp bf16 (torch.autocast's bfloat16): the MLP on the shipped subset tests within a point of
// float32 (the mean of its last 3 epochs' test accuracy), at other parameters (the forward
// did compute in bfloat16, the parameters stayed float32); under ddp too, where the banner
// says so.
TEST(TrainCli, AutocastToBf16TrainsWithinAPointOfFloat32) {
  const TempDir temp("train_cli_amp");
  const std::string args =
      " train --model mlp --epochs 6 --batch-size 128 --momentum 0.9 --workers 1 --seed 3 --checkpoint-dir ";
  const std::string fp32 = temp.path() + "/fp32", bf16 = temp.path() + "/bf16", ddp = temp.path() + "/ddp";
  const CliRun full = cli(args + fp32);
  ASSERT_EQ(full.code, 0) << full.output;
  const CliRun half = cli(args + bf16 + " --amp bf16");
  ASSERT_EQ(half.code, 0) << half.output;
  EXPECT_GT(last_epochs_accuracy(full.output), 0.78) << full.output;
  EXPECT_NEAR(last_epochs_accuracy(half.output), last_epochs_accuracy(full.output), 0.01) << full.output << half.output;
  const auto a = datapar::train::load_checkpoint(fp32 + "/checkpoint-epoch-6.pt");
  const auto b = datapar::train::load_checkpoint(bf16 + "/checkpoint-epoch-6.pt");
  double most = 0;
  for (const auto& item : a.model) {
    EXPECT_EQ(b.model[item.key()].scalar_type(), at::kFloat) << item.key() << ": parameters stay float32";
    most = std::max(most, (item.value() - b.model[item.key()]).abs().max().item<double>());
  }
  EXPECT_GT(most, 1e-4) << "the same parameters: autocast did not compute in bfloat16";
  const auto run = ddp_job(args + ddp + " --mode ddp --amp bf16 --epochs 2", 2, ddp + "/logs");
  for (const auto& p : run) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(run[0].output.find("autocast to bf16"), std::string::npos) << run[0].output;
  EXPECT_LT(epoch_loss(run[0].output, 2), epoch_loss(run[0].output, 1)) << run[0].output;
}

// --comm-hook (issue 48): ddp's gradients cast to bf16, or compressed by PowerSGD (rank 1,
// from the third step): each run learns (its second epoch's loss below its first's), and
// ends away from plain ddp's parameters (the hook took effect).
TEST(TrainCli, CommHooksCompressDdpsGradientsAndStillLearn) {
  const TempDir temp("train_cli_comm_hook");
  const std::string args = kSmall + " --mode ddp --epochs 2 --seed 5 --momentum 0.9 --checkpoint-dir ";
  const std::string plain = temp.path() + "/plain";
  for (const auto& p : ddp_job(args + plain, 2, plain + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  for (const std::string hook : {"bf16", "powersgd:1:2"}) {
    const std::string dir = temp.path() + "/" + hook.substr(0, 4);
    const auto run = ddp_job(args + dir + " --comm-hook " + hook, 2, dir + "/logs");
    for (const auto& p : run) ASSERT_EQ(p.exit_code, 0) << p.output;
    const double first = epoch_loss(run[0].output, 1), second = epoch_loss(run[0].output, 2);
    EXPECT_GT(first, 0) << run[0].output;
    EXPECT_LT(second, first) << hook << ":\n" << run[0].output;
    const auto a = datapar::train::load_checkpoint(plain + "/checkpoint-epoch-2.pt");
    const auto b = datapar::train::load_checkpoint(dir + "/checkpoint-epoch-2.pt");
    double most = 0;
    for (const auto& item : a.model) most = std::max(most, (item.value() - b.model[item.key()]).abs().max().item<double>());
    EXPECT_GT(most, 1e-6) << hook << ": the parameters are plain ddp's";
  }
}

// --comm-hook powersgd: each rank writes its PowerSGD state beside every checkpoint, and a
// run resumed after epoch 1 ends where 2 epochs straight end; resumed without that state
// (deleted), it ends elsewhere (the errors matter), saying so; a garbage state file is refused.
TEST(TrainCli, PowerSgdResumesExactlyFromItsStateBesideTheCheckpoint) {
  const TempDir temp("train_cli_powersgd_resume");
  const std::string args = kSmall + " --mode ddp --seed 5 --momentum 0.9 --comm-hook powersgd:1:2 --checkpoint-dir ";
  const std::string straight = temp.path() + "/straight", resumed = temp.path() + "/resumed",
                    afresh = temp.path() + "/afresh";
  for (const auto& p : ddp_job(args + straight + " --epochs 2", 2, straight + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const std::string& dir : {resumed, afresh}) {
    for (const auto& p : ddp_job(args + dir + " --epochs 1", 2, dir + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
    EXPECT_TRUE(datapar::detail::exists(dir + "/powersgd-epoch-1-rank-1.pt"));
  }
  for (int r = 0; r < 2; ++r) std::remove((afresh + "/powersgd-epoch-1-rank-" + std::to_string(r) + ".pt").c_str());
  for (const std::string& dir : {resumed, afresh}) {
    const auto run = ddp_job(args + dir + " --epochs 2 --resume", 2, dir + "/logs2");
    for (const auto& p : run) ASSERT_EQ(p.exit_code, 0) << p.output;
    EXPECT_EQ(run[0].output.find("no PowerSGD state") == std::string::npos, dir == resumed) << run[0].output;
  }
  expect_same_parameters(straight + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt");
  const auto a = datapar::train::load_checkpoint(straight + "/checkpoint-epoch-2.pt");
  const auto b = datapar::train::load_checkpoint(afresh + "/checkpoint-epoch-2.pt");
  double most = 0;
  for (const auto& item : a.model) most = std::max(most, (item.value() - b.model[item.key()]).abs().max().item<double>());
  EXPECT_GT(most, 1e-6) << "the errors PowerSGD kept made no difference";
  std::ofstream(resumed + "/powersgd-epoch-2-rank-0.pt") << "not a state";
  const auto bad = ddp_job(args + resumed + " --epochs 3 --resume", 2, resumed + "/logs3");
  EXPECT_NE(bad[0].exit_code, 0) << bad[0].output;
  EXPECT_NE(bad[0].output.find("powersgd-epoch-2-rank-0.pt is not PowerSGD's state"), std::string::npos)
      << bad[0].output;
}

// --sync-every (issue 48): local SGD averaging after every step trains as ddp (the average
// of the steps is the step on the averaged gradient, momentum included); DiLoCo every 3 steps
// learns, and resumed after epoch 1 (each rank's SGD momentum and DiLoCo's state read back)
// ends where 2 epochs straight end; flags that cannot go with it are refused.
TEST(TrainCli, LocalSgdEveryStepIsDdpAndDiLoCoResumesExactly) {
  const TempDir temp("train_cli_diloco");
  const std::string args = kSmall + " --mode ddp --seed 5 --momentum 0.9 --checkpoint-dir ";
  const std::string ddp = temp.path() + "/ddp", local = temp.path() + "/local", straight = temp.path() + "/straight",
                    resumed = temp.path() + "/resumed";
  for (const auto& p : ddp_job(args + ddp + " --epochs 2", 2, ddp + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  for (const auto& p : ddp_job(args + local + " --epochs 2 --sync-every 1 --outer-optimizer replace", 2, local + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  expect_same_parameters(ddp + "/checkpoint-epoch-2.pt", local + "/checkpoint-epoch-2.pt");
  const std::string diloco = " --sync-every 3 --outer-lr 0.5";
  const auto run = ddp_job(args + straight + " --epochs 2" + diloco, 2, straight + "/logs");
  for (const auto& p : run) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_LT(epoch_loss(run[0].output, 2), epoch_loss(run[0].output, 1)) << run[0].output;
  for (const auto& p : ddp_job(args + resumed + " --epochs 1" + diloco, 2, resumed + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  EXPECT_TRUE(datapar::detail::exists(resumed + "/diloco-epoch-1-rank-1.pt"));
  const auto again = ddp_job(args + resumed + " --epochs 2 --resume" + diloco, 2, resumed + "/logs2");
  for (const auto& p : again) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(again[0].output.find("no DiLoCo state"), std::string::npos) << again[0].output;
  expect_same_parameters(straight + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt");
  expect_same_optimizer_state(straight + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt", 0);
  // Streaming DiLoCo: 2 fragments, the pseudo-gradients in int8; it learns too.
  const std::string streaming = temp.path() + "/streaming";
  const auto fragments =
      ddp_job(args + streaming + " --epochs 2" + diloco + " --fragments 2 --outer-dtype int8", 2, streaming + "/logs");
  for (const auto& p : fragments) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_LT(epoch_loss(fragments[0].output, 2), epoch_loss(fragments[0].output, 1)) << fragments[0].output;
}

// --mode hsdp (issue 47): 2 "machines" of 2 ranks (--shard-size 2) train as DDP on 4 ranks,
// and its checkpoints (plain SGD's layout) resume as hsdp, or as fsdp on 2 ranks; a shard
// size that does not divide the job is refused before anything starts.
TEST(TrainCli, HsdpTrainsLikeDdpAndItsCheckpointsResumeAsFsdp) {
  const TempDir temp("train_cli_hsdp");
  const std::string straight = temp.path() + "/straight", hsdp = temp.path() + "/hsdp", fsdp = temp.path() + "/fsdp";
  const std::string args = kSmall + " --seed 5 --momentum 0.9 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + straight + " --mode ddp --epochs 3", 4, straight + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const auto first = ddp_job(args + hsdp + " --mode hsdp --shard-size 2 --epochs 2", 4, hsdp + "/logs");
  for (const auto& p : first) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(first[0].output.find("hsdp on cpu:0,cpu:1,cpu:2,cpu:3, 4 ranks on gloo, sharded over groups of 2, "
                                 "replicated 2 times"),
            std::string::npos)
      << first[0].output;
  datapar::detail::make_directories(fsdp);
  ASSERT_EQ(std::system(("cp " + hsdp + "/checkpoint-epoch-2.pt " + fsdp + "/").c_str()), 0);
  for (const auto& p : ddp_job(args + hsdp + " --mode hsdp --shard-size 2 --epochs 3 --resume", 4, hsdp + "/logs2")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  expect_same_parameters(straight + "/checkpoint-epoch-3.pt", hsdp + "/checkpoint-epoch-3.pt");
  expect_same_optimizer_state(straight + "/checkpoint-epoch-3.pt", hsdp + "/checkpoint-epoch-3.pt", 1e-5);
  const auto as_fsdp = ddp_job(args + fsdp + " --mode fsdp --epochs 3 --resume", 2, fsdp + "/logs");
  for (const auto& p : as_fsdp) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(as_fsdp[0].output.find("epoch 3/3"), std::string::npos) << as_fsdp[0].output;
  EXPECT_EQ(as_fsdp[0].output.find("epoch 2/3"), std::string::npos) << "resumed after epoch 2:\n" << as_fsdp[0].output;
  for (const auto& p : ddp_job(kSmall + " --mode hsdp --shard-size 3 --epochs 1", 2, temp.path() + "/bad")) {
    EXPECT_EQ(p.exit_code, 2) << p.output;
    EXPECT_NE(p.output.find("--shard-size 3 does not divide the job's 2 ranks into shard groups"), std::string::npos)
        << p.output;
  }
}

// --mode hsdp --sync-every (issue 48): DiLoCo over HSDP, each shard group a replica (FSDP
// within it, its shards averaged across the groups). Averaging after every step with the
// outer step "replace" trains as ddp on 4 ranks; DiLoCo every 3 steps resumed after epoch 1
// (each rank's shards' SGD momentum and DiLoCo state read back) ends where 2 epochs straight
// end.
TEST(TrainCli, LocalSgdOverHsdpEveryStepIsDdpAndDiLoCoOverHsdpResumesExactly) {
  const TempDir temp("train_cli_hsdp_diloco");
  const std::string ddp = temp.path() + "/ddp", local = temp.path() + "/local", straight = temp.path() + "/straight",
                    resumed = temp.path() + "/resumed";
  const std::string args = kSmall + " --seed 5 --momentum 0.9 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + ddp + " --mode ddp --epochs 2", 4, ddp + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const std::string hsdp = " --mode hsdp --shard-size 2";
  for (const auto& p : ddp_job(args + local + hsdp + " --epochs 2 --sync-every 1 --outer-optimizer replace", 4,
                               local + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  expect_same_parameters(ddp + "/checkpoint-epoch-2.pt", local + "/checkpoint-epoch-2.pt");
  const std::string diloco = hsdp + " --sync-every 3 --outer-lr 0.5";
  for (const auto& p : ddp_job(args + straight + " --epochs 2" + diloco, 4, straight + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const auto& p : ddp_job(args + resumed + " --epochs 1" + diloco, 4, resumed + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  EXPECT_TRUE(datapar::detail::exists(resumed + "/diloco-epoch-1-rank-3.pt"));
  const auto again = ddp_job(args + resumed + " --epochs 2 --resume" + diloco, 4, resumed + "/logs2");
  for (const auto& p : again) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(again[0].output.find("no DiLoCo state"), std::string::npos) << again[0].output;
  expect_same_parameters(straight + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt");
  expect_same_optimizer_state(straight + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt", 0);
}

// Issue 46: a newest DCP checkpoint whose .metadata was cut (40 bytes short) is skipped with
// the reason and moved aside, so that the resumed run writes that epoch again (it failed
// with "epoch-2 holds a checkpoint already", and so did every retry).
TEST(TrainCli, ADcpCheckpointThatDoesNotLoadIsMovedAsideWithTheReason) {
  const TempDir temp("train_cli_dcp_cut");
  const std::string dir = temp.path() + "/ck";
  const std::string args = kSmall + " --checkpoint-format dcp --checkpoint-dir " + dir;
  const CliRun first = cli(args + " --epochs 2");
  ASSERT_EQ(first.code, 0) << first.output;
  const std::string metadata = dir + "/epoch-2/.metadata";
  struct stat st {};
  ASSERT_EQ(::stat(metadata.c_str(), &st), 0);
  ASSERT_EQ(::truncate(metadata.c_str(), st.st_size - 40), 0);
  const CliRun resumed = cli(args + " --epochs 2 --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("skipping a checkpoint that does not load (moved aside to " + dir +
                                "/epoch-2.damaged): " + metadata + ": "),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + dir + "/epoch-1"), std::string::npos) << resumed.output;
  EXPECT_TRUE(datapar::dcp::is_checkpoint(dir + "/epoch-2"));
  EXPECT_TRUE(datapar::detail::is_directory(dir + "/epoch-2.damaged"));
}

// Issue 46: in a shared checkpoint root (mode 1777, as /tmp) another user plants what the
// job will write or read next. A link named like the next checkpoint ("epoch-1" -> a
// victim's directory) used to be written through: the victim's directory got .metadata and
// its own __0_0.distcp was replaced. Now the directory is opened without following a link
// and the save stops naming it, the victim untouched. A newer checkpoint directory of
// another user's ("epoch-7", a valid checkpoint) used to be resumed without a word; now it
// is skipped with the reason. (Another user: uid 65534, made by chown, which needs root.)
TEST(TrainCli, ACheckpointPlantedByAnotherUserInASharedDirectoryIsNeitherWrittenNorRead) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give files to another user (chown)";
  const TempDir temp("train_cli_dcp_planted");
  const std::string root = temp.path() + "/shared", victim = temp.path() + "/victim";
  ASSERT_TRUE(datapar::detail::make_directories(root).empty());
  ASSERT_TRUE(datapar::detail::make_directories(victim).empty());
  ASSERT_EQ(::chmod(root.c_str(), 01777), 0);
  std::ofstream(victim + "/__0_0.distcp") << "the victim's own file";
  const std::string link = root + "/epoch-1";
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  ASSERT_EQ(::lchown(link.c_str(), 65534, 65534), 0);
  const std::string args = kSmall + " --checkpoint-format dcp --checkpoint-dir " + root;
  const CliRun planted = cli(args + " --epochs 1");
  EXPECT_NE(planted.code, 0) << planted.output;
  EXPECT_NE(planted.output.find(link + " is a symbolic link: refused"), std::string::npos) << planted.output;
  EXPECT_EQ(read_text(victim + "/__0_0.distcp"), "the victim's own file");
  EXPECT_FALSE(datapar::detail::exists(victim + "/.metadata"));

  ASSERT_EQ(::unlink(link.c_str()), 0);
  const CliRun first = cli(args + " --epochs 2");
  ASSERT_EQ(first.code, 0) << first.output;
  // Another user's copy of epoch 2 as a newer epoch.
  const std::string foreign = root + "/epoch-7";
  ASSERT_TRUE(datapar::detail::make_directories(foreign).empty());
  for (const std::string& name : datapar::detail::list_directory(root + "/epoch-2")) {
    std::ifstream in(root + "/epoch-2/" + name, std::ios::binary);
    std::ofstream(foreign + "/" + name, std::ios::binary) << in.rdbuf();
    ASSERT_EQ(::chown((foreign + "/" + name).c_str(), 65534, 65534), 0);
  }
  ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
  ASSERT_TRUE(datapar::dcp::is_checkpoint(foreign));
  const CliRun resumed = cli(args + " --epochs 3 --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(foreign + " is an entry owned by uid 65534, not by this user (uid 0), in " + root +
                                ", which others can write: refused"),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + root + "/epoch-2 (2 epochs done)"), std::string::npos)
      << resumed.output;
}

// --checkpoint-format dcp: a DDP run's DCP checkpoint resumes under FSDP (skipping a newer
// directory that a cut save left without .metadata) and ends where an uninterrupted run ends;
// so does a --zero run's (its optimizer shards written by their owners) resumed without --zero.
TEST(TrainCli, DcpCheckpointsResumeInAnyModeSkippingIncompleteOnes) {
  const TempDir temp("train_cli_dcp");
  const std::string straight = temp.path() + "/straight", dcp_dir = temp.path() + "/dcp";
  const std::string args = kSmall + " --seed 5 --momentum 0.9 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + straight + " --mode ddp --epochs 3", 2, straight + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const std::string dcp_args = " --checkpoint-format dcp";
  // Written in the background (--checkpoint-async: over a group of the writer's own), resumed from.
  for (const auto& p : ddp_job(args + dcp_dir + " --mode ddp --epochs 2 --checkpoint-async" + dcp_args, 2, dcp_dir + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  ASSERT_TRUE(datapar::dcp::is_checkpoint(dcp_dir + "/epoch-2"));
  datapar::detail::make_directories(dcp_dir + "/epoch-3");  // a save cut short: no .metadata
  const auto resumed = ddp_job(args + dcp_dir + " --mode fsdp --epochs 3 --resume" + dcp_args, 2, dcp_dir + "/logs2");
  for (const auto& p : resumed) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(resumed[0].output.find("skipping a checkpoint that does not load (moved aside to " + dcp_dir +
                                   "/epoch-3.damaged): " + dcp_dir + "/epoch-3: no .metadata file"),
            std::string::npos) << resumed[0].output;
  EXPECT_NE(resumed[0].output.find("resuming from " + dcp_dir + "/epoch-2 (2 epochs done)"), std::string::npos)
      << resumed[0].output;
  const datapar::train::Checkpoint want = datapar::train::load_checkpoint(straight + "/checkpoint-epoch-3.pt", c10::kCPU);
  const datapar::dcp::State got = datapar::dcp::load_all(dcp_dir + "/epoch-3");
  for (const auto& item : want.model) {
    const at::Tensor& t = got.tensor("model." + item.key());
    EXPECT_TRUE(at::allclose(t, item.value(), 1e-5, 1e-6)) << item.key();
  }
  EXPECT_EQ(got.at("epoch").value.toInt(), 3);
  EXPECT_EQ(got.at("optim.param_groups.0.momentum").value.toDouble(), 0.9);

  // Under --zero each rank writes its own optimizer shard; the checkpoint resumes without it.
  const std::string zero_dir = temp.path() + "/zero";
  for (const auto& p : ddp_job(args + zero_dir + " --mode ddp --zero --epochs 2" + dcp_args, 2, zero_dir + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const datapar::dcp::State zero_state = datapar::dcp::load_all(zero_dir + "/epoch-2");
  EXPECT_EQ(zero_state.at("optim.param_groups.0.momentum").value.toDouble(), 0.9);
  const std::string resume = " --mode ddp --epochs 3 --resume";
  for (const auto& p : ddp_job(args + zero_dir + resume + dcp_args, 2, zero_dir + "/logs2")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const datapar::dcp::State zero_resumed = datapar::dcp::load_all(zero_dir + "/epoch-3");
  for (const auto& item : want.model) {
    EXPECT_TRUE(at::allclose(zero_resumed.tensor("model." + item.key()), item.value(), 1e-5, 1e-6)) << item.key();
  }
}

// A DCP checkpoint that 2 ranks of `datapar train` saved, loaded by PyTorch 2.15's dcp.load on
// 1 and 2 ranks into datapar's Python twin of the MLP (python/datapar_models.py), answers the
// test set exactly as datapar's --evaluate does.
TEST(TrainCli, PyTorchLoadsADcpCheckpointAndGetsItsTestAccuracy) {
  const TempDir temp("train_cli_dcp_python");
  const std::string dir = temp.path() + "/ck";
  const std::string args = " train --model mlp --batch-size 64 --lr 0.1 --workers 1 --checkpoint-dir " + dir +
                           " --checkpoint-format dcp";
  for (const auto& p : ddp_job(args + " --mode ddp --epochs 2", 2, temp.path() + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const CliRun evaluated = cli(args + " --evaluate");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(evaluated.output, m, std::regex(R"(test acc \d\.\d{4} \((\d+)/(\d+)\))")))
      << evaluated.output;
  const std::string want = "correct " + m[1].str() + " of " + m[2].str();
  for (int ranks : {1, 2}) {
    const datapar::testing::ProcessResult python = datapar::testing::run_shell(
        "PYTHONPATH='" DATAPAR_SOURCE_DIR "/python' '" DATAPAR_DCP_PYTHON "' '" DATAPAR_SOURCE_DIR
        "/tests/dcp/dcp_interop.py' accuracy '" + dir + "/epoch-2' '" DATAPAR_SOURCE_DIR "/data/fashion-mnist' " +
        std::to_string(ranks));
    ASSERT_EQ(python.exit_code, 0) << python.output;
    EXPECT_NE(python.output.find(want), std::string::npos) << ranks << " ranks: " << python.output << "\nwant " << want;
  }
}

// Issue 47: a DCP checkpoint of hsdp at 2 x 2 loads in PyTorch 2.15 (dcp.load into the MLP's
// twin on 2 ranks answers the test set as --evaluate does) and resumes as fsdp on 2 ranks and
// as ddp on 3.
TEST(TrainCli, AnHsdpDcpCheckpointLoadsInPyTorchAndResumesAsFsdpAndDdp) {
  const TempDir temp("train_cli_hsdp_dcp");
  const std::string dir = temp.path() + "/ck", fsdp = temp.path() + "/fsdp", ddp = temp.path() + "/ddp";
  const std::string args = " train --model mlp --batch-size 48 --lr 0.1 --momentum 0.9 --workers 1 "
                           "--checkpoint-format dcp --checkpoint-dir ";
  for (const auto& p : ddp_job(args + dir + " --mode hsdp --shard-size 2 --epochs 2", 4, temp.path() + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  const CliRun evaluated = cli(args + dir + " --evaluate");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(evaluated.output, m, std::regex(R"(test acc \d\.\d{4} \((\d+)/(\d+)\))")))
      << evaluated.output;
  const datapar::testing::ProcessResult python = datapar::testing::run_shell(
      "PYTHONPATH='" DATAPAR_SOURCE_DIR "/python' '" DATAPAR_DCP_PYTHON "' '" DATAPAR_SOURCE_DIR
      "/tests/dcp/dcp_interop.py' accuracy '" + dir + "/epoch-2' '" DATAPAR_SOURCE_DIR "/data/fashion-mnist' 2");
  ASSERT_EQ(python.exit_code, 0) << python.output;
  EXPECT_NE(python.output.find("correct " + m[1].str() + " of " + m[2].str()), std::string::npos) << python.output;
  for (const auto& [to, mode, ranks] : {std::make_tuple(fsdp, std::string("fsdp"), 2), std::make_tuple(ddp, std::string("ddp"), 3)}) {
    datapar::detail::make_directories(to);
    ASSERT_EQ(std::system(("cp -r " + dir + "/epoch-2 " + to + "/").c_str()), 0);
    const auto resumed = ddp_job(args + to + " --mode " + mode + " --epochs 3 --resume", ranks, to + "/logs");
    for (const auto& p : resumed) ASSERT_EQ(p.exit_code, 0) << p.output;
    EXPECT_NE(resumed[0].output.find("epoch 3/3"), std::string::npos) << resumed[0].output;
    EXPECT_EQ(resumed[0].output.find("epoch 2/3"), std::string::npos) << mode << " resumed after epoch 2:\n"
                                                                    << resumed[0].output;
  }
}

// --balance: however each global batch is shared out, the ranks (or devices) together compute
// the gradient of the whole batch, so training ends where even shares end. The sampler and
// BalancedBatches draw the same global batches (512 samples, batch 64: no padding).
TEST(TrainCli, UnevenSharesTrainLikeEvenOnes) {
  const TempDir temp("train_cli_balance");
  const std::string even = temp.path() + "/even", fixed = temp.path() + "/fixed", measured = temp.path() + "/auto";
  const std::string args = kSmall + " --mode ddp --seed 5 --momentum 0.9 --epochs 2 --checkpoint-dir ";
  for (const auto& p : ddp_job(args + even, 2, even + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  const auto shared = ddp_job(args + fixed + " --balance 3,1", 2, fixed + "/logs");
  for (const auto& p : shared) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(shared[0].output.find("balance: fixed shares 3,1"), std::string::npos) << shared[0].output;
  const auto timed = ddp_job(args + measured + " --balance auto", 2, measured + "/logs");
  for (const auto& p : timed) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(timed[0].output.find("balance: auto"), std::string::npos) << timed[0].output;
  expect_same_parameters(even + "/checkpoint-epoch-2.pt", fixed + "/checkpoint-epoch-2.pt");
  expect_same_parameters(even + "/checkpoint-epoch-2.pt", measured + "/checkpoint-epoch-2.pt");

  // DataParallel, in one process.
  const std::string dp = " --mode dp --devices cpu:0,cpu:1 --seed 5 --momentum 0.9 --epochs 2 --checkpoint-dir ";
  const CliRun dp_even = cli(kSmall + dp + temp.path() + "/dp_even");
  ASSERT_EQ(dp_even.code, 0) << dp_even.output;
  for (const std::string balance : {"1,3", "auto"}) {
    const std::string dir = temp.path() + "/dp_" + balance;
    const CliRun r = cli(kSmall + dp + dir + " --balance " + balance);
    ASSERT_EQ(r.code, 0) << r.output;
    expect_same_parameters(temp.path() + "/dp_even/checkpoint-epoch-2.pt", dir + "/checkpoint-epoch-2.pt");
  }
}

// Without --data: $DATAPAR_FASHION_MNIST_DIR when set, else the shipped subset (the tool's
// default; the library has none).
TEST(TrainCli, DataDefaultsToTheVariableElseTheShippedSubset) {
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::setenv("DATAPAR_FASHION_MNIST_DIR", "/nonexistent/fmnist", 1);
  const CliRun elsewhere = cli("train --epochs 1");
  ::unsetenv("DATAPAR_FASHION_MNIST_DIR");
  EXPECT_EQ(elsewhere.code, 2) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find("--data /nonexistent/fmnist: no such directory"), std::string::npos)
      << elsewhere.output;
  const CliRun shipped = cli("train --model mlp --epochs 1 --limit 64 --batch-size 64 --workers 1");
  EXPECT_EQ(shipped.code, 0) << shipped.output;
  EXPECT_NE(shipped.output.find(std::string(DATAPAR_SOURCE_DIR) + "/data/fashion-mnist"), std::string::npos)
      << shipped.output;
}

struct BadOption {
  std::string args;
  std::string message;
};

class TrainCliErrors : public ::testing::TestWithParam<BadOption> {};

TEST_P(TrainCliErrors, FailBeforeAnyWorkWithExitCode2) {
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  const CliRun r = cli("train --data synthetic --epochs 1 " + GetParam().args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("samples ("), std::string::npos) << "work started: " << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Options, TrainCliErrors,
    ::testing::Values(
        BadOption{"--model vgg", "--model: \"vgg\" is not a model"},
        BadOption{"--data /nonexistent/fmnist", "--data /nonexistent/fmnist: no such directory"},
        BadOption{"--mode dp --devices cpu:0,cpu:1 --batch-size 1", "--batch-size 1 is smaller than the 2 devices"},
        BadOption{"--mode dp --devices cpu:0,cuda:7", "cuda:7"},
        BadOption{"--devices gpu:0", "gpu:0"},
        BadOption{"--mode ddp", "datapar launch --nproc-per-node N -- datapar train"},
        BadOption{"--lr 0", "--lr 0: the learning rate must be positive"},
        BadOption{"--lr -0.5", "--lr -0.5"},
        BadOption{"--lr inf", "--lr inf: the learning rate must be positive and finite"},
        BadOption{"--lr nan", "--lr nan: the learning rate must be positive and finite"},
        BadOption{"--weight-decay -0.1", "--weight-decay -0.1: use a finite value >= 0"},
        BadOption{"--weight-decay inf", "--weight-decay inf: use a finite value >= 0"},
        BadOption{"--amp fp8", "--amp: \"fp8\" is not a precision datapar train autocasts to.\n---> HINT: use bf16"},
        BadOption{"--mode ddp --fault-tolerant --sync-every 4 --amp fp16",
                  "--amp fp16 --fault-tolerant --sync-every 4: each replica's gradient scaler skips its own inner steps"},
        BadOption{"--cuda-graph", "--cuda-graph: the run trains on cpu; CUDA graphs are a GPU's"},
        BadOption{"--cuda-graph --mode dp", "--cuda-graph captures the step of --mode single or ddp; --mode dp"},
        BadOption{"--cuda-graph --optimizer adam", "--cuda-graph --optimizer adam: libtorch's adam counts its steps"},
        BadOption{"--cuda-graph --amp fp16", "--cuda-graph --amp fp16: the gradient scaler reads on the host"},
        BadOption{"--cuda-graph --mode ddp --zero", "--cuda-graph does not combine with --zero"},
        BadOption{"--optimizer rmsprop", "--optimizer: \"rmsprop\" is not an optimizer datapar train knows"},
        BadOption{"--optimizer adam --momentum 0.9",
                  "--momentum 0.9 is SGD's; --optimizer adam keeps moments of its own"},
        BadOption{"--workers 100000", "--workers 100000: use 0 .. 256 data loader threads"},
        BadOption{"--workers -1", "--workers -1: use 0 .. 256"},
        BadOption{"--threads 100000", "--threads 100000: use 0 (default) .. 1024 intra-op threads"},
        BadOption{"--epochs 0", "--epochs 0: train for at least 1 epoch"},
        BadOption{"--epochs 99999999999999999999", "99999999999999999999 is out of range"},
        BadOption{"--mode dp --devices cpu:0,cpu:1 --balance 1e308,1e308", "the shares add up past the largest number"},
        BadOption{"--mode fast", "--mode: \"fast\" is not a mode"},
        BadOption{"--resume", "--resume needs --checkpoint-dir"},
        BadOption{"--checkpoint-async", "--checkpoint-async needs --checkpoint-dir"},
        BadOption{"--checkpoint-dir /proc/datapar-checkpoints", "--checkpoint-dir /proc/datapar-checkpoints: cannot make"},
        BadOption{"--checkpoint-dir /etc/hostname", "--checkpoint-dir /etc/hostname: cannot make this directory"},
        BadOption{"--batch-size abc", "batch-size"},
        BadOption{"--mode dp --replicas mirrored", "--replicas: \"mirrored\" is not a replica kind"},
        BadOption{"--plot /nonexistent/plots/p.png", "--plot /nonexistent/plots/p.png: the directory /nonexistent/plots does not exist"},
        BadOption{"--metrics /nonexistent/m.jsonl", "--metrics /nonexistent/m.jsonl: the directory /nonexistent does not exist"},
        BadOption{"--zero", "--zero shards the optimizer over the ranks of a ddp job; --mode single"},
        BadOption{"--mode fsdp --zero", "--mode fsdp shards it already, with the parameters and gradients"},
        BadOption{"--mp bf16", "--mp and --no-reshard are fully sharded training's; --mode single"},
        BadOption{"--mode fsdp --mp int8", "--mp: \"int8\" is not a precision"},
        BadOption{"--checkpoint-activations", "--checkpoint-activations recomputes resnet18's residual blocks; --model lenet"},
        BadOption{"--model resnet18 --mode dp --devices cpu:0,cpu:1 --checkpoint-activations",
                  "--checkpoint-activations: --mode dp copies the model to each device"},
        BadOption{"--mode fsdp --balance auto", "--balance auto: fsdp splits each batch evenly"},
        BadOption{"--mode ddp --shard-size 2", "--shard-size is hybrid sharding's; --mode ddp has no shard groups"},
        BadOption{"--comm-hook bf16", "--comm-hook is ddp's reduction of the gradients; --mode single reduces"},
        BadOption{"--sync-every 5", "--sync-every trains each replica alone between averages: a rank (--mode ddp"},
        BadOption{"--mode fsdp --sync-every 5", "(--mode fsdp and --zero shard over the whole job: one replica"},
        BadOption{"--mode hsdp --shard-size 2 --fault-tolerant --sync-every 5",
                  "(--mode hsdp, not under --fault-tolerant); --mode hsdp --fault-tolerant is not that"},
        BadOption{"--mode ddp --fault-tolerant --sync-every 4 --fragments 2",
                  "--fragments 2 under --fault-tolerant: fault tolerance takes whole DiLoCo rounds"},
        BadOption{"--outer-optimizer adam", "--outer-optimizer: \"adam\" is not an outer step"},
        BadOption{"--outer-lr 0", "--outer-lr 0 --outer-momentum 0.9: use a positive, finite rate"},
        BadOption{"--fragments 2", "--fragments and --outer-dtype shape --sync-every's averaging"},
        BadOption{"--mode ddp --sync-every 2 --fragments 3", "--fragments 3 with --sync-every 2: each fragment syncs"},
        BadOption{"--outer-dtype fp8", "--outer-dtype: \"fp8\" is not one"},
        BadOption{"--comm-hook zip", "--comm-hook \"zip\" is not a communication hook"},
        BadOption{"--comm-hook powersgd:0", "PowerSGD takes a rank from 1 to 1024"},
        BadOption{"--comm-hook powersgd:4:1", "PowerSGD takes a rank from 1 to 1024 and, after it, the steps"},
        BadOption{"--trace /nonexistent/t.json", "--trace /nonexistent/t.json: the directory /nonexistent does not exist"},
        BadOption{"--mode dp --balance fast", "--balance: \"fast\" is not a balance (\"fast\" is not a share >= 0)"},
        BadOption{"--mode dp --balance 1,,2", "(\"\" is not a share >= 0)"},
        BadOption{"--mode dp --balance 0,0", "--balance 0,0: every share is 0"},
        BadOption{"--mode dp --devices cpu:0,cpu:1 --balance 1,2,3", "--balance 1,2,3: 3 shares for 2 devices"},
        BadOption{"--balance auto", "--balance auto shares each batch between devices or ranks; --mode single"}));

// float16 on a CPU whose libtorch cannot multiply it: refused before the job forms, with
// what to use instead (libtorch 1.13; 2.x trains in float16 on the CPU).
// --amp fp16 (torch.autocast's float16 and torch.amp.GradScaler): the MLP on the shipped subset
// tests within a point of float32 (the mean of its last 3 epochs); under fsdp (a sharded
// optimizer: its ranks skip steps together) a run resumed from epoch 1 ends where one of 2
// epochs does, each rank's scale read back from beside the checkpoint. libtorch 1.x has no
// float16 autocast on the CPU: refused before the job forms.
TEST(TrainCli, Fp16WithTheGradScalerTrainsWithinAPointAndResumesItsScale) {
#if TORCH_VERSION_MAJOR < 2
  const CliRun r = cli("train --data synthetic --epochs 1 --amp fp16");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--amp fp16: libtorch 1.13's autocast computes in bfloat16 only on the CPU"),
            std::string::npos)
      << r.output;
#else
  const TempDir temp("train_cli_fp16");
  const std::string args =
      " train --model mlp --epochs 6 --batch-size 128 --momentum 0.9 --workers 1 --seed 3 --checkpoint-dir ";
  const CliRun full = cli(args + temp.path() + "/fp32");
  ASSERT_EQ(full.code, 0) << full.output;
  const CliRun half = cli(args + temp.path() + "/fp16 --amp fp16");
  ASSERT_EQ(half.code, 0) << half.output;
  EXPECT_GT(last_epochs_accuracy(full.output), 0.78) << full.output;
  EXPECT_NEAR(last_epochs_accuracy(half.output), last_epochs_accuracy(full.output), 0.01) << full.output << half.output;
  const std::string fsdp = kSmall + " --mode fsdp --amp fp16 --seed 5 --checkpoint-dir ";
  const std::string straight = temp.path() + "/straight", resumed = temp.path() + "/resumed";
  for (const auto& p : ddp_job(fsdp + straight + " --epochs 2", 2, straight + "/logs")) {
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  for (const auto& p : ddp_job(fsdp + resumed + " --epochs 1", 2, resumed + "/logs")) ASSERT_EQ(p.exit_code, 0) << p.output;
  const datapar::StateDict scale = datapar::load_state_dict_file(resumed + "/grad-scaler-epoch-1-rank-1.pt");
  EXPECT_GT(scale["scale"].item<double>(), 0) << "each rank's scale beside the checkpoint";
  const auto again = ddp_job(fsdp + resumed + " --epochs 2 --resume", 2, resumed + "/logs2");
  for (const auto& p : again) ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(again[0].output.find("no GradScaler state"), std::string::npos) << again[0].output;
  expect_same_parameters(straight + "/checkpoint-epoch-2.pt", resumed + "/checkpoint-epoch-2.pt");
#endif
}

TEST(TrainCli, Fp16WhereTheCpuCannotMultiplyItIsRefusedFirst) {
#if TORCH_VERSION_MAJOR >= 2
  GTEST_SKIP() << "this libtorch multiplies float16 on the CPU; --mp fp16 trains there (checked by hand)";
#else
  const CliRun r = cli("train --data synthetic --epochs 1 --mode fsdp --mp fp16",
                       "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--mp fp16: libtorch 1.13 has no float16 matrix products on the CPU"), std::string::npos)
      << r.output;
#endif
}

// A GPU node often has no gnuplot: --plot says so before training, not after epoch 1.
TEST(TrainCli, PlotWithoutGnuplotFailsBeforeTraining) {
  const TempDir temp("train_cli_no_gnuplot");  // an empty directory as the whole PATH
  const CliRun r = cli("train --data synthetic --epochs 1 --plot " + temp.path() + "/p.png", "PATH=" + temp.path());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("gnuplot is not installed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("samples ("), std::string::npos) << "work started: " << r.output;
}

TEST(TrainCli, DdpBatchSmallerThanRanksFailsOnEveryRank) {
  const TempDir temp("train_cli_ddp_errors");
  const std::string& dir = temp.path();
  for (const auto& p : ddp_job(kSmall + " --epochs 1 --mode ddp --batch-size 1", 2, dir)) {
    EXPECT_EQ(p.exit_code, 2) << p.output;
    EXPECT_NE(p.output.find("--batch-size 1 is smaller than the 2 ranks"), std::string::npos) << p.output;
  }
}

// ---- data: --limit bounds the memory; an empty split is an error (issue 13) ----

// Runs `datapar <args>` with its output to `log`; returns the exit code and sets the peak
// resident memory of the process (bytes).
int cli_peak_memory(const std::string& args, const std::string& log, int64_t* peak) {
  const pid_t pid = datapar::testing::start_logged({"/bin/sh", "-c", "exec " + kCli + " " + args}, log);
  if (pid < 0) return -1;
  const datapar::detail::ChildExit exit = datapar::detail::wait_child(pid, std::chrono::steady_clock::now() + std::chrono::seconds(600));
  *peak = exit.peak_resident_bytes;
  return exit.exit_code;
}

// 300,000 images (235 MB of pixels, a few hundred KB of gzip): --limit 64 used to read
// and convert all of them first (1.28 GB). Now it reads 64, so the run costs what the same
// run on the small shipped subset costs.
TEST(TrainCli, LimitReadsOnlyTheSamplesItUses) {
  const TempDir temp("train_cli_big_data");
  const std::string& dir = temp.path();
  datapar::testing::write_zero_idx_gz(dir + "/train-images-idx3-ubyte.gz", 0x803, {300000, 28, 28});
  datapar::testing::write_zero_idx_gz(dir + "/train-labels-idx1-ubyte.gz", 0x801, {300000});
  datapar::testing::write_zero_idx_gz(dir + "/t10k-images-idx3-ubyte.gz", 0x803, {300000, 28, 28});
  datapar::testing::write_zero_idx_gz(dir + "/t10k-labels-idx1-ubyte.gz", 0x801, {300000});
  const std::string args = "train --model mlp --limit 64 --batch-size 32 --epochs 1 --workers 1 --threads 1 --data ";
  int64_t small = 0, big = 0;
  ASSERT_EQ(cli_peak_memory(args + DATAPAR_SOURCE_DIR "/data/fashion-mnist", dir + "/small.log", &small), 0);
  ASSERT_EQ(cli_peak_memory(args + dir, dir + "/big.log", &big), 0);
  std::ifstream log(dir + "/big.log");
  const std::string output((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(output.find("64 train / 64 test samples"), std::string::npos) << output;
  EXPECT_LT(big, small + (int64_t{128} << 20)) << "peak " << (big >> 20) << " MB vs " << (small >> 20)
                                               << " MB on the shipped subset";
}

TEST(TrainCli, AnEmptyDatasetIsAnError) {
  const TempDir temp("train_cli_empty_data");
  const std::string& dir = temp.path();
  for (const std::string split : {"train", "t10k"}) {
    datapar::testing::write_zero_idx_gz(dir + "/" + split + "-images-idx3-ubyte.gz", 0x803, {0, 28, 28});
    datapar::testing::write_zero_idx_gz(dir + "/" + split + "-labels-idx1-ubyte.gz", 0x801, {0});
  }
  const CliRun r = cli("train --model mlp --epochs 1 --workers 1 --data " + dir);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(dir + "/train-images-idx3-ubyte.gz: holds 0 samples"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("loss"), std::string::npos) << r.output;
}

// ---- damaged checkpoints: reported, moved aside, never overwritten (issue 13) ----

// Flips one bit inside the first tensor of a checkpoint: the zip directory still reads
// (the cheap check passes), the record's CRC-32 does not.
std::string flip_a_tensor_bit(const std::string& path) {
  const size_t offset = caffe2::serialize::PyTorchStreamReader(path).getRecordOffset("data/0");
  std::string bytes = read_text(path);
  bytes[offset + 3] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return bytes;
}

TEST(TrainCli, ResumeMovesADamagedNewestCheckpointAsideAndUsesTheOneBefore) {
  const TempDir temp("train_cli_damaged_newest");
  const std::string& dir = temp.path();
  const std::string args = kSmall + " --checkpoint-dir " + dir;
  ASSERT_EQ(cli(args + " --epochs 2").code, 0);
  const std::string damaged = flip_a_tensor_bit(dir + "/checkpoint-epoch-2.pt");
  const CliRun r = cli(args + " --epochs 3 --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(dir + "/checkpoint-epoch-2.pt: record data/0 is damaged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("moved it to " + dir + "/checkpoint-epoch-2.pt.damaged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(1 epochs done)"), std::string::npos) << r.output;
  EXPECT_EQ(read_text(dir + "/checkpoint-epoch-2.pt.damaged"), damaged);  // kept as it was
  EXPECT_EQ(datapar::train::load_checkpoint(dir + "/checkpoint-epoch-2.pt").epoch, 2);  // written afresh
  EXPECT_EQ(datapar::train::load_checkpoint(dir + "/checkpoint-epoch-3.pt").epoch, 3);
}

TEST(TrainCli, ResumeWithEveryCheckpointDamagedDoesNotStartOverUnlessTold) {
  const TempDir temp("train_cli_all_damaged");
  const std::string& dir = temp.path();
  const std::string args = kSmall + " --checkpoint-dir " + dir;
  ASSERT_EQ(cli(args + " --epochs 1").code, 0);
  ::truncate((dir + "/checkpoint-epoch-1.pt").c_str(), 100);
  const std::string damaged = read_text(dir + "/checkpoint-epoch-1.pt");
  CliRun r = cli(args + " --epochs 2 --resume");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(dir + "/checkpoint-epoch-1.pt: cannot read"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--start-over"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("epoch 1/2"), std::string::npos) << r.output;
  EXPECT_FALSE(datapar::detail::exists(dir + "/checkpoint-epoch-1.pt"));
  EXPECT_EQ(read_text(dir + "/checkpoint-epoch-1.pt.damaged"), damaged);

  // A launcher's restart finds only the damaged file now: still not a fresh start.
  ::setenv("DATAPAR_RESTART_COUNT", "1", 1);
  r = cli(args + " --epochs 2");
  ::unsetenv("DATAPAR_RESTART_COUNT");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--start-over"), std::string::npos) << r.output;
  EXPECT_FALSE(datapar::detail::exists(dir + "/checkpoint-epoch-1.pt"));

  r = cli(args + " --epochs 2 --resume --start-over");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("starting from epoch 1"), std::string::npos) << r.output;
  EXPECT_EQ(read_text(dir + "/checkpoint-epoch-1.pt.damaged"), damaged);  // still there
  EXPECT_EQ(datapar::train::load_checkpoint(dir + "/checkpoint-epoch-2.pt").epoch, 2);
}

TEST(TrainCli, ResumeWithNoCheckpointYet) {
  const TempDir temp("train_cli_no_checkpoint_yet");
  const std::string& dir = temp.path();
  const std::string args = kSmall + " --epochs 1 --checkpoint-dir " + dir;
  // A restart before the first checkpoint was written: the run starts from epoch 1.
  ::setenv("DATAPAR_RESTART_COUNT", "1", 1);
  CliRun r = cli(args);
  ::unsetenv("DATAPAR_RESTART_COUNT");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("starting from epoch 1"), std::string::npos) << r.output;
  // An explicit --resume with nothing to resume from is a mistake, unless told to start over.
  const TempDir empty_temp("train_cli_no_checkpoint_at_all");
  const std::string& empty = empty_temp.path();
  r = cli(kSmall + " --epochs 1 --resume --checkpoint-dir " + empty);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--resume: no checkpoint in " + empty), std::string::npos) << r.output;
  r = cli(kSmall + " --epochs 1 --resume --start-over --checkpoint-dir " + empty);
  EXPECT_EQ(r.code, 0) << r.output;
}

}  // namespace
