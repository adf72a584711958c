// run_training: the whole `longhaul-worker train` flow on one replica — build the model and the
// data from a WorkerConfig, run it under a Supervisor (restore or init / pre-trained init_fn,
// checkpoints, events, SIGTERM handling), print progress, write scalars, evaluate.
//
// Progress lines count steps done ("step 10/300" after the 10th step). TensorBoard scalars
// loss, learning_rate, grad_norm, tokens_per_sec are logged at the step's 0-based index (the
// global step before it ran, TensorFlow's convention; see run.cc), val_loss at the global step
// whose weights it measured, global_step/sec by the supervisor's step counter.
//
// Errors are typed so the CLI can map them to exit codes: InvalidArgument from the config
// (exit 2), DataError (3), NumericalError (5, watchdog.h), CheckpointError and the supervisor's
// FailedPrecondition/DataLoss on restore (4), Aborted (138), anything else (1). A
// SIGTERM/SIGINT/SIGHUP ends the run normally after the final checkpoint is committed;
// RunResult::signal says which signal it was. Inside a step the signal is checked between
// micro-batches: a step whose rest would not fit in half the grace period left is abandoned and
// the last completed step is committed (Trainer::train_step). Evaluation stops between batches.
// Past grace_period_secs after the signal the process exits 138 wherever it is (SignalHandler).
//
// Thread-safety: call from one thread; callbacks run on the training thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <vector>

#include "longhaul/supervisor/async_checkpointer.h"
#include "longhaul/supervisor/signals.h"
#include "longhaul/supervisor/supervisor.h"
#include "longhaul/trainer/config.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::trainer {

struct RunOptions {
  WorkerConfig config;
  std::filesystem::path logdir;  // required
  int rank = 0;
  int world_size = 1;
  // Called after every optimizer step (metrics).
  std::function<void(const StepStats&)> on_step;
  // Called once the model exists, before the session: model.device_name() is where it trains
  // ("cuda", or "cpu" also when `device: auto` fell back).
  std::function<void(const model::LanguageModel&)> on_model;
  // Called once the device is chosen, with the plan (device, kernels, self-check report): the
  // metrics' build_info labels. The run also logs it, writes it as the text summary "device" at
  // the session's first step into the events file, and into every checkpoint's metadata
  // ("device": the summary line, "kernels": the labels as JSON).
  std::function<void(const selfcheck::DevicePlan&)> on_device_plan;
  // Called once the session is ready (restored or initialised) with the starting step.
  std::function<void(int64_t step, bool restored)> on_session_start;
  // Observers of checkpoint saves/restores (metrics); not owned.
  std::vector<supervisor::CheckpointListener*> checkpoint_listeners;
  std::ostream* progress = nullptr;  // progress lines; null = stdout
  // The process's signal handler, installed by the caller before start-up (so that a signal
  // while loading data or at the rendezvous is honoured); attached to the supervisor for the
  // session. Null: run_training installs its own when handle_signals is set (SIGTERM, SIGINT,
  // SIGHUP; exit deadline grace_period_secs from the first signal).
  supervisor::SignalHandler* signals = nullptr;
  bool handle_signals = true;

  // Data-parallel replicas (set from longhaul/distributed/data_parallel.h; empty for one replica).
  // All are called on the training thread, by every replica at the same points.
  // First thing in the session, after restore/initialisation: make this replica's whole state
  // the chief's (parameters, moments, step, data position).
  std::function<void(supervisor::TrainingState&)> sync_state;
  // Right before the forward/backward of each step's last micro-batch: start averaging the
  // gradients as the backward pass finishes them (overlapped all-reduce); may be empty.
  std::function<void(model::LanguageModel&)> start_reducing_gradients;
  // After each step's backward pass, before the gradient norm: average the gradients (finish
  // what start_reducing_gradients started).
  std::function<void(model::LanguageModel&)> reduce_gradients;
  // At the top of every step with this replica's stop request; returns true when any replica
  // stops, so that all leave the loop at the same step.
  std::function<bool(bool local_stop)> agree_stop;
  // After each step, with this replica's loss; returns the mean over replicas, which is what the
  // progress line, the `loss` scalar and the metrics show.
  std::function<double(double local_loss)> average_loss;
  // A replacement joining a running group: the session takes its state from the running
  // replicas through this (SupervisorOptions::state_from_peers) instead of a checkpoint, and
  // sync_state is not called.
  std::function<void(supervisor::TrainingState&)> receive_state;
  // Recovery in place: called on the training thread when a collective fails (Aborted) at a step
  // boundary or inside a step (which the Trainer abandons, keeping the last completed step).
  // Returns true once the group is whole again and this replica holds the state the group
  // continues from; false when it could not be re-formed in time (the loop ends, the chief
  // commits a final checkpoint, RunResult::regroup_failed is set). Throws Cancelled when a stop
  // was requested meanwhile, Aborted when a peer was lost again (it is called again). Empty: a
  // failed collective ends the run with Aborted (exit 138).
  std::function<bool(supervisor::TrainingState&)> regroup;
  // Whether this replica holds the chief role (checkpoints, events, samples): asked before the
  // session and after every regroup. The role is not the rank: when the chief is lost, the lowest
  // surviving rank takes it (dist::DataParallel::is_chief), and the run promotes its Supervisor
  // there (Supervisor::promote_to_chief). Empty: rank 0 is the chief.
  std::function<bool()> chief_role;
};

struct RunResult {
  int64_t final_step = 0;
  std::optional<int64_t> restored_step;  // nullopt: started from scratch (or pre-trained)
  int signal = 0;                        // SIGTERM/SIGINT that stopped it, or 0
  std::optional<double> last_loss;
  std::optional<double> last_val_loss;
  int64_t skipped_steps = 0;    // steps the numerical watchdog skipped (training.on_nonfinite)
  int64_t regroups = 0;         // lost peers recovered from in place
  bool regroup_failed = false;  // a lost peer's replacement did not come in time
};

RunResult run_training(const RunOptions& options);

// The train/val datasets the config names (globs, or the embedded demo corpus). Throws
// DataError naming the file or glob, Cancelled when `stop_requested` says true between two
// shards.
std::shared_ptr<const data::TokenDataset> open_train_dataset(
    const WorkerConfig& config, const std::function<bool()>& stop_requested = {});
std::shared_ptr<const data::TokenDataset> open_val_dataset(
    const WorkerConfig& config, const std::function<bool()>& stop_requested = {});

}  // namespace longhaul::trainer
