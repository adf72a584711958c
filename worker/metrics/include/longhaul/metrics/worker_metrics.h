// Prometheus metrics of one worker replica: one registry and (optionally) one exposer made at
// start-up, families built once, children cached. Every metric carries the constant label
// `rank`. Names are the project's fixed set (dashboards depend on them):
//   longhaul_train_global_step, longhaul_train_max_steps (gauges), longhaul_train_steps_total,
//   longhaul_train_tokens_total, longhaul_train_step_duration_seconds (histogram),
//   longhaul_train_loss, longhaul_train_learning_rate, longhaul_train_grad_norm,
//   longhaul_train_tokens_per_second, longhaul_checkpoint_last_step,
//   longhaul_checkpoint_last_timestamp_seconds, longhaul_checkpoint_last_bytes (gauges),
//   longhaul_checkpoint_duration_seconds (histogram of write time),
//   longhaul_checkpoint_stall_seconds (histogram of training-loop blocking),
//   longhaul_checkpoint_written_bytes_total, longhaul_checkpoint_saves_total,
//   longhaul_checkpoint_restores_total, longhaul_train_skipped_steps_total (steps the numerical
//   watchdog dropped), longhaul_worker_is_chief, longhaul_worker_regroups_total and
//   longhaul_worker_regroup_duration_seconds (histogram: a lost peer recovered in place, from the
//   failed collective to the group whole again with the state shared; worker/distributed),
//   longhaul_worker_build_info{version,backend,attention,matmul_epilogues,self_check} = 1 (the
//   kernel choices of the start-up self-check, "" until known; see worker/selfcheck),
//   longhaul_worker_start_time_seconds (Unix time the process made its metrics, i.e. started: a
//   new value or a new series is a restart) and longhaul_train_last_step_timestamp_seconds (Unix
//   time the global step last advanced in this process, 0 before; the chart's stall and
//   restart-loop alerts read these two).
//
// WorkerMetrics is also a supervisor::CheckpointListener: give it to SupervisorOptions and the
// checkpoint_* metrics follow every save and restore.
//
// Thread-safety: all methods are thread-safe (prometheus-cpp metrics are atomic); on_saved runs
// on the checkpoint writer thread while on_step runs on the training thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "longhaul/base/mutex.h"
#include "longhaul/supervisor/async_checkpointer.h"

namespace longhaul::http {
class Server;
}
namespace prometheus {
class Registry;
class Gauge;
template <typename T>
class Family;
class Counter;
class Histogram;
}  // namespace prometheus

namespace longhaul::worker_metrics {

class WorkerMetrics : public supervisor::CheckpointListener {
 public:
  WorkerMetrics(int rank, bool is_chief, const std::string& version, const std::string& backend);
  ~WorkerMetrics() override;
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // Serves GET /metrics on 0.0.0.0:<port> until destruction. port 0 is not allowed here (the
  // caller skips serve() to disable the exposer). Throws Unavailable naming the port when it
  // cannot be bound.
  void serve(int port);
  // The port actually bound, or 0 when not serving.
  int port() const;

  // After one optimizer step.
  void on_step(int64_t step, double loss, double learning_rate, double grad_norm, int64_t tokens,
               double seconds);
  // A step the numerical watchdog skipped (its update dropped): the global step advances, the
  // loss/grad-norm gauges keep the last good step's values.
  void on_skipped_step(int64_t step);
  // training.max_steps: the step at which training ends (the operator's STEP column reads
  // longhaul_train_global_step over this).
  void set_max_steps(int64_t max_steps);
  // The session started at `step` (restored or initialised).
  void set_global_step(int64_t step);
  // A lost peer was recovered in place in `seconds`; training continues at `step`.
  void on_regrouped(int64_t step, double seconds);
  // The device the model actually trains on, once it exists (`device: auto` may have fallen
  // back to "cpu"): replaces build_info's backend label, so exactly one series remains.
  void set_backend(const std::string& backend) EXCLUDES(build_info_mu_);
  // The kernel choices made at start-up (labels attention, matmul_epilogues, self_check);
  // replaces the build_info series the same way. Unknown keys are ignored.
  void set_kernel_choices(const std::map<std::string, std::string>& choices)
      EXCLUDES(build_info_mu_);

  // supervisor::CheckpointListener
  void on_saved(const supervisor::CheckpointStats& stats) override;
  void on_restored(const supervisor::RestoredCheckpoint& restored) override;
  // The chief role moved here (data-parallel chief promotion): the last checkpoint gauges show
  // the logdir's latest checkpoint, as after a restore, without counting a restore.
  void on_chief_role_taken(const supervisor::RestoredCheckpoint& latest) override;
  // longhaul_worker_is_chief (the operator reads it to find the chief pod after a promotion).
  void set_chief(bool is_chief);

  // The Prometheus text exposition of every metric (what /metrics serves).
  std::string text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<http::Server> server_;  // serves text() on /metrics
  prometheus::Gauge* global_step_;
  prometheus::Gauge* last_step_timestamp_;
  prometheus::Gauge* max_steps_;
  prometheus::Counter* steps_total_;
  prometheus::Counter* tokens_total_;
  prometheus::Histogram* step_duration_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* learning_rate_;
  prometheus::Gauge* grad_norm_;
  prometheus::Gauge* tokens_per_second_;
  prometheus::Gauge* ckpt_last_step_;
  prometheus::Gauge* ckpt_last_timestamp_;
  prometheus::Gauge* ckpt_last_bytes_;
  prometheus::Histogram* ckpt_duration_;
  prometheus::Histogram* ckpt_stall_;
  prometheus::Counter* ckpt_written_bytes_;
  prometheus::Counter* ckpt_saves_;
  prometheus::Counter* ckpt_restores_;
  prometheus::Gauge* is_chief_;
  prometheus::Gauge* start_time_;
  std::string version_;
  prometheus::Counter* skipped_steps_;
  prometheus::Counter* regroups_;
  prometheus::Histogram* regroup_duration_;
  Mutex build_info_mu_;  // set_backend/set_kernel_choices may be called from any thread
  std::string backend_ GUARDED_BY(build_info_mu_);
  // attention, matmul_epilogues, self_check
  std::map<std::string, std::string> kernel_labels_ GUARDED_BY(build_info_mu_);
  void replace_build_info() REQUIRES(build_info_mu_);
  prometheus::Family<prometheus::Gauge>* build_info_family_;
  prometheus::Gauge* build_info_ GUARDED_BY(build_info_mu_);
};

}  // namespace longhaul::worker_metrics
