// The worker's configuration: a YAML file plus `--set key.sub=value` overrides, validated
// strictly. Every unknown key (with a "did you mean" when one is close), every value of the
// wrong type or out of range is an error naming the key and where it came from (the file or
// --set); all such errors are reported together in one InvalidArgument.
//
// The schema, with defaults, is documented in examples/worker-tiny.yaml. Sections: model, data,
// training, checkpoint, summaries, log, eval, supervisor, cuda, and the top-level keys logdir,
// device, metrics_port, grace_period_secs. No file at all gives the embedded default: the `tiny`
// preset trained on the demo corpus compiled into the binary.
//
// Thread-safety: plain values; load_config is reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace longhaul::trainer {

struct ModelConfigSection {
  std::string preset = "tiny";  // a GPT-2 preset; the fields below override it when set
  std::optional<int> n_layer, n_head, n_embd, context_length, vocab_size;
};

struct DataConfigSection {
  std::string train;  // glob of token shards; empty = the embedded demo corpus
  std::string val;    // glob of token shards; empty = none (or the embedded validation split)
  bool shuffle = true;
};

struct TrainingConfigSection {
  int64_t batch_size = 8;          // B, sequences per micro-batch
  int64_t seq_len = 64;            // T, tokens per sequence (<= context_length)
  int64_t total_batch_tokens = 0;  // tokens per optimizer step; 0 = B*T*world_size
  int64_t max_steps = 2000;        // optimizer steps; training ends (exit 0) after them
  double learning_rate = 3e-3;     // peak LR
  double min_lr_ratio = 0.1;       // cosine decays to learning_rate * min_lr_ratio
  int64_t warmup_steps = 20;       // linear warmup
  double weight_decay = 0.1;       // AdamW decoupled decay (2-D weights only)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
  uint64_t seed = 1337;    // weights init, data order
  // The numerical watchdog (watchdog.h): what a step with a non-finite loss or gradient norm, or
  // a loss spike, does: "stop" (exit 5 before the step is applied or checkpointed) or
  // "skip_step" (drop the update, count it, go on).
  std::string on_nonfinite = "stop";
  double loss_spike_mads = 10;           // spike: loss > median + k * robust deviation; 0 = off
  int64_t loss_spike_window = 100;       // accepted losses the median is taken over
  int64_t loss_spike_after_steps = 100;  // no spike detection before this step
  int64_t max_consecutive_skips = 10;    // skip_step: more bad steps in a row stop the run
};

struct CheckpointConfigSection {
  // Checkpoint service interval; 0 disables it. The worker's default is 60 s, deliberately not
  // SupervisorOptions' 600 (TensorFlow's): a crashed or preempted run redoes at most a minute.
  double save_model_secs = 60;
  int64_t save_model_steps = 0;  // also checkpoint every N steps; 0 disables
  int max_to_keep = 5;           // 0 keeps all
  double keep_checkpoint_every_n_hours = 10000;
  std::string init_from;  // pre-trained safetensors file (used only without a checkpoint)
  std::map<std::string, std::string> init_name_map;  // name in init_from -> our parameter name
};

struct SummariesConfigSection {
  // Summary service / global_step/sec interval; 0 disables. 30 s, not SupervisorOptions' 120.
  double save_summaries_secs = 30;
  int64_t every_steps = 10;  // training scalars every N steps; 0 disables events
};

struct LogConfigSection {
  int64_t every_steps = 10;  // progress line every N steps
};

struct EvalConfigSection {
  int64_t every_steps = 50;    // validation loss every N steps (and at the end); 0 disables
  int64_t batches = 20;        // validation batches per evaluation; 0 = the whole split
  int64_t sample_tokens = 64;  // the chief samples this many tokens at each evaluation; 0: none
  std::string sample_prompt;   // the samples' prompt; empty: <|endoftext|> (gpt2) or a newline
};

struct SupervisorConfigSection {
  double recovery_wait_secs = 30;
  double max_wait_secs = 7200;
  double stop_grace_secs = 120;
  // Data-parallel replicas, when a peer is lost (its process died, hung past the collective
  // timeout, or left on a SIGTERM): "regroup" (the default) keeps the survivors' processes and
  // state, waits for a replacement of the lost rank and hands it the state in memory
  // (worker/distributed/README.md, "Recovery in place"); "exit" ends every survivor with 138 and
  // the whole group restarts from the latest checkpoint.
  std::string on_peer_loss = "regroup";
  // regroup: how long the survivors wait for the replacement before they commit a final
  // checkpoint (the chief) and exit 138, so that a group restart still makes progress.
  double regroup_timeout_secs = 300;
  // The chief's writer lock on the logdir is a lease renewed every lock_lease_secs / 6: a chief
  // that has not renewed it for this long (frozen, or cut off by a partition while the shared
  // filesystem keeps its flock) is taken over by the next chief, and stops with exit 140 without
  // committing anything more (supervisor/logdir_lease.h). 0: never taken over.
  double lock_lease_secs = 30;
};

struct CudaConfigSection {
  // Before training on a GPU (device auto or cuda), check every kernel the model uses against
  // the reference on the real device, fall back per kernel family, and refuse a GPU that still
  // computes wrong numbers (worker/selfcheck). Off: trust the GPU unchecked.
  bool self_check = true;
};

struct WorkerConfig {
  std::filesystem::path source;  // the config file, or empty for the embedded default
  ModelConfigSection model;
  DataConfigSection data;
  TrainingConfigSection training;
  CheckpointConfigSection checkpoint;
  SummariesConfigSection summaries;
  LogConfigSection log;
  EvalConfigSection eval;
  SupervisorConfigSection supervisor;
  CudaConfigSection cuda;
  std::string logdir;             // empty: --logdir, $LONGHAUL_LOGDIR or runs/<preset>
  std::string device = "auto";    // auto | cpu | cuda
  int metrics_port = 0;           // Prometheus exposer port; 0 disables
  double grace_period_secs = 25;  // SIGTERM -> final checkpoint -> exit within this
};

// Loads `path` (empty: defaults only) and applies `overrides` ("key.sub=value", YAML scalar or
// flow syntax for the value). Throws NotFound/PermissionDenied naming a missing or unreadable
// file, InvalidArgument naming the file and line of garbled YAML, and InvalidArgument listing
// every invalid key or value.
WorkerConfig load_config(const std::filesystem::path& path,
                         const std::vector<std::string>& overrides = {});

// Every key the schema knows, dotted ("training.batch_size"), for help and suggestions.
std::vector<std::string> config_keys();

// The config rendered back as YAML (all keys, effective values), for logs and `inspect`.
std::string to_yaml(const WorkerConfig& config);

}  // namespace longhaul::trainer
