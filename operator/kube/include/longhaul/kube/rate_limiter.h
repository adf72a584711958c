// A token bucket (QPS with a burst), the client-side request limiter of HttpClient.
//
// Thread-safety: safe for concurrent use. close() wakes every waiter.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>

#include "longhaul/base/mutex.h"

namespace longhaul::kube {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  // qps <= 0 disables limiting. The bucket starts full (`burst` tokens).
  TokenBucket(double qps, int burst);

  // Takes one token at `now` and returns how long the caller must wait before using it (zero
  // when a token was available). Waits are queued: n callers in an empty bucket get n slots.
  Clock::duration reserve(Clock::time_point now);

  // reserve() and then wait. Returns false when close() or a stop request on `stop`
  // interrupted the wait.
  bool acquire(const std::stop_token& stop = {});

  void close();

 private:
  const double qps_;
  const double burst_;
  Mutex mu_;
  CondVar cv_;
  double tokens_ GUARDED_BY(mu_);  // negative when callers are queued
  Clock::time_point last_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::kube
