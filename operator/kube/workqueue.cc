// Rate-limited work queue (see workqueue.h).
#include "longhaul/kube/workqueue.h"

#include <algorithm>
#include <cmath>

#include "longhaul/base/log.h"

namespace longhaul::kube {

WorkQueue::WorkQueue(WorkQueueOptions options) : options_(std::move(options)) {}

void WorkQueue::report_depth_locked() {
  if (!options_.on_depth) return;
  try {
    options_.on_depth(ready_.size());
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "work queue depth observer threw" << kv("error", e.what());
  }
}

void WorkQueue::add_locked(const std::string& key) {
  if (shutdown_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (processing_.count(key)) return;  // queued again by done()
  ready_.push_back(key);
  ready_since_[key] = Clock::now();
  report_depth_locked();
  cv_.notify_one();
}

void WorkQueue::add(const std::string& key) {
  MutexLock lock(mu_);
  add_locked(key);
}

void WorkQueue::add_after(const std::string& key, Clock::duration delay) {
  if (delay <= Clock::duration::zero()) {
    add(key);
    return;
  }
  MutexLock lock(mu_);
  if (shutdown_) return;
  const auto when = Clock::now() + delay;
  auto it = delayed_at_.find(key);
  if (it != delayed_at_.end()) {
    if (it->second <= when) return;  // already due earlier
    // Move the key earlier: drop its old entry.
    auto range = delayed_.equal_range(it->second);
    for (auto d = range.first; d != range.second; ++d) {
      if (d->second == key) {
        delayed_.erase(d);
        break;
      }
    }
  }
  delayed_.emplace(when, key);
  delayed_at_[key] = when;
  cv_.notify_all();  // a waiter may need to wake earlier
}

void WorkQueue::add_rate_limited(const std::string& key) {
  Clock::duration delay;
  {
    MutexLock lock(mu_);
    int failures = failures_[key]++;
    double ms =
        static_cast<double>(options_.base_delay.count()) * std::pow(2.0, std::min(failures, 62));
    ms = std::min(ms, static_cast<double>(options_.max_delay.count()));
    delay =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  }
  add_after(key, delay);
}

void WorkQueue::forget(const std::string& key) {
  MutexLock lock(mu_);
  failures_.erase(key);
}

int WorkQueue::num_requeues(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

std::optional<WorkQueue::Clock::time_point> WorkQueue::promote_due_locked(Clock::time_point now) {
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    delayed_at_.erase(key);
    add_locked(key);
  }
  if (delayed_.empty()) return std::nullopt;
  return delayed_.begin()->first;
}

std::optional<std::string> WorkQueue::get_until(std::optional<Clock::time_point> deadline) {
  MutexLock lock(mu_);
  for (;;) {
    if (shutdown_) return std::nullopt;
    const auto now = Clock::now();
    auto next_due = promote_due_locked(now);
    if (!ready_.empty()) break;
    if (deadline && now >= *deadline) return std::nullopt;
    std::optional<Clock::time_point> wake = next_due;
    if (deadline && (!wake || *deadline < *wake)) wake = deadline;
    if (wake) {
      cv_.wait_until(mu_, *wake);
    } else {
      cv_.wait(mu_);
    }
  }
  std::string key = std::move(ready_.front());
  ready_.pop_front();
  dirty_.erase(key);
  processing_.insert(key);
  double waited = 0;
  if (auto it = ready_since_.find(key); it != ready_since_.end()) {
    waited = std::chrono::duration<double>(Clock::now() - it->second).count();
    ready_since_.erase(it);
  }
  report_depth_locked();
  if (options_.on_latency) {
    try {
      options_.on_latency(waited);
    } catch (const std::exception& e) {
      LH_LOG(WARNING) << "work queue latency observer threw" << kv("error", e.what());
    }
  }
  return key;
}

std::optional<std::string> WorkQueue::get() { return get_until(std::nullopt); }

std::optional<std::string> WorkQueue::get_for(Clock::duration timeout) {
  return get_until(Clock::now() + timeout);
}

void WorkQueue::done(const std::string& key) {
  MutexLock lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) && !shutdown_) {
    ready_.push_back(key);
    ready_since_[key] = Clock::now();
    report_depth_locked();
    cv_.notify_one();
  }
}

void WorkQueue::shutdown() {
  {
    MutexLock lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

bool WorkQueue::shutting_down() const {
  MutexLock lock(mu_);
  return shutdown_;
}

size_t WorkQueue::depth() const {
  MutexLock lock(mu_);
  return ready_.size();
}

}  // namespace longhaul::kube
