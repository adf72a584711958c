// The replica's training progress in its container's termination message, the Kubernetes way:
// the kubelet reads the file at the container's terminationMessagePath (default
// /dev/termination-log) when the container ends and puts its text in the pod's
// status.containerStatuses[].state.terminated.message. The operator reads it there, so the final
// status of a finished TrainingJob shows exactly the step it ended at and its last committed
// checkpoint, however short the job and whenever its metrics were last read
// (operator/controller/progress.h).
//
// The message is one JSON object (at most 4096 bytes, the kubelet's limit):
//   {"step":1500,"maxSteps":1500,"lastCheckpointStep":1500,
//    "lastCheckpointTime":"2026-11-27T08:00:00Z","lastStepTime":"2026-11-27T08:00:00Z",
//    "stepsPerSecond":12.5,"chief":true}
// lastCheckpoint* are absent before the first checkpoint, lastStepTime before the first step,
// stepsPerSecond (the mean over this process's session) when it took no step; chief says
// whether this replica held the chief role when it ended (longhaul_worker_is_chief).
//
// Where: $LONGHAUL_TERMINATION_MESSAGE_PATH when set (tests, local runs, the local kubelet),
// created if needed; else /dev/termination-log, written only when it exists (a kubelet creates
// it; a run outside Kubernetes leaves /dev alone). A path that is absent or cannot be written
// is logged at INFO and never fails the worker.
//
// Thread-safety: every method may be called from any thread (one mutex guards the values);
// on_saved runs on the checkpoint writer thread, on_step on the training thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "longhaul/base/mutex.h"
#include "longhaul/base/thread_annotations.h"
#include "longhaul/supervisor/async_checkpointer.h"

namespace longhaul::cli {

class TerminationMessage : public supervisor::CheckpointListener {
 public:
  // Where the message goes (see above); `create` is false for the kubelet's default path.
  struct Target {
    std::filesystem::path path;
    bool create = false;
  };
  static Target default_target();

  explicit TerminationMessage(Target target = default_target());
  // Writes the message (write()): the worker's progress as it ends, on every path out of the
  // train command, an exception included.
  ~TerminationMessage() override;
  TerminationMessage(const TerminationMessage&) = delete;
  TerminationMessage& operator=(const TerminationMessage&) = delete;

  void set_max_steps(int64_t max_steps) EXCLUDES(mu_);
  void set_chief(bool is_chief) EXCLUDES(mu_);
  // The session started at `step` (restored or initialised): the rate counts from here.
  void on_session_start(int64_t step) EXCLUDES(mu_);
  void on_step(int64_t step) EXCLUDES(mu_);

  // supervisor::CheckpointListener
  void on_saved(const supervisor::CheckpointStats& stats) override EXCLUDES(mu_);
  void on_restored(const supervisor::RestoredCheckpoint& restored) override EXCLUDES(mu_);
  void on_chief_role_taken(const supervisor::RestoredCheckpoint& latest) override EXCLUDES(mu_);

  // The JSON text described above.
  std::string text() const EXCLUDES(mu_);
  // Replaces the file's contents with text(). False (logged, no exception) when it cannot.
  bool write() const noexcept EXCLUDES(mu_);

 private:
  using Clock = std::chrono::system_clock;
  Target target_;
  mutable Mutex mu_;
  int64_t step_ GUARDED_BY(mu_) = 0;
  int64_t max_steps_ GUARDED_BY(mu_) = 0;
  bool chief_ GUARDED_BY(mu_) = false;
  std::optional<int64_t> checkpoint_step_ GUARDED_BY(mu_);
  double checkpoint_time_ GUARDED_BY(mu_) = 0;  // seconds since the epoch
  std::optional<Clock::time_point> last_step_at_ GUARDED_BY(mu_);
  std::optional<std::pair<int64_t, Clock::time_point>> session_start_ GUARDED_BY(mu_);
};

}  // namespace longhaul::cli
