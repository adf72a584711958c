// The numerical watchdog; see watchdog.h for the rule.
#include "longhaul/trainer/watchdog.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace longhaul::trainer {
namespace {

double median(std::vector<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

NumericalWatchdog::NumericalWatchdog(const WatchdogOptions& options) : options_(options) {
  options_.window = std::max<int64_t>(options_.window, 5);
}

double NumericalWatchdog::spike_threshold(int64_t step) const {
  if (options_.loss_spike_mads <= 0 || step <= options_.spike_after_steps ||
      static_cast<int64_t>(losses_.size()) < options_.window) {
    return std::numeric_limits<double>::infinity();
  }
  const std::vector<double> window(losses_.begin(), losses_.end());
  const double m = median(window);
  std::vector<double> deviations;
  deviations.reserve(window.size());
  for (double x : window) deviations.push_back(std::fabs(x - m));
  const double sigma = std::max(1.4826 * median(std::move(deviations)), 0.01 * std::fabs(m));
  return m + options_.loss_spike_mads * sigma;
}

WatchdogVerdict NumericalWatchdog::check(int64_t step, double loss, double grad_norm) {
  WatchdogVerdict verdict;
  if (!std::isfinite(loss)) {
    verdict.ok = false;
    verdict.reason = "non-finite loss (" + number(loss) + ")";
    return verdict;
  }
  if (!std::isfinite(grad_norm)) {
    verdict.ok = false;
    verdict.reason = "non-finite gradient norm (" + number(grad_norm) + ")";
    return verdict;
  }
  const double threshold = spike_threshold(step);
  if (loss > threshold) {
    verdict.ok = false;
    verdict.reason = "loss spike: " + number(loss) + " > " + number(threshold) + " (median + " +
                     number(options_.loss_spike_mads) + " robust deviations of the last " +
                     std::to_string(losses_.size()) +
                     " steps; training.loss_spike_mads sets the factor, 0 disables)";
    return verdict;
  }
  losses_.push_back(loss);
  while (static_cast<int64_t>(losses_.size()) > options_.window) losses_.pop_front();
  return verdict;
}

}  // namespace longhaul::trainer
