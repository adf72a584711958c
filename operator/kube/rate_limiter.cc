// Token bucket (see rate_limiter.h).
#include "longhaul/kube/rate_limiter.h"

#include <algorithm>

namespace longhaul::kube {

TokenBucket::TokenBucket(double qps, int burst)
    : qps_(qps), burst_(std::max(1, burst)), tokens_(std::max(1, burst)), last_(Clock::now()) {}

TokenBucket::Clock::duration TokenBucket::reserve(Clock::time_point now) {
  if (qps_ <= 0) return Clock::duration::zero();
  MutexLock lock(mu_);
  if (now > last_) {
    const double elapsed = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
    last_ = now;
  }
  tokens_ -= 1.0;
  if (tokens_ >= 0) return Clock::duration::zero();
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(-tokens_ / qps_));
}

bool TokenBucket::acquire(const std::stop_token& stop) {
  if (stop.stop_requested()) return false;
  const auto wait = reserve(Clock::now());
  if (wait <= Clock::duration::zero()) {
    MutexLock lock(mu_);
    return !closed_;
  }
  // Registered before taking mu_: the callback runs inline when the stop is already requested.
  std::stop_callback wake(stop, [this] {
    MutexLock lock(mu_);
    cv_.notify_all();
  });
  MutexLock lock(mu_);
  cv_.wait_for(mu_, wait, [&]() REQUIRES(mu_) { return closed_ || stop.stop_requested(); });
  return !closed_ && !stop.stop_requested();
}

void TokenBucket::close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace longhaul::kube
