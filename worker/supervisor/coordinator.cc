#include "longhaul/supervisor/coordinator.h"

#include <system_error>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"

namespace longhaul::supervisor {
namespace {

bool is_clean_stop(const std::exception_ptr& e) {
  if (!e) return true;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code() == Code::kOutOfRange;
  } catch (...) {
    return false;
  }
}

Code code_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code();
  } catch (...) {
    return Code::kInternal;
  }
}

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return std::string(code_name(err.code())) + ": " + err.what();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

Coordinator::~Coordinator() {
  request_stop();
  std::list<Thread> threads;
  {
    MutexLock lock(mu_);
    threads.swap(threads_);
    finished_.clear();
  }
  for (auto& t : threads) {
    if (t.thread.joinable()) {
      LH_LOG(DEBUG) << "coordinator joining thread" << kv("thread", t.name);
      t.thread.join();
    }
  }
}

void Coordinator::request_stop(std::exception_ptr error) {
  {
    MutexLock lock(mu_);
    if (error && !error_ && !is_clean_stop(error)) {
      error_ = error;
      if (code_of(error) == Code::kCancelled) {
        LH_LOG(INFO) << "stop requested" << kv("reason", describe(error));
      } else {
        LH_LOG(ERROR) << "stop requested with error" << kv("error", describe(error));
      }
    }
    stop_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool Coordinator::wait_for_stop(Clock::duration timeout) const {
  return wait_until_stop(Clock::now() + timeout);
}

bool Coordinator::wait_until_stop(Clock::time_point deadline) const {
  MutexLock lock(mu_);
  return cv_.wait_until(mu_, deadline, [&]() REQUIRES(mu_) { return stop_.load(); });
}

void Coordinator::wait_for_stop() const {
  MutexLock lock(mu_);
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return stop_.load(); });
}

void Coordinator::clear_stop() {
  MutexLock lock(mu_);
  for (const auto& t : threads_) {
    if (!done(t)) {
      throw FailedPrecondition("Coordinator::clear_stop called while thread " + t.name +
                               " is still running; join() first");
    }
  }
  stop_.store(false);
  error_ = nullptr;
}

std::exception_ptr Coordinator::error() const {
  MutexLock lock(mu_);
  return error_;
}

void Coordinator::raise_requested_exception() const {
  auto e = error();
  if (e) std::rethrow_exception(e);
}

void Coordinator::start_thread(std::string name, std::function<void()> body) {
  MutexLock lock(mu_);
  const uint64_t id = next_id_++;
  threads_.push_back(Thread{id, std::move(name), std::thread()});
  Thread* self = &threads_.back();
  try {
    self->thread = std::thread([this, id, body = std::move(body)] {
      stop_on_exception(*this, body);
      {
        MutexLock l(mu_);
        finished_.insert(id);
      }
      cv_.notify_all();
    });
  } catch (const std::system_error& e) {
    std::string name = self->name;
    threads_.pop_back();
    throw Unavailable("cannot start thread " + name + ": " + e.what());
  }
}

void Coordinator::join(Clock::duration stop_grace) {
  MutexLock lock(mu_);
  auto all_done = [&]() REQUIRES(mu_) {
    for (const auto& t : threads_) {
      if (!done(t)) return false;
    }
    return true;
  };
  // Wait for all threads to end or for a stop request; then give them the grace period.
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return stop_.load() || all_done(); });
  cv_.wait_until(mu_, Clock::now() + stop_grace, all_done);

  std::vector<std::string> stragglers;
  std::list<Thread> finished;
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (done(*it)) {
      finished_.erase(it->id);
      auto next = std::next(it);
      finished.splice(finished.end(), threads_, it);
      it = next;
    } else {
      stragglers.push_back(it->name);
      ++it;
    }
  }
  auto error = error_;
  lock.Unlock();
  for (auto& t : finished) t.thread.join();

  if (error) std::rethrow_exception(error);
  if (!stragglers.empty()) {
    std::string names;
    for (const auto& n : stragglers) names += (names.empty() ? "" : ", ") + n;
    throw DeadlineExceeded(
        "Coordinator stopped with threads still running after the stop grace period of " +
        std::to_string(std::chrono::duration<double>(stop_grace).count()) + " s: " + names +
        "; they do not check should_stop() often enough, or stop_grace_secs is too short");
  }
}

std::vector<std::string> Coordinator::running_threads() const {
  MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const auto& t : threads_) {
    if (!done(t)) names.push_back(t.name);
  }
  return names;
}

bool stop_on_exception(Coordinator& coord, const std::function<void()>& fn) {
  try {
    fn();
    return true;
  } catch (...) {
    coord.request_stop(std::current_exception());
    return false;
  }
}

void Looper::start(Coordinator& coord, std::string name, Coordinator::Clock::duration interval,
                   std::function<void()> body) {
  if (interval <= Coordinator::Clock::duration::zero()) {
    throw InvalidArgument("Looper " + name + " needs a positive interval");
  }
  coord.start_thread(name, [&coord, interval, body = std::move(body)] {
    auto next = Coordinator::Clock::now() + interval;
    while (!coord.wait_until_stop(next)) {
      body();
      next += interval;
      auto now = Coordinator::Clock::now();
      if (next <= now) {
        // Overran: skip the missed ticks, keep the phase.
        auto missed = (now - next) / interval + 1;
        next += missed * interval;
      }
    }
  });
}

}  // namespace longhaul::supervisor
