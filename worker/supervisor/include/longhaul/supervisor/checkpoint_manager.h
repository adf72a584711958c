// CheckpointManager: the checkpoints in a logdir. Save with the commit protocol, retention,
// finding the latest valid checkpoint. Asynchronous saves: async_checkpointer.h.
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
// Thread-safety: internally locked; save() may run on the AsyncCheckpointer thread while
// latest()/checkpoints()/state() are read elsewhere. Readers never wait on a disk sync: they
// see the list as of the last state file that was committed (a save's new entry appears once
// its state file rewrite has completed), and saves commit their state files one at a time, in
// the order their entries are listed.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/supervisor/checkpoint_state.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/supervisor/training_state.h"

namespace longhaul::supervisor {

struct CheckpointManagerOptions {
  std::filesystem::path logdir;
  std::string basename = "model.ckpt";
  int max_to_keep = 5;                           // 0 keeps every checkpoint
  double keep_checkpoint_every_n_hours = 10000;  // 0 disables preservation
  // Remove `<basename>-*.safetensors.tmp.*` and `checkpoint.tmp.*` left by a crashed writer.
  // Only the process that writes checkpoints (the chief) should.
  bool remove_temp_files = true;
  // Rewrites the state file (temp file, fsync, rename, directory fsync). Empty:
  // write_checkpoint_state. Tests hold a save inside its state file sync with it.
  std::function<void(const std::filesystem::path& logdir, const CheckpointState& state)>
      state_writer;
  // Fencing (the writer's logdir lease, logdir_lease.h): when set, save() calls it just before
  // each step that changes what other processes see — the checkpoint's rename, the state file's
  // rewrite (before its rename; before state_writer when that is set) and retention's deletions —
  // and it throws (LeaseLost) when this process may no longer write the logdir. save() then stops
  // with nothing more renamed or deleted, and the temp file is removed.
  std::function<void()> fence;
};

// Where a save's time went (save()'s optional out-parameter).
struct SaveTimes {
  double commit_seconds = 0;      // the checkpoint and the state file naming it, both committed
  double retention_seconds = 0;   // then: deleting the checkpoints retention dropped
  SafetensorsWriteTimes data;     // of commit_seconds: the checkpoint file, by phase
  double state_file_seconds = 0;  // of commit_seconds: the state file (written, fsynced, renamed)
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
  // (seconds since the epoch; now when negative). latest()/checkpoints()/state() list it once
  // the state file naming it is committed. Throws on I/O errors; the state file, and latest(),
  // then still name the previous checkpoint. `times`, when given, receives the commit time and
  // the retention time after it (freeing a large file costs the filesystem time of its own).
  std::filesystem::path save(const Snapshot& snapshot, double wall_time = -1,
                             SaveTimes* times = nullptr);

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
  // Held by save() from reading the list to publishing the new one, across the state file's
  // write and syncs: state file rewrites happen one at a time, in list order. Taken before mu_.
  Mutex save_mu_;
  // Guards the published list; never held across I/O.
  mutable Mutex mu_;
  std::vector<CheckpointEntry> entries_ GUARDED_BY(mu_);  // oldest first
  double last_preserved_timestamp_ GUARDED_BY(mu_) = 0;
};

}  // namespace longhaul::supervisor
