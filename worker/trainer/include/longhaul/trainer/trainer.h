// The trainer binds a LanguageModel, the data loaders and the supervisor: it is the worker's
// supervisor::TrainingState (what a checkpoint holds and how it is restored) and it runs the
// optimizer step (gradient accumulation, global-norm clipping, warmup + cosine LR, AdamW).
//
// Checkpoint contents (all F32, Hugging Face GPT-2 names so PyTorch/HF load the weights):
//   transformer.wte.weight ... transformer.ln_f.bias      the parameters
//   optimizer.exp_avg.<name>, optimizer.exp_avg_sq.<name> the AdamW moments
//   __metadata__: step, optimizer_step_count, data_position (DataLoader JSON), model_config
//   (JSON), seed, rng (the training RNG state; the CPU model draws no randomness after init,
//   so it is the seed), train_tokens (tokens consumed), format "pt", tokenizer ("bytes" or
//   "gpt2", when the data says; see sampling.h).
// restore() checks every tensor's name, dtype and shape (and the model config) first and throws
// FailedPrecondition naming the first mismatch; nothing is half-restored. Corrupt tensor data
// throws DataLoss naming the tensor and file. (The worker maps both to exit code 4.)
//
// Resume is exact: parameters, moments, the optimizer's step count, the LR schedule position
// (a function of the step) and the data position are all restored, so N uninterrupted steps
// and N/2 + stop + resume to N give bit-identical parameters on CPU.
//
// Thread-safety: everything on the training thread, except global_step() (atomic).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "longhaul/base/error.h"
#include "longhaul/data/data_loader.h"
#include "longhaul/model/config.h"
#include "longhaul/model/language_model.h"
#include "longhaul/model/lr_schedule.h"
#include "longhaul/selfcheck/device_plan.h"
#include "longhaul/supervisor/training_state.h"
#include "longhaul/trainer/config.h"
#include "longhaul/trainer/watchdog.h"

namespace longhaul::trainer {

// Bad training/validation data (wrong magic, truncated shard, token id out of range, too few
// tokens): the worker exits 3. Keeps the code of the underlying error.
class DataError : public Error {
 public:
  DataError(Code code, const std::string& message) : Error(code, message) {}
};

// A pre-trained file (checkpoint.init_from) or a checkpoint given to `eval` that cannot be used:
// the worker exits 4, as it does for FailedPrecondition/DataLoss from restore().
class CheckpointError : public Error {
 public:
  CheckpointError(Code code, const std::string& message) : Error(code, message) {}
};

// What selfcheck::make_model_on_device (device_plan.h, where the device is decided) needs from
// the config: `device` (auto | cpu | cuda), cuda.self_check, the micro-batch training.batch_size
// x training.seq_len, and for a replica of a data-parallel group (world_size > 1) no CPU fallback
// of its own: one replica on the CPU cannot join GPU replicas (Gloo vs NCCL all-reduce).
selfcheck::PlanOptions device_options(const WorkerConfig& config, int world_size = 1);

// The model shape the config asks for: the preset with the explicit fields applied, validated.
// Throws InvalidArgument naming the config key (and file) that is wrong.
model::GPT2Config model_config_for(const WorkerConfig& config);

struct StepStats {
  int64_t step = 0;  // global step after this optimizer step
  double loss = 0;   // mean over the accumulated micro-batches
  double learning_rate = 0;
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // tokens processed by this replica in this step
  double seconds = 0;    // wall time of the step
  // The numerical watchdog dropped this step's update (training.on_nonfinite: skip_step):
  // parameters and moments are unchanged, the global step still advanced.
  bool skipped = false;
  std::string skip_reason;    // why, when skipped
  int64_t skipped_total = 0;  // steps skipped in this process so far
};

class Trainer : public supervisor::TrainingState {
 public:
  // `train` must have been built with the config's batch_size/seq_len and this replica's
  // rank/world_size. `val` may be null. Throws InvalidArgument when total_batch_tokens is not a
  // multiple of B*T*world_size or seq_len exceeds the model's context length (naming the keys).
  Trainer(const WorkerConfig& config, std::unique_ptr<model::LanguageModel> model,
          std::unique_ptr<data::DataLoader> train, std::unique_ptr<data::EvalLoader> val,
          int world_size = 1);

  // supervisor::TrainingState
  std::vector<supervisor::TensorSpec> tensor_specs() const override { return specs_; }
  void initialize() override;
  void restore(const supervisor::TensorSource& checkpoint) override;
  void snapshot(supervisor::Snapshot& out) override;
  int64_t global_step() const override { return step_.load(std::memory_order_acquire); }

  // One optimizer step. Throws DataError when a batch holds a token id >= vocab_size, and
  // NumericalError (before anything is applied: parameters, moments and the step count stay as
  // they were) when the numerical watchdog rejects the step and training.on_nonfinite is stop.
  // Before each micro-batch but the last's backward (see set_stop_check) the step may be
  // abandoned: then the parameters, moments and step are untouched, the data loader is back
  // where the step started (a checkpoint taken now resumes exactly), and Cancelled is thrown.
  // A collective that fails inside the step (Aborted from the gradient hook or the loss reducer:
  // a lost peer) abandons it the same way and rethrows: the replica holds the state of its last
  // completed step.
  //
  // Test-only fault injection: with LONGHAUL_TEST_NAN_GRADIENT_AT_STEP=k in the environment
  // (read at construction), the gradients of global step k get a NaN before the all-reduce and
  // the norm, as a broken kernel or a bad batch would leave them.
  StepStats train_step();
  // Mean validation loss over the eval loader's batches; nullopt without validation data, or
  // when the stop check asks to stop between two eval batches.
  std::optional<double> evaluate();

