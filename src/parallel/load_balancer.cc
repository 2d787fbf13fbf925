#include "datapar/parallel/load_balancer.h"

#include <algorithm>
#include <cmath>

#include "datapar/error.h"

namespace datapar {
namespace {

double median(std::deque<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

// The step's length, per row of the batch, when device i takes weights[i] of it.
double predicted_step(const std::vector<double>& weights, const std::vector<double>& costs) {
  double longest = 0;
  for (size_t i = 0; i < weights.size(); ++i) longest = std::max(longest, weights[i] * costs[i]);
  return longest;
}

}  // namespace

LoadBalancer::LoadBalancer(size_t devices, LoadBalancerOptions options, std::vector<double> initial_weights)
    : options_(options), costs_(devices), latest_(devices, 0.0), last_move_(devices, 0.0) {
  DATAPAR_CHECK(devices >= 1, "LoadBalancer: no devices; give at least one.");
  DATAPAR_CHECK(options.window >= 1, "LoadBalancer: window is ", options.window, "; it must be >= 1.");
  DATAPAR_CHECK(options.min_steps >= 1 && options.min_steps <= options.window, "LoadBalancer: min_steps is ",
                options.min_steps, "; it must be between 1 and the window (", options.window, ").");
  DATAPAR_CHECK(options.skip_steps >= 0, "LoadBalancer: skip_steps is ", options.skip_steps, "; it must be >= 0.");
  DATAPAR_CHECK(std::isfinite(options.hysteresis) && options.hysteresis >= 0, "LoadBalancer: hysteresis is ",
                options.hysteresis, "; it must be a fraction >= 0 (0.1 = 10%).");
  DATAPAR_CHECK(std::isfinite(options.min_move) && options.min_move >= 0 && options.min_move < 1,
                "LoadBalancer: min_move is ", options.min_move, "; it must be a fraction in [0, 1) (0.01 = 1%).");
  if (initial_weights.empty()) initial_weights.assign(devices, 1.0);
  DATAPAR_CHECK(initial_weights.size() == devices, "LoadBalancer: ", initial_weights.size(), " weights for ", devices,
                " devices; give one weight per device.");
  double total = 0;
  for (double w : initial_weights) {
    DATAPAR_CHECK(std::isfinite(w) && w >= 0, "LoadBalancer: weight ", w, " is not a finite number >= 0.");
    total += w;
  }
  DATAPAR_CHECK(total > 0, "LoadBalancer: every weight is 0; give some device a share.");
  for (double& w : initial_weights) w /= total;
  weights_ = std::move(initial_weights);
}

bool LoadBalancer::record(const std::vector<int64_t>& rows, const std::vector<double>& seconds) {
  const size_t n = weights_.size();
  DATAPAR_CHECK(rows.size() == n && seconds.size() == n, "LoadBalancer::record: ", rows.size(), " row counts and ",
                seconds.size(), " times for ", n, " devices; give one of each per device.");
  for (size_t i = 0; i < n; ++i) {
    DATAPAR_CHECK(rows[i] >= 0, "LoadBalancer::record: device ", i, " ran ", rows[i], " rows.");
    DATAPAR_CHECK(std::isfinite(seconds[i]) && seconds[i] >= 0, "LoadBalancer::record: device ", i, " took ",
                  seconds[i], " s.");
  }
  if (recorded_++ < options_.skip_steps) return false;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] == 0) continue;
    std::deque<double>& window = costs_[i];
    window.push_back(seconds[i] / static_cast<double>(rows[i]));
    if (static_cast<int64_t>(window.size()) > options_.window) window.pop_front();
    latest_[i] = median(window);
  }
  const bool measured = std::all_of(costs_.begin(), costs_.end(), [&](const std::deque<double>& w) {
    return static_cast<int64_t>(w.size()) >= options_.min_steps;
  });
  if (!measured || n == 1) return false;

  // Shares in proportion to speed. A device measured as taking no time at all would get
  // everything; its cost is floored at a millionth of the slowest's.
  std::vector<double> costs = latest_;
  const double slowest = *std::max_element(costs.begin(), costs.end());
  if (slowest <= 0) return false;
  double speed_sum = 0;
  for (double& c : costs) {
    c = std::max(c, slowest * 1e-6);
    speed_sum += 1 / c;
  }
  std::vector<double> balanced(n);
  for (size_t i = 0; i < n; ++i) balanced[i] = (1 / costs[i]) / speed_sum;
  if (predicted_step(weights_, costs) <= predicted_step(balanced, costs) * (1 + options_.hysteresis)) return false;
  // Note [Halfway back]: a move against the previous one goes half as far as that one did.
  std::vector<double> move(n);
  double along = 0;
  for (size_t i = 0; i < n; ++i) {
    move[i] = balanced[i] - weights_[i];
    along += move[i] * last_move_[i];
  }
  const double scale = along < 0 ? move_scale_ / 2 : 1.0;
  double largest = 0;
  for (double& m : move) {
    m *= scale;
    largest = std::max(largest, std::abs(m));
  }
  if (largest < options_.min_move) return false;  // within the measurements' noise
  for (size_t i = 0; i < n; ++i) weights_[i] += move[i];
  move_scale_ = scale;
  last_move_ = std::move(move);
  ++rebalances_;
  for (auto& window : costs_) window.clear();
  return true;
}


}  // namespace datapar
