// Epoch metrics: the epoch line, JSON lines that read back, the progress bar staying
// silent when disabled, and the gnuplot PNG.
#include "datapar/train/metrics.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "datapar/error.h"
#include "datapar/train/plot.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)

namespace datapar::train {
namespace {

EpochMetrics sample(int64_t epoch) {
  EpochMetrics m;
  m.epoch = epoch;
  m.epochs = 10;
  m.train_loss = 0.5123;
  m.train_accuracy = 0.8117;
  m.test_accuracy = 0.79;
  m.test_correct = 790;
  m.test_samples = 1000;
  m.train_samples = 6000;
  m.seconds = 12.34;
  m.samples_per_second = 4870.2;
  m.data_wait_seconds = 0.01;
  m.data_wait_share = 0.01 / 12.34;
  m.model = "lenet";
  m.mode = "ddp";
  m.devices = "cpu:0,cpu:1";
  m.world_size = 2;
  m.batch_size = 512;
  m.lr = 0.2;
  return m;
}

TEST(EpochLine, HasEveryFieldOfTheIssueExample) {
  EXPECT_EQ(format_epoch_line(sample(3), /*ranks=*/true),
            "epoch 3/10  loss 0.512  train acc 0.812  test acc 0.790  12.3 s  4870 samples/s  devices cpu:0,cpu:1 "
            "(ddp, 2 ranks)");
  EpochMetrics single = sample(1);
  single.mode = "single";
  single.devices = "cpu:0";
  EXPECT_NE(format_epoch_line(single, /*ranks=*/false).find("devices cpu:0 (single)"), std::string::npos);
}

TEST(MetricsJson, EveryFieldRoundTrips) {
  const EpochMetrics m = sample(4);
  const std::string line = to_json(m);
  const nlohmann::json j = nlohmann::json::parse(line);
  for (const char* key : {"epoch", "epochs", "train_loss", "train_accuracy", "test_accuracy", "test_correct",
                          "test_samples", "train_samples", "seconds", "samples_per_second", "eval_seconds",
                          "data_wait_seconds", "data_wait_share", "model", "mode", "devices", "world_size",
                          "batch_size", "lr"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  const EpochMetrics back = from_json(line);
  EXPECT_EQ(back.epoch, 4);
  EXPECT_EQ(back.devices, "cpu:0,cpu:1");
  EXPECT_DOUBLE_EQ(back.train_loss, m.train_loss);
  EXPECT_EQ(back.test_correct, 790);
  EXPECT_THROW(from_json("not json"), InvalidArgumentError);
}

TEST(MetricsWriter, TruncatesOrAppends) {
  const std::string path = ::testing::TempDir() + "/metrics_writer.jsonl";
  MetricsWriter(path, false).write(sample(1));
  MetricsWriter(path, true).write(sample(2));
  std::ifstream in(path);
  std::string a, b, c;
  ASSERT_TRUE(std::getline(in, a) && std::getline(in, b));
  EXPECT_FALSE(std::getline(in, c));
  EXPECT_EQ(from_json(b).epoch, 2);
  MetricsWriter(path, false).write(sample(7));
  std::ifstream again(path);
  ASSERT_TRUE(std::getline(again, a));
  EXPECT_EQ(from_json(a).epoch, 7);
  EXPECT_THROW(MetricsWriter("/nonexistent-dir/m.jsonl", false), InvalidArgumentError);
}

TEST(ProgressBar, DrawsOnlyWhenEnabledAndClearsItsLine) {
  char* text = nullptr;
  size_t size = 0;
  std::FILE* out = ::open_memstream(&text, &size);
  ProgressBar off(out, false);
  off.start(1, 2, 10);
  off.update(5, 0.7, 320);
  off.clear();
  std::fflush(out);
  EXPECT_EQ(size, 0u);
  ProgressBar on(out, true);
  on.start(1, 2, 10);
  on.update(10, 0.7, 640);
  on.clear();
  std::fclose(out);
  const std::string drawn(text, size);
  std::free(text);
  EXPECT_NE(drawn.find("\repoch 1/2  step 10/10 ["), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("0 s left\033[K"), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("100%"), std::string::npos) << drawn;
  EXPECT_EQ(drawn.substr(drawn.size() - 4), "\r\033[K");
}

TEST(Plot, WritesAPng) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  const std::string path = ::testing::TempDir() + "/plot_test.png";
  ::unlink(path.c_str());
  plot_metrics({sample(1), sample(2), sample(3)}, path, "a \"quoted\" title");
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_FALSE(datapar::detail::exists(path + ".tmp"));
  // One epoch plots too (gnuplot needs a non-empty x range).
  plot_metrics({sample(1)}, path, "one epoch");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 1000);
}

TEST(Plot, MissingGnuplotSaysWhatToInstall) {
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", "/nonexistent", 1);
  try {
    plot_metrics({sample(1)}, ::testing::TempDir() + "/never.png", "t");
    ADD_FAILURE() << "no error without gnuplot";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("gnuplot-nox"), std::string::npos) << e.what();
  }
  ::setenv("PATH", saved.c_str(), 1);
}

}  // namespace
}  // namespace datapar::train
