// Checkpoints in the logdir: CheckpointManager (save with the commit protocol, retention,
// finding the latest valid checkpoint) and AsyncCheckpointer (snapshot on the training thread,
// write on a background thread).
//
// Files: `<logdir>/<basename>-<step>.safetensors` (safetensors.h) and the `checkpoint` state file
// (checkpoint_state.h). Commit protocol of save(): the checkpoint is written to a temp file,
// fsynced, renamed, and the directory fsynced; only then is the state file rewritten the same
// way. So the state file ("latest") never names an incomplete file, and a crash at any instant
// leaves the previous state valid. Leftover `*.tmp.*` files of a crashed writer are removed when
// a CheckpointManager is created.
//
// Retention (TF's CheckpointManager rules, carried across restarts through the state file's
// timestamps): after each save, while more than max_to_keep checkpoints are listed, the oldest
// leaves the list; it is kept on disk (preserved) when its timestamp is at least
// keep_checkpoint_every_n_hours after last_preserved_timestamp (which then becomes its
// timestamp), deleted otherwise. max_to_keep 0 keeps everything. Only files this manager owns
// (owns(): inside the logdir, named `<basename>-<step>.safetensors`) are ever deleted: a state file
// naming absolute paths elsewhere or `../` paths (TF tools write absolute ones) has those entries
// left alone with a WARNING and dropped from the rotation. A fresh logdir starts
// last_preserved_timestamp at the manager's creation time, as TF does.
//
// Thread-safety: CheckpointManager is internally locked; save() may run on the AsyncCheckpointer
// thread while latest()/checkpoints() are read elsewhere. AsyncCheckpointer: request() belongs
// to the training thread; stats() and idle() may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "longhaul/supervisor/checkpoint_state.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/supervisor/training_state.h"

namespace longhaul::supervisor {

class Coordinator;

struct CheckpointManagerOptions {
  std::filesystem::path logdir;
  std::string basename = "model.ckpt";
  int max_to_keep = 5;                           // 0 keeps every checkpoint
  double keep_checkpoint_every_n_hours = 10000;  // 0 disables preservation
  // Remove `<basename>-*.safetensors.tmp.*` and `checkpoint.tmp.*` left by a crashed writer.
  // Only the process that writes checkpoints (the chief) should.
  bool remove_temp_files = true;
};

// One checkpoint listed in the state file.
struct CheckpointEntry {
  std::filesystem::path file;  // <logdir>/model.ckpt-<step>.safetensors
  int64_t step = -1;           // -1 when the name carries no step
  double timestamp = 0;        // seconds since the epoch
};

class CheckpointManager {
 public:
  // Creates the logdir if needed, removes leftover temp files, and loads the state file. A
  // missing state file means "no checkpoints listed" (the directory is scanned); a garbled one
  // is reported with a WARNING and rebuilt from a directory scan. Throws PermissionDenied when
  // the logdir cannot be created or written.
  explicit CheckpointManager(CheckpointManagerOptions options);

  // Writes `snapshot` as <logdir>/<basename>-<step>.safetensors, commits it, rewrites the state
  // file, then applies retention. Returns the checkpoint file. `wall_time` is its timestamp
  // (seconds since the epoch; now when negative). Throws on I/O errors; the state file then
  // still names the previous checkpoint.
  std::filesystem::path save(const Snapshot& snapshot, double wall_time = -1);

  // The file the state names as latest (not verified), or nullopt.
  std::optional<std::filesystem::path> latest() const;
  // Listed checkpoints, oldest first.
  std::vector<CheckpointEntry> checkpoints() const;
  CheckpointState state() const;

  // Opens the newest checkpoint that passes full verification (structure + every CRC-32C).
  // Candidates: the state file's list, newest first, then older files found in the directory
  // (e.g. preserved ones); only the directory when the state file is missing or garbled. Logs a
  // WARNING naming each corrupt or truncated file it skips. nullptr when none is valid; the
  // files skipped are appended to `skipped` when given.
  std::unique_ptr<SafetensorsReader> latest_valid(
      std::vector<std::filesystem::path>* skipped = nullptr) const;

  const CheckpointManagerOptions& options() const { return options_; }
  std::filesystem::path file_for_step(int64_t step) const;
  // True for `<logdir>/<basename>-<step>.safetensors` exactly (after resolving `..` and
  // symlinks): the only files retention may ever delete.
  bool owns(const std::filesystem::path& file) const;

 private:
  void load_state();
  std::vector<CheckpointEntry> scan_directory() const;
  void remove_temp_files();
  void warn_foreign(std::string_view prefix, const std::filesystem::path& file) const;

  CheckpointManagerOptions options_;
  mutable std::mutex mu_;
  std::vector<CheckpointEntry> entries_;  // guarded by mu_; oldest first
  double last_preserved_timestamp_ = 0;   // guarded by mu_
  bool state_usable_ = true;              // false when the state file was missing or garbled
};

// What one save cost. Reported to listeners on the writer thread.
struct CheckpointStats {
  int64_t step = 0;
  std::filesystem::path file;
  double wall_time = 0;      // when the write finished, seconds since the epoch
  double write_seconds = 0;  // writer thread: serialise + fsync + rename + state file
  double stall_seconds = 0;  // training thread blocked: waiting for a slot + snapshot copy
  uint64_t bytes = 0;        // file size
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

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Slot slots_[2];
  std::vector<int> free_;    // guarded by mu_: slots the training thread may fill
  std::vector<int> queued_;  // guarded by mu_: filled slots waiting for the writer, FIFO
  int writing_ = -1;         // guarded by mu_: slot being written, -1 when none
  bool stopping_ = false;    // guarded by mu_
  std::optional<CheckpointStats> last_;  // guarded by mu_
  int64_t saves_ = 0;                    // guarded by mu_
  int64_t failures_ = 0;                 // guarded by mu_
  std::exception_ptr last_error_;        // guarded by mu_
  std::thread writer_;
};

}  // namespace longhaul::supervisor
