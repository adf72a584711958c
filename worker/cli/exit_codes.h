// Exit codes of longhaul-worker. The operator's restart policy classifies pods by them (1-127
// permanent, 128-255 retryable by default), so they are part of the interface:
//
//   0    finished: max_steps reached (final checkpoint committed), or eval/inspect/prepare-data/
//        sample/export succeeded
//   1    other permanent error (unwritable logdir, metrics port busy, internal error)
//   2    bad usage or bad config: unknown flag, missing/garbled config file, unknown key, bad
//        value (the message names the key and the file)
//   3    bad data: no file matches a glob, wrong shard magic/version, truncated shard, token id
//        outside the vocabulary, too little data for one batch
//   4    incompatible or corrupt checkpoint: a checkpoint of another model shape (the message
//        names the first mismatched tensor), a garbled checkpoint given to eval/sample/export, an
//        unusable checkpoint.init_from file
//   5    numerical fault: a step had a non-finite loss or gradient norm, or a loss spike, and
//        training.on_nonfinite is stop (or skip_step skipped more than
//        training.max_consecutive_skips steps in a row); the step was not applied and the latest
//        checkpoint is the last good state
//   129  stopped by SIGHUP after the final checkpoint was committed
//   130  stopped by SIGINT (Ctrl-C) after the final checkpoint was committed
//   138  aborted, nothing new committed: a peer was lost or a collective failed (retry the whole
//        group), the grace period after a signal ran out, a second signal arrived while
//        stopping, or the final checkpoint could not be written (retry)
//   140  the chief lost the logdir's writer lock: it stopped renewing its lease for
//        supervisor.lock_lease_secs (frozen, cut off by a partition) and a newer chief took the
//        logdir over; it committed nothing after the loss (retryable: a restarted replica joins
//        the newer chief's run)
//   143  stopped by SIGTERM (preemption) after the final checkpoint was committed
//   144  the logdir is in use: another process holds its writer lock and renewed its lease while
//        this one looked (the message names its host and pid). Nothing was written. Retryable:
//        on a cluster it is the chief of a group being replaced, which exits within seconds of
//        losing its peers (or goes stale and is taken over after supervisor.lock_lease_secs);
//        when two runs name one logdir by mistake, stop one or give it another --logdir
//
// A corrupt or truncated LATEST checkpoint is not an error: training falls back to the previous
// valid one with a WARNING naming the file.
#pragma once

#include <exception>

namespace longhaul::cli {

inline constexpr int kExitFinished = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitBadData = 3;
inline constexpr int kExitBadCheckpoint = 4;
inline constexpr int kExitNumerical = 5;
inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitAborted = 138;
inline constexpr int kExitLeaseLost = 140;
inline constexpr int kExitTerminated = 143;
inline constexpr int kExitLogdirBusy = 144;  // 128 + SIGSTKFLT, a signal nothing sends

// Logs the error (one ERROR line with its kind and message) and returns its exit code.
int report_error(std::exception_ptr error);

}  // namespace longhaul::cli
