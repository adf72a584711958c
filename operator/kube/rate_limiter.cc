// Token bucket (see rate_limiter.h).
#include "longhaul/kube/rate_limiter.h"

#include <algorithm>

namespace longhaul::kube {

TokenBucket::TokenBucket(double qps, int burst)
    : qps_(qps), burst_(std::max(1, burst)), tokens_(std::max(1, burst)), last_(Clock::now()) {}

TokenBucket::Clock::duration TokenBucket::reserve(Clock::time_point now) {
  if (qps_ <= 0) return Clock::duration::zero();
  std::lock_guard<std::mutex> lock(mu_);
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

bool TokenBucket::acquire() {
  const auto wait = reserve(Clock::now());
  std::unique_lock<std::mutex> lock(mu_);
  if (wait > Clock::duration::zero()) {
    cv_.wait_for(lock, wait, [this] { return closed_; });
  }
  return !closed_;
}

void TokenBucket::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace longhaul::kube
