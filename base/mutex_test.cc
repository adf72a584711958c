// CondVar's timed waits (longhaul/base/mutex.h): wait_for is wait_until(now + timeout), so both
// must end at the deadline with the predicate's last value, and wake early when notified.
#include "longhaul/base/mutex.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace longhaul {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Flag {
 public:
  void set() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    set_ = true;
    changed_.notify_all();
  }
  // wait_for with a predicate: true once set() ran, false when `timeout` passed first.
  bool wait_for(Clock::duration timeout) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return changed_.wait_for(mu_, timeout, [this]() REQUIRES(mu_) { return set_; });
  }
  // wait_for without a predicate, with nobody to notify: times out.
  std::cv_status wait_once_for(Clock::duration timeout) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return changed_.wait_for(mu_, timeout);
  }

 private:
  Mutex mu_;
  CondVar changed_;
  bool set_ GUARDED_BY(mu_) = false;
};

TEST(CondVar, WaitForReturnsFalseAfterTheTimeoutWhenThePredicateStaysFalse) {
  Flag flag;
  const auto start = Clock::now();
  EXPECT_FALSE(flag.wait_for(50ms));
  EXPECT_GE(Clock::now() - start, 50ms);
}

TEST(CondVar, WaitForReturnsTrueWhenNotifiedBeforeTheTimeout) {
  Flag flag;
  std::thread setter([&] { flag.set(); });
  EXPECT_TRUE(flag.wait_for(60s));  // a generous deadline: set() ends the wait
  setter.join();
}

TEST(CondVar, WaitForWithoutAPredicateReportsATimeoutOnlyOnceTheTimeoutPassed) {
  Flag flag;
  const auto deadline = Clock::now() + 20ms;
  std::cv_status status;
  do {  // a spurious wake-up ends a wait early with no_timeout: wait again for what is left
    status = flag.wait_once_for(deadline - Clock::now());
  } while (status == std::cv_status::no_timeout);
  EXPECT_GE(Clock::now(), deadline);
}

}  // namespace
}  // namespace longhaul
