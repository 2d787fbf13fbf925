// Rank 0's account of a run. See report.h.
#include "report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "datapar/train/plot.h"

namespace datapar::tools {
namespace {

// Reads the epochs before `first_epoch` back from a resumed run's metrics file, so that the
// file and the plot cover the whole run; later lines (an epoch after the checkpoint) go.
std::vector<train::EpochMetrics> earlier_epochs(const std::string& path, int64_t first_epoch) {
  std::vector<train::EpochMetrics> kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    train::EpochMetrics m = train::from_json(line);
    if (m.epoch <= first_epoch) kept.push_back(m);
  }
  return kept;
}

// "171,85": rows per device or rank, as printed when they change.
std::string join(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

}  // namespace

Report::Report(const TrainPlan& plan, int64_t first_epoch, bool writer) : plan_(plan) {
  if (writer) take_over(first_epoch + 1);
}

void Report::take_over(int64_t epoch) {
  const TrainOptions& o = plan_.options;
  if (o.metrics.empty()) return;
  history_ = epoch > 1 ? earlier_epochs(o.metrics, epoch - 1) : std::vector<train::EpochMetrics>{};
  metrics_ = std::make_unique<train::MetricsWriter>(o.metrics, /*append=*/false);
  for (const auto& m : history_) metrics_->write(m);
}

void Report::epoch(int64_t epoch, const EpochTotals& t, std::pair<int64_t, int64_t> test, double eval_seconds,
                   bool print) {
  const TrainOptions& o = plan_.options;
  train::EpochMetrics m;
  m.epoch = epoch;
  m.epochs = o.epochs;
  m.train_samples = static_cast<int64_t>(t.rows);
  m.train_loss = t.loss_sum / m.train_samples;
  m.train_accuracy = t.correct / m.train_samples;
  m.test_correct = test.first;
  m.test_samples = test.second;
  m.test_accuracy = test.second ? static_cast<double>(test.first) / test.second : 0.0;
  m.seconds = t.seconds;
  m.samples_per_second = m.train_samples / m.seconds;
  m.eval_seconds = eval_seconds;
  m.data_wait_seconds = t.data_wait_seconds;
  m.data_wait_share = m.data_wait_seconds / m.seconds;
  m.model = o.model;
  m.mode = o.mode;
  m.devices = plan_.devices_label;
  m.world_size = plan_.world_size;
  m.batch_size = plan_.global_batch;
  m.lr = plan_.lr;
  m.straggler_scores = t.straggler_scores;
  m.straggler = t.straggler;
  if (print) {
    std::printf("%s\n", train::format_epoch_line(m, has_ranks(plan_.mode)).c_str());
    std::fflush(stdout);
  }
  history_.push_back(m);
  if (metrics_) metrics_->write(m);
  if (!o.plot.empty()) {
    train::plot_metrics(history_, o.plot,
                        "datapar train: " + o.model + ", " + o.mode + " on " + plan_.devices_label + ", batch " +
                            std::to_string(plan_.global_batch) + ", lr " + std::to_string(plan_.lr).substr(0, 6));
  }
}

void report_balance(const char* who, int64_t step, const std::vector<int64_t>& rows, const LoadBalancer& balancer,
                    int64_t steps_per_measurement) {
  const auto milliseconds = [](const std::vector<double>& seconds) {
    std::string text;
    for (double c : seconds) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%s%.3g", text.empty() ? "" : ",", c * 1e3);
      text += buffer;
    }
    return text;
  };
  std::vector<double> fixed = balancer.fixed_seconds();
  for (double& f : fixed) f /= static_cast<double>(steps_per_measurement);
  const bool any_fixed = std::any_of(fixed.begin(), fixed.end(), [](double f) { return f > 0; });
  std::printf("balance: step %ld: rows per %s %s (measured ms per row %s%s%s)\n", (long)step, who,
              join(rows).c_str(), milliseconds(balancer.seconds_per_row()).c_str(),
              any_fixed ? "; fixed ms per step " : "", any_fixed ? milliseconds(fixed).c_str() : "");
  std::fflush(stdout);
}

}  // namespace datapar::tools
