#include "longhaul/supervisor/async_checkpointer.h"

#include <chrono>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/supervisor/coordinator.h"

namespace longhaul::supervisor {
namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(CheckpointManager& manager, Coordinator* coord,
                                     std::vector<CheckpointListener*> listeners,
                                     SavedCallback on_saved)
    : manager_(manager),
      coord_(coord),
      listeners_(std::move(listeners)),
      on_saved_(std::move(on_saved)),
      free_{1, 0} {
  writer_ = std::thread([this] { run(); });
}

AsyncCheckpointer::~AsyncCheckpointer() { stop(); }

bool AsyncCheckpointer::request(const std::function<void(Snapshot&)>& fill, Mode mode) {
  auto start = SteadyClock::now();
  int slot = -1;
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    if (mode == Mode::kSkipIfBusy && (writing_ >= 0 || !queued_.empty())) return false;
    cv_.wait(mu_, [&]() REQUIRES(mu_) { return !free_.empty() || stopping_; });
    if (stopping_) return false;
    slot = free_.back();
    free_.pop_back();
  }
  // The slot is ours alone until queued: fill it without holding the lock.
  try {
    fill(slots_[slot].snapshot);
  } catch (...) {
    MutexLock lock(mu_);
    free_.push_back(slot);
    cv_.notify_all();
    throw;
  }
  slots_[slot].stall_seconds = seconds_since(start);
  {
    MutexLock lock(mu_);
    queued_.push_back(slot);
  }
  cv_.notify_all();
  return true;
}

void AsyncCheckpointer::preallocate(const std::vector<TensorSpec>& specs) {
  int slot = -1;
  {
    MutexLock lock(mu_);
    if (free_.empty()) return;
    slot = free_.back();
  }
  // Free slots are touched only by the training thread, which is this one.
  slots_[slot].snapshot.reshape(specs);
}

void AsyncCheckpointer::run() {
  while (true) {
    int slot = -1;
    {
      MutexLock lock(mu_);
      cv_.wait(mu_, [&]() REQUIRES(mu_) { return !queued_.empty() || stopping_; });
      if (queued_.empty()) return;  // stopping and nothing left to write
      slot = queued_.front();
      queued_.erase(queued_.begin());
      writing_ = slot;
    }
    Slot& s = slots_[slot];
    std::optional<CheckpointStats> stats;
    try {
      CheckpointStats st;
      st.step = s.snapshot.step;
      SaveTimes times;
      st.file = manager_.save(s.snapshot, -1, &times);
      st.write_seconds = times.commit_seconds;
      st.retention_seconds = times.retention_seconds;
      st.stall_seconds = s.stall_seconds;
      std::error_code ec;
      st.bytes = std::filesystem::file_size(st.file, ec);
      st.wall_time =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      stats = st;
      LH_LOG(INFO) << "checkpoint saved" << kv("step", st.step) << kv("path", st.file.string())
                   << kv("bytes", st.bytes) << kv("write_seconds", st.write_seconds)
                   << kv("retention_seconds", st.retention_seconds)
                   << kv("stall_seconds", st.stall_seconds);
      if (on_saved_) on_saved_(st);
      for (auto* l : listeners_) l->on_saved(st);
    } catch (...) {
      LH_LOG(ERROR) << "checkpoint write failed" << kv("step", s.snapshot.step);
      {
        MutexLock lock(mu_);
        ++failures_;
        last_error_ = std::current_exception();
      }
      if (coord_ != nullptr) coord_->request_stop(std::current_exception());
    }
    {
      MutexLock lock(mu_);
      writing_ = -1;
      free_.push_back(slot);
      if (stats) {
        last_ = stats;
        ++saves_;
      }
    }
    cv_.notify_all();
  }
}

void AsyncCheckpointer::wait_idle() {
  MutexLock lock(mu_);
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return writing_ < 0 && queued_.empty(); });
}

bool AsyncCheckpointer::idle() const {
  MutexLock lock(mu_);
  return writing_ < 0 && queued_.empty();
}

void AsyncCheckpointer::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::optional<CheckpointStats> AsyncCheckpointer::last_stats() const {
  MutexLock lock(mu_);
  return last_;
}

int64_t AsyncCheckpointer::saves() const {
  MutexLock lock(mu_);
  return saves_;
}

int64_t AsyncCheckpointer::failures() const {
  MutexLock lock(mu_);
  return failures_;
}

}  // namespace longhaul::supervisor

namespace longhaul::supervisor {

std::exception_ptr AsyncCheckpointer::last_error() const {
  MutexLock lock(mu_);
  return last_error_;
}

}  // namespace longhaul::supervisor
