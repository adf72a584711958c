// Supervisor: the C++ counterpart of tf.train.Supervisor. It owns everything a long training
// run does besides training: restoring or initialising the model, periodic checkpoints (written
// in the background), TensorBoard events, the global_step/sec counter, user loops, a clean stop
// on errors and on SIGTERM, and a final checkpoint.
//
// Usage (compare TF's `with sv.managed_session() as sess: while not sv.should_stop(): ...`):
//
//   longhaul::supervisor::SupervisorOptions opts;
//   opts.logdir = "runs/x";
//   opts.is_chief = rank == 0;
//   opts.save_model_secs = 600;              // 0 disables the checkpoint service
//   opts.init_fn = [](TrainingState& s) { load_pretrained(s); };  // only without a checkpoint
//   longhaul::supervisor::Supervisor sv(opts);
//   longhaul::supervisor::SignalHandler signals(sv);   // signals.h: checkpoint + stop
//   sv.managed_session(model, [&](Supervisor& sv) {
//     while (!sv.should_stop()) {
//       float loss = model.train_step();               // one optimizer step
//       int64_t step = model.global_step();
//       if (step % 10 == 0) sv.add_scalar("loss", loss, step);
//       if (step == max_steps) sv.request_stop();      // ends normally: final checkpoint
//       sv.step_boundary(step);                        // checkpoints are taken here
//     }
//   });
//   return signals.signal_received() ? 143 : 0;
//
// managed_session(state, body), on the chief:
//   1. restore the latest valid checkpoint (CheckpointManager::latest_valid: corrupt ones are
//      skipped with a WARNING; one of another shape fails with FailedPrecondition naming the
//      first mismatched tensor, via check_compatible); if the logdir has none,
//      state.initialize() then init_fn. If checkpoints exist but all are corrupt: DataLoss
//      (training never silently restarts from step 0 over a damaged logdir);
//   2. local_init_fn, then the readiness check (ready_check, default state.uninitialized()):
//      FailedPrecondition listing what is not initialised;
//   3. open a new events file, write SessionLog START at the restored step, start the services:
//      checkpoint service (every save_model_secs it marks a checkpoint due; the snapshot is taken
//      by the training thread at the next step_boundary(), never by the service thread; while a
//      write is still in flight a due periodic save waits for a later boundary, a requested one
//      is queued, see AsyncCheckpointer; the snapshot slot is allocated here, not at the first
//      checkpoint), summary service (every save_summaries_secs: summary_fn, then flush), step
//      counter
//      (`global_step/sec` every save_summaries_secs), and loops added with loop();
//   4. run body; an exception from body or any service requests a stop with that error;
//   5. when body returns or throws a clean stop (OutOfRange, Cancelled) and
//      checkpoint_on_stop is set, take a final checkpoint at the current step (unless that step
//      was just saved);
//   6. stop and join the services within stop_grace_secs, finish the checkpoint writes, write
//      SessionLog STOP with the step, close the events file;
//   7. re-raise the first error, unless it was a clean stop (OutOfRange, Cancelled). After a
//      clean end whose final checkpoint did not commit (disk full during the SIGTERM save),
//      throw Aborted saying so and naming the latest committed checkpoint: never a clean end.
//      A chief whose writer lock was taken over (its lease ran out) throws LeaseLost whatever
//      else happened: it wrote nothing after the loss (no final checkpoint, no SessionLog STOP).
// On a non-chief: wait until the chief has initialised or restored the model (the logdir holds
// a checkpoint state file or the `chief.ready` marker the chief writes after step 2), polling
// within tens of milliseconds at first and never less often than every recovery_wait_secs
// (base/poll.h), DeadlineExceeded after max_wait_secs; then restore the latest valid
// checkpoint or initialize() (the distributed layer then broadcasts the chief's weights), run
// local_init_fn and the readiness check, and run body. Non-chiefs write no checkpoint or event.
//
// Thread-safety: managed_session and step_boundary belong to the training thread (the snapshot
// is taken there). should_stop, request_stop, request_checkpoint, loop, summary_computed,
// add_scalar, add_histogram and the accessors may be called from any thread (summaries are
// serialised under a lock). summary_fn runs on the summary service thread.
//
// Stop timing: services get stop_grace_secs to end once a stop is requested; the final
// checkpoint write is then waited for (it is what a SIGTERM is for). To bound the whole exit,
// give SignalHandler an exit_deadline_secs.
#pragma once

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/supervisor/async_checkpointer.h"
#include "longhaul/supervisor/coordinator.h"
#include "longhaul/supervisor/events.h"
#include "longhaul/supervisor/logdir_lease.h"
#include "longhaul/supervisor/training_state.h"

