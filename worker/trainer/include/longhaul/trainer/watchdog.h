// The numerical watchdog: decides, after a step's backward pass and BEFORE its optimizer update,
// whether the step is safe to apply. A step is bad when its loss or its global gradient norm is
// not finite (NaN/Inf), or when its loss spikes far above the recent range: with the last
// `window` accepted losses, median m and median absolute deviation MAD, a loss above
//   m + k * max(1.4826 * MAD, 0.01 * |m|)
// (k = loss_spike_mads; 1.4826 * MAD estimates a standard deviation robustly, the 1% floor keeps
// a flat loss curve from flagging noise) is a spike. Spike detection waits until the window is
// full and the step is past `spike_after_steps` (the first steps of training fall fast and
// erratically), and is off when k is 0. Bad steps never enter the window.
//
// What happens to a bad step is the trainer's business (trainer.h): with
// training.on_nonfinite = stop it throws NumericalError (exit code 5) before anything is applied
// or checkpointed; with skip_step it drops the update and counts the step as skipped.
//
// Thread-safety: none; the training thread owns it. Data-parallel replicas feed it the averaged
// loss and the all-reduced gradient norm, so every replica reaches the same verdict.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "longhaul/base/error.h"

namespace longhaul::trainer {

// A step was numerically broken and training.on_nonfinite is `stop` (or too many steps in a row
// were skipped). Permanent: the worker exits 5; resuming replays the same data, so fix the cause
// (lower the learning rate, check the data) or set training.on_nonfinite: skip_step.
class NumericalError : public Error {
 public:
  explicit NumericalError(const std::string& message) : Error(Code::kInternal, message) {}
};

struct WatchdogOptions {
  double loss_spike_mads = 10;      // k; 0 disables spike detection
  int64_t window = 100;             // accepted losses the median/MAD are taken over (>= 5)
  int64_t spike_after_steps = 100;  // no spike detection at or before this global step
};

struct WatchdogVerdict {
  bool ok = true;
  std::string reason;  // when !ok: "non-finite loss (nan)", "loss spike: 9.1 > 4.2 (...)"
};

class NumericalWatchdog {
 public:
  explicit NumericalWatchdog(const WatchdogOptions& options = {});

  // Judges step `step` (1-based global step it would become) with its mean loss and gradient
  // norm (before clipping). An ok loss enters the window.
  WatchdogVerdict check(int64_t step, double loss, double grad_norm);
  // Forgets the window (after a restore: the losses of another session are not comparable).
  void reset() { losses_.clear(); }

  // The current spike threshold, or +inf while spike detection is not active.
  double spike_threshold(int64_t step) const;

 private:
  WatchdogOptions options_;
  std::deque<double> losses_;  // the last `window` accepted losses, oldest first
};

}  // namespace longhaul::trainer