  // Asked between micro-batches with an estimate of the seconds the step still needs (and
  // between eval batches with +inf): true abandons the step (or the evaluation). The worker
  // answers true when a stop was requested and the rest of the step would not fit in what is
  // left of the grace period.
  void set_stop_check(std::function<bool(double seconds_left_in_step)> check) {
    stop_check_ = std::move(check);
  }

  // Loads pre-trained weights (HF GPT-2 layout) from a safetensors file; name_map maps source
  // names to our parameter names. Throws CheckpointError naming the file and tensor.
  void load_pretrained(const supervisor::TensorSource& source,
                       const std::map<std::string, std::string>& name_map);

  // Called in train_step after the backward pass of the last micro-batch and before the
  // gradient norm: data-parallel replicas average the model's gradients there.
  void set_gradient_hook(std::function<void(model::LanguageModel&)> hook) {
    gradient_hook_ = std::move(hook);
  }
  // Called in train_step right before the forward/backward of the step's last micro-batch (the
  // earlier micro-batches' gradients are already accumulated): data-parallel replicas start
  // all-reducing there, overlapped with that backward pass; the gradient hook completes it.
  void set_last_backward_hook(std::function<void(model::LanguageModel&)> hook) {
    last_backward_hook_ = std::move(hook);
  }

  // Called in train_step with the mean loss of this replica's micro-batches, before the
  // watchdog: data-parallel replicas return the mean over replicas, so every replica judges the
  // same loss (and StepStats::loss is that mean).
  void set_loss_reducer(std::function<double(double)> reducer) {
    loss_reducer_ = std::move(reducer);
  }
  // Extra `__metadata__` entries of every checkpoint (e.g. the device and kernels the run uses).
  void set_checkpoint_metadata(const std::string& key, const std::string& value) {
    extra_metadata_[key] = value;
  }
  // The `numerics` metadata of the checkpoint last restored (where its bits were computed: BLAS
  // core and threads, or GPU and CUDA versions), "" when none or not recorded.
  const std::string& restored_numerics() const { return restored_numerics_; }

  model::LanguageModel& model() { return *model_; }
  int64_t accumulation_steps() const { return accumulation_steps_; }
  int64_t tokens_per_step() const { return accumulation_steps_ * batch_tokens_; }
  double learning_rate_at(int64_t step) const;
  const WorkerConfig& config() const { return config_; }

  // Compares the checkpoint's tensors with ours; "" when compatible, else a message naming the
  // first mismatched tensor. Used by restore() and by `inspect`.
  std::string incompatibility(const supervisor::TensorSource& checkpoint) const;

 private:
  // train_step's pieces. accumulate_gradients runs every micro-batch's forward/backward (and the
  // gradient all-reduce of data-parallel replicas) and returns the step's loss; a stop request
  // (Cancelled) or a lost peer (Aborted) abandons the step with abandon_step. skip_step counts a
  // step the watchdog refused, or throws NumericalError when skipping is not allowed.
  double accumulate_gradients(std::chrono::steady_clock::time_point start);
  void check_stop_inside_step(int64_t micro, std::chrono::steady_clock::time_point start,
                              const std::string& step_start_position);
  void warn_once_if_a_step_takes_a_day(std::chrono::steady_clock::time_point start);
  void abandon_step(const std::string& step_start_position);
  void skip_step(int64_t step, const WatchdogVerdict& verdict);

  struct Slot {
    supervisor::TensorSpec spec;
    float* data;  // the model's memory (device memory on CUDA): moved with upload/snapshot
  };

  WorkerConfig config_;
  std::unique_ptr<model::LanguageModel> model_;
  std::unique_ptr<data::DataLoader> train_;
  std::unique_ptr<data::EvalLoader> val_;
  model::LearningRateSchedule schedule_;
  model::AdamWOptions adamw_;
  int64_t batch_tokens_ = 0;
  int64_t accumulation_steps_ = 1;
  std::vector<supervisor::TensorSpec> specs_;
  std::vector<Slot> slots_;  // parallel to specs_
  std::atomic<int64_t> step_{0};
  int64_t train_tokens_ = 0;
  bool initialized_ = false;
  std::vector<int32_t> inputs_, targets_;
  std::function<void(model::LanguageModel&)> gradient_hook_;
  std::function<void(model::LanguageModel&)> last_backward_hook_;
  std::function<double(double)> loss_reducer_;
  std::map<std::string, std::string> extra_metadata_;
  NumericalWatchdog watchdog_;
  int64_t skipped_steps_ = 0;
  int64_t consecutive_skips_ = 0;
  int64_t inject_nan_at_step_ = 0;  // LONGHAUL_TEST_NAN_GRADIENT_AT_STEP; 0: none
  std::function<bool(double)> stop_check_;
  std::string restored_numerics_;
  bool warned_step_time_ = false;  // the "a step takes more than a day" warning, once
};

// Adapts a safetensors TensorSource to the model's pre-trained reader (F32/F16/BF16 -> fp32).
std::unique_ptr<model::PretrainedTensorReader> pretrained_reader(
    const supervisor::TensorSource& source);

// The model shape a longhaul checkpoint's model_config metadata names, or nullopt when absent.
// Throws CheckpointError when it is garbled.
std::optional<model::GPT2Config> checkpoint_model_config(const supervisor::TensorSource& source);

// The JSON the checkpoint's model_config metadata holds.
std::string model_config_json(const model::GPT2Config& config);

}  // namespace longhaul::trainer
