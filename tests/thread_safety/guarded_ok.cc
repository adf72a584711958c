// Self-test of scripts/check-thread-safety.py: every way the project holds a longhaul::Mutex
// (scoped lock, temporary unlock, condition-variable waits with a predicate, REQUIRES helpers,
// AssertHeld in callbacks) must pass the check. It is not part of any build target.
#include <chrono>
#include <functional>

#include "longhaul/base/mutex.h"

namespace {

class Queue {
 public:
  void push(int value) EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    push_locked(value);
    changed_.notify_all();
  }
  int pop() EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    changed_.wait(mu_, [&]() REQUIRES(mu_) { return size_ > 0; });
    --size_;
    return last_;
  }
  bool wait_empty(std::chrono::milliseconds timeout) EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    return changed_.wait_for(mu_, timeout, [&]() REQUIRES(mu_) { return size_ == 0; });
  }
  void call_unlocked(const std::function<void()>& fn) EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    ++calls_;
    lock.Unlock();
    fn();
    lock.Lock();
    ++calls_;
  }
  void with_lock_held(const std::function<void()>& fn) EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    fn();
  }
  void callback_under_lock() {
    mu_.AssertHeld();
    ++calls_;
  }

 private:
  void push_locked(int value) REQUIRES(mu_) {
    last_ = value;
    ++size_;
  }

  longhaul::Mutex mu_;
  longhaul::CondVar changed_;
  int last_ GUARDED_BY(mu_) = 0;
  int size_ GUARDED_BY(mu_) = 0;
  int calls_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int use_queue() {
  Queue queue;
  queue.push(1);
  queue.call_unlocked([] {});
  queue.with_lock_held([&] { queue.callback_under_lock(); });
  return queue.pop() + (queue.wait_empty(std::chrono::milliseconds(1)) ? 1 : 0);
}
