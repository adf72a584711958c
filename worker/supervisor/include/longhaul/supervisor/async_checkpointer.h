// AsyncCheckpointer: checkpoints without stopping training. The snapshot is taken on the training
// thread, the write (CheckpointManager::save, checkpoint_manager.h) happens on a background
// thread. Also the listener interface through which metrics observe saves and restores.
//
// Thread-safety: request() belongs to the training thread; stats() and idle() may be called from
// any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/supervisor/checkpoint_manager.h"

namespace longhaul::supervisor {

class Coordinator;

// What one save cost. Reported to listeners on the writer thread.
struct CheckpointStats {
  int64_t step = 0;
  std::filesystem::path file;
  double wall_time = 0;          // when the write finished, seconds since the epoch
  double write_seconds = 0;      // writer thread: serialise + fsync + rename + state file
  double retention_seconds = 0;  // writer thread, after the commit: deleting old checkpoints
  double stall_seconds = 0;      // training thread blocked: waiting for a slot + snapshot copy
  uint64_t bytes = 0;            // file size
};

// The checkpoint a session started from. Reported to listeners on the training thread, so that a
// restarted process shows when its latest checkpoint was committed (not "never").
struct RestoredCheckpoint {
  int64_t step = 0;
  std::filesystem::path file;
  double wall_time = 0;  // when it was committed: the state file's timestamp, else the file's mtime
  uint64_t bytes = 0;    // file size
};

// Observes checkpoints (the metrics layer implements it). Called on the thread that saved or
// restored; implementations must be quick and thread-safe.
class CheckpointListener {
 public:
  virtual ~CheckpointListener() = default;
  virtual void on_saved(const CheckpointStats& stats) = 0;
  virtual void on_restored(const RestoredCheckpoint& restored) = 0;
  // This process took over the chief role mid-run (Supervisor::promote_to_chief); `latest` is
  // the logdir's latest checkpoint, committed by the lost chief (nothing was read).
  virtual void on_chief_role_taken(const RestoredCheckpoint& latest) { (void)latest; }
};

// One background writer thread and two reusable Snapshot slots. The training thread calls
// request() at a step boundary; it is blocked only while `fill` copies the state into a free
// slot (TrainingState::snapshot), and the write happens on the writer thread. Writes are
// strictly sequential: never two at once.
//
// Policy when a write is in flight (documented choice):
//   Mode::kSkipIfBusy (periodic saves): if any write is in flight or queued, nothing is taken and
//     request() returns false; the caller retries at a later step boundary.
//   Mode::kQueue (final / requested saves): the snapshot is taken at once into the free slot and
//     queued behind the in-flight write; only if both slots are busy does it wait for one.
// Errors on the writer thread are logged and reported with coord->request_stop(error); the
// failed checkpoint is not listed in the state file.
class AsyncCheckpointer {
 public:
  enum class Mode { kSkipIfBusy, kQueue };
  // Called on the writer thread after each successful save (the supervisor writes the
  // SessionLog CHECKPOINT from it), before listeners.
  using SavedCallback = std::function<void(const CheckpointStats&)>;

  AsyncCheckpointer(CheckpointManager& manager, Coordinator* coord,
                    std::vector<CheckpointListener*> listeners = {},
                    SavedCallback on_saved = nullptr);
  ~AsyncCheckpointer();  // stop()
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Takes a snapshot with `fill` (which must set every tensor and snapshot.step) and queues
  // its write. Returns false when skipped (kSkipIfBusy and busy) or stopped.
  bool request(const std::function<void(Snapshot&)>& fill, Mode mode);

  // Allocates the buffers of the slot the next request() will fill, so that the first
  // checkpoint's stall is a copy and not an allocation (the supervisor calls it at session
  // start). Training thread only, like request().
  void preallocate(const std::vector<TensorSpec>& specs);

  // Blocks until no write is in flight or queued.
  void wait_idle();
  bool idle() const;
  // Finishes the in-flight and queued writes and joins the writer thread. Idempotent.
  void stop();

  std::optional<CheckpointStats> last_stats() const;
  int64_t saves() const;
  int64_t failures() const;
  // The error of the most recent failed write (null when none failed).
  std::exception_ptr last_error() const;

 private:
  struct Slot {
    Snapshot snapshot;
    double stall_seconds = 0;
  };
  void run();

  CheckpointManager& manager_;
  Coordinator* coord_;
  std::vector<CheckpointListener*> listeners_;
  SavedCallback on_saved_;

  mutable Mutex mu_;
  CondVar cv_;
  Slot slots_[2];
  std::vector<int> free_ GUARDED_BY(mu_);    // slots the training thread may fill
  std::vector<int> queued_ GUARDED_BY(mu_);  // filled slots waiting for the writer, FIFO
  int writing_ GUARDED_BY(mu_) = -1;         // slot being written, -1 when none
  bool stopping_ GUARDED_BY(mu_) = false;
  std::optional<CheckpointStats> last_ GUARDED_BY(mu_);
  int64_t saves_ GUARDED_BY(mu_) = 0;
  int64_t failures_ GUARDED_BY(mu_) = 0;
  std::exception_ptr last_error_ GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace longhaul::supervisor
