// Coordinator and Looper: the thread discipline of the supervisor, with the semantics of
// TensorFlow's tf.train.Coordinator and its LooperThread.
//
// A Coordinator holds one stop flag and the first error that caused a stop. Every service thread
// is started through it (start_thread, Looper), runs until should_stop(), and an exception that
// escapes a thread body becomes request_stop(that error), which stops all the others. join()
// waits for every thread, gives them stop_grace to finish once a stop was requested, and then
// re-raises the recorded error. OutOfRange is a clean stop: recorded, but not re-raised.
//
// Improvements over TF: a real error requested after a clean stop is still recorded (so a failed
// final checkpoint after SIGTERM is not lost); threads that outlive the grace period raise
// DeadlineExceeded naming them (TF: "Coordinator stopped with threads still running") and stay
// owned by the Coordinator, whose destructor joins them (C++ threads cannot be abandoned safely).
//
// Thread-safety: every member of Coordinator may be called from any thread, except join() and
// the destructor, which belong to the thread that owns the Coordinator.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"

namespace longhaul::supervisor {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;

  Coordinator() = default;
  ~Coordinator();  // requests stop and joins any thread still registered
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Requests all coordinated threads to stop. `error` (may be null) is recorded when it is the
  // first non-clean error; OutOfRange is a clean stop and is never re-raised.
  void request_stop(std::exception_ptr error = nullptr) EXCLUDES(mu_);
  bool should_stop() const { return stop_.load(std::memory_order_acquire); }

  // Blocks until a stop is requested or `timeout` passes; true when a stop was requested.
  bool wait_for_stop(Clock::duration timeout) const EXCLUDES(mu_);
  bool wait_until_stop(Clock::time_point deadline) const EXCLUDES(mu_);
  void wait_for_stop() const EXCLUDES(mu_);

  // Resets the stop flag and the recorded error, so the Coordinator can be used again after
  // join(). Throws FailedPrecondition when threads are still registered.
  void clear_stop() EXCLUDES(mu_);

  // The recorded error (null when none or a clean stop).
  std::exception_ptr error() const EXCLUDES(mu_);
  // Rethrows the recorded error, if any.
  void raise_requested_exception() const EXCLUDES(mu_);

  // Starts `body` on a new thread registered with this Coordinator. An exception escaping
  // `body` calls request_stop(that exception). TF's register_thread, without a separate
  // "create a thread" step: a C++ thread must be known from its first instant to be joined.
  void start_thread(std::string name, std::function<void()> body) EXCLUDES(mu_);

  // Waits for all registered threads. Once a stop has been requested (or every thread ended),
  // threads get `stop_grace` to finish. Then re-raises the first recorded error; if there is
  // none but threads are still running, throws DeadlineExceeded naming them. Threads that
  // finished are unregistered; stragglers stay registered.
  void join(Clock::duration stop_grace = std::chrono::seconds(120)) EXCLUDES(mu_);

  // Names of registered threads that have not finished.
  std::vector<std::string> running_threads() const EXCLUDES(mu_);

 private:
  struct Thread {
    uint64_t id;  // set before the thread starts, never changed
    std::string name;
    std::thread thread;
  };
  // Whether `t`'s body has returned. The flag lives in finished_, not in Thread: clang cannot
  // check a GUARDED_BY on a nested struct's field naming the enclosing object's mutex.
  bool done(const Thread& t) const REQUIRES(mu_) { return finished_.count(t.id) > 0; }

  mutable Mutex mu_;
  mutable CondVar cv_;  // signalled on stop and when a thread finishes
  std::atomic<bool> stop_{false};
  std::exception_ptr error_ GUARDED_BY(mu_);
  std::list<Thread> threads_ GUARDED_BY(mu_);    // std::list: stable addresses
  std::set<uint64_t> finished_ GUARDED_BY(mu_);  // ids of threads_ whose body returned
  uint64_t next_id_ GUARDED_BY(mu_) = 0;
};

// Runs `fn`; an exception escaping it calls coord.request_stop(that exception) instead of
// propagating (TF's `with coord.stop_on_exception():`). Returns false when `fn` threw.
bool stop_on_exception(Coordinator& coord, const std::function<void()>& fn);

// A fixed-rate timer thread registered with a Coordinator: runs `body` every `interval`, the
// first time one interval after start (never at t=0). A run that overruns skips the missed
// ticks instead of bursting. Waits on the Coordinator's condition, so a stop request ends the
// wait at once. An exception from `body` stops the Coordinator with that error.
class Looper {
 public:
  // Starts the thread. `interval` must be positive (the supervisor does not start a Looper for
  // a disabled service). Throws InvalidArgument otherwise.
  static void start(Coordinator& coord, std::string name, Coordinator::Clock::duration interval,
                    std::function<void()> body);
};

// Seconds as a steady_clock duration (options are in seconds, like TF's).
inline Coordinator::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Coordinator::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace longhaul::supervisor
