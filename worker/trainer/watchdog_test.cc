// The numerical watchdog's rule (watchdog.h): non-finite values are always bad; a loss spike is
// judged against the median and robust deviation of the recent window only once the window is
// full and past the warm-up steps; bad losses never enter the window.
#include "longhaul/trainer/watchdog.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace longhaul::trainer {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(NumericalWatchdogTest, NonFiniteLossOrGradientNormIsBadFromTheFirstStep) {
  NumericalWatchdog w;
  EXPECT_TRUE(w.check(1, 5.0, 1.0).ok);
  const WatchdogVerdict nan_loss = w.check(2, kNaN, 1.0);
  EXPECT_FALSE(nan_loss.ok);
  EXPECT_NE(nan_loss.reason.find("non-finite loss"), std::string::npos) << nan_loss.reason;
  const WatchdogVerdict inf_norm = w.check(3, 4.0, kInf);
  EXPECT_FALSE(inf_norm.ok);
  EXPECT_NE(inf_norm.reason.find("non-finite gradient norm (inf)"), std::string::npos)
      << inf_norm.reason;
  EXPECT_FALSE(w.check(4, 4.0, kNaN).ok);
}

TEST(NumericalWatchdogTest, SpikeFarAboveTheRecentRangeIsBadOnlyAfterWarmupAndAFullWindow) {
  NumericalWatchdog w(
      WatchdogOptions{.loss_spike_mads = 10, .window = 20, .spike_after_steps = 30});
  // A noisy, slowly falling curve: 3.0 +- 0.05.
  int64_t step = 0;
  auto noisy = [](int64_t s) { return 3.0 - 0.001 * s + ((s % 3) - 1) * 0.05; };
  for (; step < 30; ++step) {
    // Before step 30 even a huge loss is accepted (early training is erratic)...
    EXPECT_TRUE(w.check(step + 1, step == 5 ? 50.0 : noisy(step), 1.0).ok) << step;
  }
  // ... the window (20 accepted losses) now holds only the normal ones.
  EXPECT_TRUE(std::isfinite(w.spike_threshold(31)));
  EXPECT_LT(w.spike_threshold(31), 4.0);
  EXPECT_GT(w.spike_threshold(31), 3.2);
  // Ordinary noise passes; a jump to 9 does not, and names the threshold.
  EXPECT_TRUE(w.check(31, noisy(31), 1.0).ok);
  const WatchdogVerdict spike = w.check(32, 9.0, 1.0);
  EXPECT_FALSE(spike.ok);
  EXPECT_NE(spike.reason.find("loss spike: 9 >"), std::string::npos) << spike.reason;
  // The spike did not enter the window: the same spike is caught again.
  EXPECT_FALSE(w.check(33, 9.0, 1.0).ok);
  // A flat curve (zero MAD) does not make every tiny wobble a spike (1% floor).
  NumericalWatchdog flat(
      WatchdogOptions{.loss_spike_mads = 10, .window = 5, .spike_after_steps = 0});
  for (int s = 1; s <= 5; ++s) EXPECT_TRUE(flat.check(s, 2.0, 1.0).ok);
  EXPECT_TRUE(flat.check(6, 2.1, 1.0).ok);
  EXPECT_FALSE(flat.check(7, 2.5, 1.0).ok);
}

TEST(NumericalWatchdogTest, ZeroFactorDisablesSpikeDetectionAndResetEmptiesTheWindow) {
  NumericalWatchdog off(WatchdogOptions{.loss_spike_mads = 0, .window = 5, .spike_after_steps = 0});
  for (int s = 1; s <= 10; ++s) EXPECT_TRUE(off.check(s, 1.0, 1.0).ok);
  EXPECT_TRUE(off.check(11, 1000.0, 1.0).ok);
  EXPECT_FALSE(off.check(12, kNaN, 1.0).ok);  // non-finite still is

  NumericalWatchdog w(WatchdogOptions{.loss_spike_mads = 10, .window = 5, .spike_after_steps = 0});
  for (int s = 1; s <= 5; ++s) EXPECT_TRUE(w.check(s, 1.0, 1.0).ok);
  EXPECT_FALSE(w.check(6, 100.0, 1.0).ok);
  w.reset();  // a restore: the window refills before spikes are judged again
  EXPECT_TRUE(w.check(7, 100.0, 1.0).ok);
}

}  // namespace
}  // namespace longhaul::trainer
