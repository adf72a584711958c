// Self-test of scripts/check-thread-safety.py: this translation unit reads a GUARDED_BY field
// without holding its mutex, so the check MUST fail on it ("requires holding mutex"). It is not
// part of any build target.
#include "longhaul/base/mutex.h"

namespace {

class Counter {
 public:
  void increment() EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    ++count_;
  }
  int unguarded_value() const { return count_; }  // the bug the check exists to catch

 private:
  mutable longhaul::Mutex mu_;
  int count_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int read_without_lock() {
  Counter counter;
  counter.increment();
  return counter.unguarded_value();
}