namespace longhaul::supervisor {

class Supervisor;

// Defaults are TensorFlow's. For the *_secs intervals, 0 disables the service. longhaul-worker
// sets every field from its config, whose own defaults (trainer/config.h) are shorter where a
// worker run wants them: checkpoint.save_model_secs 60, summaries.save_summaries_secs 30.
struct SupervisorOptions {
  std::filesystem::path logdir;  // required: checkpoints, state file, events
  bool is_chief = true;
  std::string checkpoint_basename = "model.ckpt";
  double save_model_secs = 600;      // checkpoint service interval; 0 disables it
  double save_summaries_secs = 120;  // summary service + step counter interval; 0 disables
  double recovery_wait_secs = 30;    // non-chief: the longest interval between two looks
  double stop_grace_secs = 120;      // time services get to stop once a stop is requested
  double max_wait_secs = 7200;       // non-chief gives up waiting for the chief after this
  int max_to_keep = 5;               // 0 keeps every checkpoint
  double keep_checkpoint_every_n_hours = 10000;
  bool summaries_enabled = true;   // false: no summary service (TF's summary_op=None)
  bool write_events = true;        // false: no events file at all (TF's summary_writer=None)
  bool checkpoint_on_stop = true;  // final checkpoint on a normal end or a clean stop
  double events_flush_secs = 10;   // events file background flush interval
  // The writer lock's lease (logdir_lease.h): a chief that has not renewed it for this long
  // (frozen, partitioned, its node gone while a shared filesystem keeps its flock) is taken over
  // by the next chief; 0: never (only once its flock is released). The heartbeat runs every
  // lock_heartbeat_secs (0: lock_lease_secs / 6).
  double lock_lease_secs = 30;
  double lock_heartbeat_secs = 0;
  // Polled while the chief's constructor waits for a verdict on a writer lock that another
  // process holds (at most one lease): true ends the wait with Cancelled (a SIGTERM at start-up).
  std::function<bool()> start_up_cancelled;

  // Pre-trained initialisation; called only when the logdir has no valid checkpoint.
  std::function<void(TrainingState&)> init_fn;
  // A replacement replica joining a running data-parallel group (worker/distributed, "Recovery in
  // place"): when set, the session takes the state from the running replicas by calling this
  // instead of restoring a checkpoint or initialising (chief and non-chief alike; a non-chief
  // does not wait for the chief's marker). No checkpoint is read; init_fn is not called.
  std::function<void(TrainingState&)> state_from_peers;
  // Readiness check: names of what is not initialised; default state.uninitialized().
  std::function<std::vector<std::string>(const TrainingState&)> ready_check;
  // Called after restore/initialisation on every replica (TF's local_init_op).
  std::function<void(TrainingState&)> local_init_fn;
  // Called on the summary service thread every save_summaries_secs (may call add_scalar...).
  std::function<void(Supervisor&)> summary_fn;
  // Observers of saves and restores (e.g. the metrics layer); not owned.
  std::vector<CheckpointListener*> checkpoint_listeners;
};

// The marker file a chief writes into the logdir once the model is initialised or restored.
inline constexpr std::string_view kChiefReadyFile = "chief.ready";
// The chief's writer lock: a lease (logdir_lease.h) held for the Supervisor's life: an flock(2)
// on a file whose record names the holder (host, pid, boot id, since), a generation and the
// time of its last heartbeat. A second chief on the same logdir is refused with AlreadyExists
// naming the holder; the kernel drops the flock when the holder dies (kill -9 included), so a
// restart is never blocked by a dead process; a holder that stopped renewing for
// lock_lease_secs (frozen, partitioned: a shared filesystem may keep its flock) is taken over.
// A chief that was taken over stops with LeaseLost before committing anything more (every
// checkpoint rename, state file rewrite and deletion is fenced by the lease).
inline constexpr std::string_view kWriterLockFile = ".writer.lock";

class Supervisor {
 public:
  // Validates options (InvalidArgument naming the option). On the chief, creates the logdir,
  // checks it is writable, takes the writer lock, and removes temp files left by a crashed
  // writer. A lock held by another process: AlreadyExists naming the holder as soon as it renews
  // its lease (within one heartbeat); a holder that does not renew for its lease is taken over
  // (a WARNING names it), so this waits at most one lease (Cancelled when start_up_cancelled).
  explicit Supervisor(SupervisorOptions options);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs `body` in a managed session (see the top of this file). Returns normally when training
  // ended or stopped cleanly; otherwise rethrows the first error after cleanup.
  void managed_session(TrainingState& state, const std::function<void(Supervisor&)>& body);

  // Called by the training loop once per step, after the optimizer step. Takes a checkpoint
  // when one is due. Costs one atomic load when nothing is due.
  void step_boundary(int64_t step) {
    if (checkpoint_due_.load(std::memory_order_relaxed) != 0) take_due_checkpoint(step);
  }

  bool should_stop() const { return coord_.should_stop(); }
  // Requests a stop; `error` is re-raised by managed_session unless it is a clean stop.
  void request_stop(std::exception_ptr error = nullptr) { coord_.request_stop(error); }
  // Asks for a checkpoint at the next step boundary (queued even if a write is in flight).
  // Safe from any thread.
  void request_checkpoint() { checkpoint_due_.fetch_or(kForced, std::memory_order_relaxed); }

