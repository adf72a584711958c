// A rate-limited work queue of string keys ("namespace/name"), client-go's workqueue semantics:
//  - de-duplication: a key waiting in the queue is held once however often it is added;
//  - a key being processed (between get() and done()) is never handed to a second worker; if it
//    is added meanwhile, it is queued again when done() is called;
//  - add_after(key, delay) queues the key once the delay has passed;
//  - add_rate_limited(key) waits base * 2^failures (capped at max) for that key; forget(key)
//    resets its failure count after a success;
//  - shutdown() makes every get() return nullopt at once (queued keys are dropped).
// Delayed keys are promoted by the threads waiting in get(); the queue starts no thread.
//
// Metrics hooks: on_depth(n) after every change of the number of ready keys; on_latency(s) with
// the seconds a key waited between becoming ready and get().
//
// Thread-safety: every method is safe from any number of threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "longhaul/base/mutex.h"

namespace longhaul::kube {

struct WorkQueueOptions {
  std::chrono::milliseconds base_delay{5};       // first add_rate_limited delay
  std::chrono::milliseconds max_delay{1000000};  // cap of the per-key exponential backoff
  std::function<void(size_t depth)> on_depth;
  std::function<void(double seconds)> on_latency;
};

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkQueue(WorkQueueOptions options = {});

  void add(const std::string& key);
  void add_after(const std::string& key, Clock::duration delay);
  void add_rate_limited(const std::string& key);
  void forget(const std::string& key);
  int num_requeues(const std::string& key) const;

  // Blocks until a key is ready (and returns it, marking it in process) or shutdown().
  std::optional<std::string> get();
  // Like get() but gives up after `timeout`.
  std::optional<std::string> get_for(Clock::duration timeout);
  // Marks a key returned by get() as processed.
  void done(const std::string& key);

  void shutdown();
  bool shutting_down() const;
  size_t depth() const;  // ready keys (not counting delayed or in-process ones)

 private:
  void add_locked(const std::string& key) REQUIRES(mu_);
  // Moves delayed keys whose time has come to the ready queue; returns the next due time.
  std::optional<Clock::time_point> promote_due_locked(Clock::time_point now) REQUIRES(mu_);
  std::optional<std::string> get_until(std::optional<Clock::time_point> deadline);
  void report_depth_locked() REQUIRES(mu_);

  const WorkQueueOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::string> ready_ GUARDED_BY(mu_);
  std::unordered_set<std::string> dirty_ GUARDED_BY(mu_);  // needs processing
  std::unordered_set<std::string> processing_ GUARDED_BY(mu_);
  std::unordered_map<std::string, Clock::time_point> ready_since_ GUARDED_BY(mu_);
  std::multimap<Clock::time_point, std::string> delayed_ GUARDED_BY(mu_);
  std::unordered_map<std::string, Clock::time_point> delayed_at_ GUARDED_BY(mu_);  // earliest
  std::unordered_map<std::string, int> failures_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::kube
