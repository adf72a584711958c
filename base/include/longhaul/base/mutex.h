// longhaul::Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with clang's
// thread-safety annotations (longhaul/base/thread_annotations.h), as leveldb's port::Mutex and
// port::CondVar and abseil's absl::Mutex. Fields declared GUARDED_BY(mu_) with a longhaul::Mutex
// are checked by clang -Wthread-safety; with gcc these are thin inline wrappers, no cost.
//
//   Mutex mu_;
//   CondVar changed_;
//   bool done_ GUARDED_BY(mu_) = false;
//
//   void finish() EXCLUDES(mu_) {
//     MutexLock lock(mu_);
//     done_ = true;
//     changed_.notify_all();
//   }
//   void wait() EXCLUDES(mu_) {
//     MutexLock lock(mu_);
//     changed_.wait(mu_, [&]() REQUIRES(mu_) { return done_; });
//   }
//
// Thread-safety: Mutex and CondVar are as thread-safe as their std counterparts; a MutexLock
// belongs to the thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "longhaul/base/thread_annotations.h"

namespace longhaul {

// A non-recursive mutual-exclusion lock.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the lock (where it cannot see it: callbacks run
  // under the lock). No run-time check: std::mutex does not know its owner.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope. Unlock()/Lock() release and retake it inside the scope (the
// destructor unlocks only when held), like std::unique_lock.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable waited on with a longhaul::Mutex held (std::condition_variable
// underneath, so no extra cost). The wait functions release the mutex while blocked and hold it
// again when they return, as std::condition_variable does; predicates run with it held, so a
// predicate lambda that reads guarded fields says so: `[&]() REQUIRES(mu_) { return done_; }`.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

  void wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <class Predicate>
  void wait(Mutex& mu, Predicate stop_waiting) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock, std::move(stop_waiting));
    lock.release();
  }
  template <class Clock, class Duration>
  std::cv_status wait_until(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();
    return status;
  }
  // Returns the predicate's last value: false when the deadline passed first.
  template <class Clock, class Duration, class Predicate>
  bool wait_until(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline,
                  Predicate stop_waiting) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    bool result = cv_.wait_until(lock, deadline, std::move(stop_waiting));
    lock.release();
    return result;
  }
  // wait_for is wait_until(steady_clock::now() + timeout), as the standard specifies it.
  template <class Rep, class Period>
  std::cv_status wait_for(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout)
      REQUIRES(mu) {
    return wait_until(mu, std::chrono::steady_clock::now() + timeout);
  }
  // Returns the predicate's last value: false when the timeout passed first.
  template <class Rep, class Period, class Predicate>
  bool wait_for(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout,
                Predicate stop_waiting) REQUIRES(mu) {
    return wait_until(mu, std::chrono::steady_clock::now() + timeout, std::move(stop_waiting));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace longhaul