  // Starts a user loop: `fn` every `interval_secs` (first run one interval from now) on its own
  // thread, stopped with the services. Only inside managed_session.
  void loop(double interval_secs, std::function<void()> fn, std::string name = "user_loop");

  // Summaries computed on the training thread. No-ops on non-chiefs and when summaries are off.
  void summary_computed(const tensorboard::Summary& summary, int64_t step);
  void add_scalar(std::string_view tag, double value, int64_t step);
  void add_histogram(std::string_view tag, std::span<const float> values, int64_t step);
  void add_text(std::string_view tag, std::string_view text, int64_t step);  // EventsWriter's

  Coordinator& coord() { return coord_; }
  const SupervisorOptions& options() const { return options_; }
  bool is_chief() const { return options_.is_chief; }
  // The checkpoint manager (chief only; null on non-chiefs, which never write checkpoints).
  CheckpointManager* checkpoint_manager() { return manager_.get(); }
  // The step restored from, or nullopt when the session initialised from scratch.
  std::optional<int64_t> restored_step() const { return restored_step_; }
  // The events file of the current session (chief with summaries on), else empty.
  std::filesystem::path events_file() const;
  // Saves so far in this process, by the checkpoint service, requests and the final save.
  int64_t checkpoints_saved() const;

  // A non-chief that outlived its chief (worker/distributed: the chief was lost and its replacement
  // never came): takes the logdir's writer lock when no live process holds it and commits
  // `state` as a checkpoint, synchronously, unless the logdir already holds one at this step or
  // later. Returns the file written, or nullopt when the lock is held (the chief is alive, or
  // another survivor got there first) or nothing newer was needed. The lock is kept until the
  // Supervisor is destroyed. Training thread only; throws on I/O errors; FailedPrecondition on
  // the chief (whose final checkpoint is managed_session's).
  std::optional<std::filesystem::path> commit_checkpoint_as_successor(TrainingState& state);

  // Chief promotion (worker/distributed/README.md, "Chief promotion"): a non-chief whose
  // data-parallel group lost its chief takes over the chief's writes, mid-session, on the
  // training thread, between steps. In order: takes the logdir's writer lock, retrying until
  // `lock_wait` passes (the lost chief's flock goes with its process, however it died); removes
  // the temp files a write cut short left behind (a chief killed mid-checkpoint); reads the
  // checkpoint state (the latest committed checkpoint stays the restart point, and the final
  // checkpoint is skipped when it is at the current step already); opens a NEW events file whose
  // SessionLog START at the current step makes TensorBoard drop whatever the lost chief logged
  // at later steps; starts the checkpoint, summary and step-counter services. Afterwards
  // is_chief() is true and the session ends as a chief's (final checkpoint). The lost chief's
  // events file is left as it was: exactly one process writes events at any time.
  // Throws FailedPrecondition outside managed_session or on a chief; Aborted when the lock is
  // still held after `lock_wait` by a writer that keeps renewing its lease (never two writers in
  // one logdir; a partitioned old chief that cannot renew is taken over once its lease runs out
  // and stops with LeaseLost when it comes back); I/O errors as they come.
  void promote_to_chief(TrainingState& state, std::chrono::milliseconds lock_wait);

 private:
  static constexpr int kPeriodic = 1;
  static constexpr int kForced = 2;

  void take_due_checkpoint(int64_t step);
  void prepare_chief(TrainingState& state);
  void prepare_non_chief(TrainingState& state);
  void check_ready(const TrainingState& state, std::string_view how);
  void start_services(TrainingState& state);
  void finish_session(TrainingState& state, bool clean_end);
  bool save_now(AsyncCheckpointer::Mode mode);

  SupervisorOptions options_;
  Coordinator coord_;
  std::unique_ptr<CheckpointManager> manager_;
  std::unique_ptr<AsyncCheckpointer> checkpointer_;
  std::unique_ptr<EventsWriter> events_ GUARDED_BY(events_mu_);  // open during a chief session
  mutable Mutex events_mu_;         // guards events_ (the pointer; the writer locks itself)
  TrainingState* state_ = nullptr;  // during managed_session only
  std::atomic<int> checkpoint_due_{0};
  std::atomic<int64_t> last_saved_step_{-1};
  std::optional<int64_t> restored_step_;
  std::atomic<bool> in_session_{false};
  std::exception_ptr final_checkpoint_error_;
  // The step of the checkpoint the session started from (restored, or the latest one a promoted
  // chief found); -1: none. Training thread only.
  int64_t session_start_checkpoint_ = -1;
  // The writer lock (chief, promoted chief, successor): released by the destructor. Its loss
  // requests a stop with LeaseLost. Set on the training thread only.
  std::unique_ptr<LogdirLease> lease_;
  LeaseOptions lease_options() const;
  LogdirLease::LostCallback on_lease_lost();
  void make_manager();            // manager_ for a lock holder, fenced by lease_
  std::function<void()> fence();  // throws LeaseLost once the lock is lost
  int sessions_started_ = 0;      // training thread only
};

}  // namespace longhaul::supervisor
