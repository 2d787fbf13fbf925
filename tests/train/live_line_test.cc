// What a user at a terminal sees while `datapar train` trains: rank 0's live line (step /
// steps of the epoch, loss, samples/s, time left) redrawn in place, then the epoch line;
// through `datapar launch` too; and while `datapar bench` runs, a line per timed phase.
// Piped, the output is plain lines, no carriage return.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "testing/processes.h"
#include "testing/terminal.h"

namespace {

using datapar::testing::run_in_terminal;
using datapar::testing::TerminalRun;

const std::string kDataparCli = std::string(DATAPAR_BIN_DIR) + "/datapar";
// LeNet over the full Fashion-MNIST (../shared/datasets) at batch 64: an epoch of 938 steps
// and a few seconds, long enough for "once a second" to mean something (the shipped subset's
// epoch, where the full set is missing, lasts half a second). The bar redraws after each
// step that ends 100 ms or more after its last redraw.
std::string data_dir() {
  const std::string full = DATAPAR_SOURCE_DIR "/../shared/datasets/fashion-mnist";
  return ::access((full + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0 ? full
                                                                           : DATAPAR_SOURCE_DIR "/data/fashion-mnist";
}
const std::vector<std::string> kTrain = {"train", "--model", "lenet", "--epochs", "1", "--batch-size", "64",
                                         "--lr", "0.9", "--workers", "1", "--data", data_dir()};
// The shipped subset, for what does not depend on the epoch's length.
const std::vector<std::string> kShort = {"train", "--model", "lenet", "--epochs", "1", "--batch-size", "64",
                                         "--lr", "0.9", "--workers", "1",
                                         "--data", DATAPAR_SOURCE_DIR "/data/fashion-mnist"};

std::vector<std::string> with(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// Each redraw of the live line: when it arrived, and the step it shows.
struct Redraw {
  double seconds;
  int step, steps;
};

std::vector<Redraw> redraws(const TerminalRun& run) {
  const std::regex drawn(std::string("\r") + R"(epoch 1/1  step (\d+)/(\d+) \[[#.]{20}\] +\d+%  loss \d+\.\d{3}  \d+ samples/s  \d+ s left\x1b\[K)");
  std::vector<Redraw> found;
  for (const auto& [seconds, text] : run.pieces) {
    for (auto m = std::sregex_iterator(text.begin(), text.end(), drawn); m != std::sregex_iterator(); ++m) {
      found.push_back({seconds, std::stoi((*m)[1]), std::stoi((*m)[2])});
    }
  }
  return found;
}

// The epoch's seconds, from its epoch line ("... test acc 0.312  4.2 s  1420 samples/s ...").
double epoch_seconds(const std::string& output) {
  std::smatch m;
  const std::regex line(R"(epoch 1/1  loss \d+\.\d{3}  train acc \d\.\d{3}  test acc \d\.\d{3}  (\d+\.\d) s )");
  return std::regex_search(output, m, line) ? std::stod(m[1]) : -1;
}

TEST(LiveLine, UnderATerminalTrainRedrawsItsLineInPlaceAtLeastOnceASecond) {
  const TerminalRun run = run_in_terminal(with({kDataparCli}, kTrain), std::chrono::seconds(240));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<Redraw> drawn = redraws(run);
  ASSERT_GE(drawn.size(), 2u) << run.output;
  for (size_t i = 1; i < drawn.size(); ++i) EXPECT_GT(drawn[i].step, drawn[i - 1].step) << run.output;
  EXPECT_EQ(drawn.back().step, drawn.back().steps) << "the last step is drawn";
  // At least once a second, on average over the epoch (no timed bound per gap: CI is shared).
  const double seconds = epoch_seconds(run.output);
  ASSERT_GT(seconds, 0) << run.output;
  EXPECT_GE(static_cast<double>(drawn.size()), seconds) << drawn.size() << " redraws in " << seconds << " s";
  // The line is erased before the epoch line, which starts on a clean line.
  EXPECT_NE(run.output.find("\r\x1b[Kepoch 1/1  loss "), std::string::npos) << run.output;
}

TEST(LiveLine, PipedTrainPrintsNoCarriageReturn) {
  std::string command = kDataparCli;
  for (const std::string& a : kShort) command += " " + a;
  const datapar::testing::ProcessResult r = datapar::testing::run_shell(command + " | cat");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(epoch_seconds(r.output), 0) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "a live line in a pipe:\n" << r.output;
}

// The launcher holds a worker's bytes until a newline and tags each line with its rank; rank
// 0's live line passes through untagged the moment it is whole, and the tagged epoch line
// follows. Piped, the launcher's workers draw nothing.
TEST(LiveLine, LaunchPassesRankZerosLiveLineToItsTerminal) {
  const std::vector<std::string> job =
      with({kDataparCli, "launch", "--nproc-per-node", "2", "--", kDataparCli}, with(kShort, {"--mode", "ddp", "--backend", "gloo"}));
  const TerminalRun run = run_in_terminal(job, std::chrono::seconds(240));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<Redraw> drawn = redraws(run);
  ASSERT_GE(drawn.size(), 2u) << run.output;
  EXPECT_EQ(run.output.find("[rank 0] \repoch"), std::string::npos) << "a tagged live line:\n" << run.output;
  EXPECT_EQ(run.output.find("[rank 1] \r"), std::string::npos) << "only rank 0 draws:\n" << run.output;
  EXPECT_NE(run.output.find("[rank 0] epoch 1/1  loss "), std::string::npos) << run.output;

  std::string command;
  for (const std::string& a : job) command += a + " ";
  const datapar::testing::ProcessResult piped = datapar::testing::run_shell(command + "| cat");
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_NE(piped.output.find("[rank 0] epoch 1/1  loss "), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find('\r'), std::string::npos) << "a live line in a pipe:\n" << piped.output;
}

// `datapar bench fsdp` at a terminal: rank 0 redraws a line per timed phase (ddp and fsdp in
// turn, each round), the last step of each drawn, and erases it before the results; piped,
// the results alone, no carriage return.
TEST(LiveLine, UnderATerminalBenchRedrawsALinePerPhaseAndErasesItBeforeTheResults) {
  const std::vector<std::string> bench = {kDataparCli, "bench", "fsdp", "--model", "lenet", "--steps", "20", "--rounds", "2"};
  const TerminalRun run = run_in_terminal(bench, std::chrono::seconds(240));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* phase : {"ddp (round 1/2)", "fsdp (round 1/2)", "ddp (round 2/2)", "fsdp (round 2/2)"}) {
    EXPECT_NE(run.output.find(std::string("\r") + phase + "  step 20/20 [####################] 100%"),
              std::string::npos)
        << phase << "\n" << run.output;
  }
  EXPECT_NE(run.output.find("\r\x1b[Kdatapar bench fsdp: lenet, 2 ranks"), std::string::npos) << run.output;

  std::string command;
  for (const std::string& a : bench) command += a + " ";
  const datapar::testing::ProcessResult piped = datapar::testing::run_shell(command + "| cat");
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_NE(piped.output.find("datapar bench fsdp: lenet, 2 ranks"), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find('\r'), std::string::npos) << "a live line in a pipe:\n" << piped.output;
}

}  // namespace
