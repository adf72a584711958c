// The evaluator replica (TF_CONFIG task type "evaluator"), as TensorFlow's evaluator jobs: it
// does not join training. It follows the logdir the chief writes, evaluates every new
// checkpoint (model.ckpt-<step>.safetensors) on the validation data, and writes the mean
// validation loss as scalar `val_loss` at the checkpoint's step into its own events files
// under `<logdir>/eval/` (TensorBoard shows it as the run "eval").
//
// Which checkpoints: those committed in the logdir that were not evaluated yet, oldest first;
// steps already recorded in `<logdir>/eval/` events files are skipped, so a restarted evaluator
// does not repeat them. A checkpoint removed by retention (max_to_keep) before it could be read
// is skipped with a warning, as are corrupt ones.
//
// When it ends: after evaluating the step named by the chief's `<logdir>/training.done` marker
// (written when training reached max_steps, see training_done.h), or when `should_stop`
// returns true (SIGTERM), or OutOfRange never. It polls every poll_secs.
//
// Thread-safety: run_evaluator is called from one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>
#include <utility>
#include <vector>

#include "longhaul/trainer/config.h"

namespace longhaul::dist {

struct EvaluatorOptions {
  trainer::WorkerConfig config;  // model shape, batch_size/seq_len, data.val, eval.batches
  std::filesystem::path logdir;
  double poll_secs = 30;              // how often the logdir is checked
  std::function<bool()> should_stop;  // e.g. a SIGTERM was received
  std::ostream* progress = nullptr;   // one line per evaluation; null = stdout
};

struct EvaluatorResult {
  std::vector<std::pair<int64_t, double>> evaluated;  // (step, val_loss) in this run
  bool training_done = false;  // ended because the final checkpoint was evaluated
};

// Throws DataError (no or bad validation data), CheckpointError (a checkpoint of another
// model shape), InvalidArgument (config).
EvaluatorResult run_evaluator(const EvaluatorOptions& options);

}  // namespace longhaul::dist
