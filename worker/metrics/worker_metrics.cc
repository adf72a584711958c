// WorkerMetrics: the worker's Prometheus registry and exposer. See worker_metrics.h.
#include "longhaul/metrics/worker_metrics.h"

#include <chrono>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "longhaul/base/error.h"
#include "longhaul/base/http_server.h"

namespace longhaul::worker_metrics {
namespace {

using prometheus::Labels;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

prometheus::Gauge* gauge(prometheus::Registry& r, const Labels& constant, const std::string& name,
                         const std::string& help, const Labels& labels = {}) {
  return &prometheus::BuildGauge().Name(name).Help(help).Labels(constant).Register(r).Add(labels);
}

prometheus::Counter* counter(prometheus::Registry& r, const Labels& constant,
                             const std::string& name, const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Labels(constant).Register(r).Add({});
}

prometheus::Histogram* histogram(prometheus::Registry& r, const Labels& constant,
                                 const std::string& name, const std::string& help,
                                 prometheus::Histogram::BucketBoundaries buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Labels(constant).Register(r).Add(
      {}, std::move(buckets));
}

}  // namespace

WorkerMetrics::WorkerMetrics(int rank, bool is_chief, const std::string& version,
                             const std::string& backend)
    : registry_(std::make_shared<prometheus::Registry>()), version_(version), backend_(backend) {
  auto& r = *registry_;
  const Labels c{{"rank", std::to_string(rank)}};
  const prometheus::Histogram::BucketBoundaries step_buckets{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  const prometheus::Histogram::BucketBoundaries ckpt_buckets{
      0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  global_step_ = gauge(r, c, "longhaul_train_global_step", "Optimizer steps taken so far.");
  last_step_timestamp_ =
      gauge(r, c, "longhaul_train_last_step_timestamp_seconds",
            "Unix time the global step last advanced in this process (0 before its first step).");
  max_steps_ = gauge(r, c, "longhaul_train_max_steps",
                     "The step at which training ends (training.max_steps).");
  steps_total_ =
      counter(r, c, "longhaul_train_steps_total", "Optimizer steps taken by this process.");
  tokens_total_ =
      counter(r, c, "longhaul_train_tokens_total", "Training tokens processed by this process.");
  step_duration_ = histogram(r, c, "longhaul_train_step_duration_seconds",
                             "Wall time of one optimizer step.", step_buckets);
  loss_ = gauge(r, c, "longhaul_train_loss", "Training loss of the last step.");
  learning_rate_ = gauge(r, c, "longhaul_train_learning_rate", "Learning rate of the last step.");
  grad_norm_ = gauge(r, c, "longhaul_train_grad_norm",
                     "Global gradient norm of the last step, before clipping.");
  tokens_per_second_ =
      gauge(r, c, "longhaul_train_tokens_per_second", "Training throughput of the last step.");
  ckpt_last_step_ = gauge(r, c, "longhaul_checkpoint_last_step", "Step of the last checkpoint.");
  ckpt_last_timestamp_ = gauge(r, c, "longhaul_checkpoint_last_timestamp_seconds",
                               "Unix time the last checkpoint was committed.");
  ckpt_last_bytes_ = gauge(r, c, "longhaul_checkpoint_last_bytes", "Size of the last checkpoint.");
  ckpt_duration_ =
      histogram(r, c, "longhaul_checkpoint_duration_seconds",
                "Time to write and commit one checkpoint (background thread).", ckpt_buckets);
  ckpt_stall_ = histogram(r, c, "longhaul_checkpoint_stall_seconds",
                          "Time the training loop was blocked per checkpoint.", ckpt_buckets);
  ckpt_written_bytes_ = counter(r, c, "longhaul_checkpoint_written_bytes_total",
                                "Checkpoint bytes written by this process.");
  ckpt_saves_ =
      counter(r, c, "longhaul_checkpoint_saves_total", "Checkpoints saved by this process.");
  ckpt_restores_ =
      counter(r, c, "longhaul_checkpoint_restores_total", "Checkpoints restored by this process.");
  is_chief_ = gauge(r, c, "longhaul_worker_is_chief", "1 on the chief replica, else 0.");
  start_time_ =
      gauge(r, c, "longhaul_worker_start_time_seconds", "Unix time this worker process started.");
  skipped_steps_ = counter(r, c, "longhaul_train_skipped_steps_total",
                           "Steps the numerical watchdog skipped (non-finite loss or gradient "
                           "norm, or a loss spike, with training.on_nonfinite: skip_step).");
  regroups_ = counter(r, c, "longhaul_worker_regroups_total",
                      "Lost peers recovered in place (supervisor.on_peer_loss: regroup).");
  regroup_duration_ = histogram(
      r, c, "longhaul_worker_regroup_duration_seconds",
      "From a failed collective to the group whole again with the state shared (includes "
      "waiting for the replacement).",
      prometheus::Histogram::BucketBoundaries{0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800});
  build_info_family_ = &prometheus::BuildGauge()
                            .Name("longhaul_worker_build_info")
                            .Help("Build of the worker and the device it trains on (value 1).")
                            .Labels(c)
                            .Register(r);
  kernel_labels_ = {{"attention", ""}, {"matmul_epilogues", ""}, {"self_check", ""}};
  Labels labels{{"version", version}, {"backend", backend}};
  labels.insert(kernel_labels_.begin(), kernel_labels_.end());
  build_info_ = &build_info_family_->Add(labels);
  is_chief_->Set(is_chief ? 1 : 0);
  start_time_->Set(unix_now());
  build_info_->Set(1);
}

void WorkerMetrics::replace_build_info() {
  build_info_family_->Remove(build_info_);
  Labels labels{{"version", version_}, {"backend", backend_}};
  labels.insert(kernel_labels_.begin(), kernel_labels_.end());
  build_info_ = &build_info_family_->Add(labels);
  build_info_->Set(1);
}

void WorkerMetrics::set_backend(const std::string& backend) {
  MutexLock lock(build_info_mu_);
  if (backend == backend_) return;
  backend_ = backend;
  replace_build_info();
}

void WorkerMetrics::set_kernel_choices(const std::map<std::string, std::string>& choices) {
  MutexLock lock(build_info_mu_);
  bool changed = false;
  for (const auto& [key, value] : choices) {
    auto it = kernel_labels_.find(key);
    if (it == kernel_labels_.end() || it->second == value) continue;
    it->second = value;
    changed = true;
  }
  if (changed) replace_build_info();
}

// server_ is declared after registry_, so it is stopped and joined before the registry goes.
WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::serve(int port) {
  // Our own server, not prometheus-cpp's Exposer: civetweb's fixed thread stack is smaller than
  // cuBLASLt's static TLS, so its threads cannot start in a worker built with CUDA.
  server_ = std::make_unique<http::Server>(
      "Prometheus metrics", "0.0.0.0", port,
      [this](std::string_view method, std::string_view path) {
        if (path != "/metrics") return http::Response{404, "text/plain", "try /metrics\n"};
        if (method != "GET") return http::Response{405, "text/plain", "GET only\n"};
        return http::Response{200, "text/plain; version=0.0.4; charset=utf-8", text()};
      });
  try {
    server_->start();
  } catch (const Error& e) {
    server_.reset();
    throw Unavailable(std::string(e.what()) + " (--metrics-port; 0 disables the exposer)");
  }
}

int WorkerMetrics::port() const { return server_ ? server_->port() : 0; }

void WorkerMetrics::on_step(int64_t step, double loss, double learning_rate, double grad_norm,
                            int64_t tokens, double seconds) {
  global_step_->Set(static_cast<double>(step));
  last_step_timestamp_->Set(unix_now());
  steps_total_->Increment();
  tokens_total_->Increment(static_cast<double>(tokens));
  step_duration_->Observe(seconds);
  loss_->Set(loss);
  learning_rate_->Set(learning_rate);
  grad_norm_->Set(grad_norm);
  if (seconds > 0) tokens_per_second_->Set(static_cast<double>(tokens) / seconds);
}

void WorkerMetrics::on_skipped_step(int64_t step) {
  global_step_->Set(static_cast<double>(step));
  last_step_timestamp_->Set(unix_now());
  skipped_steps_->Increment();
}

void WorkerMetrics::set_global_step(int64_t step) { global_step_->Set(static_cast<double>(step)); }

void WorkerMetrics::on_regrouped(int64_t step, double seconds) {
  global_step_->Set(static_cast<double>(step));
  regroups_->Increment();
  regroup_duration_->Observe(seconds);
}

void WorkerMetrics::set_max_steps(int64_t max_steps) {
  max_steps_->Set(static_cast<double>(max_steps));
}

void WorkerMetrics::on_saved(const supervisor::CheckpointStats& stats) {
  ckpt_last_step_->Set(static_cast<double>(stats.step));
  ckpt_last_timestamp_->Set(stats.wall_time);
  ckpt_last_bytes_->Set(static_cast<double>(stats.bytes));
  ckpt_duration_->Observe(stats.write_seconds);
  ckpt_stall_->Observe(stats.stall_seconds);
  ckpt_written_bytes_->Increment(static_cast<double>(stats.bytes));
  ckpt_saves_->Increment();
}

void WorkerMetrics::on_restored(const supervisor::RestoredCheckpoint& restored) {
  ckpt_restores_->Increment();
  global_step_->Set(static_cast<double>(restored.step));
  // A restarted process already has a latest checkpoint: show it, so "time since the last
  // checkpoint" does not read as fifty years until the first save of this process.
  ckpt_last_step_->Set(static_cast<double>(restored.step));
  ckpt_last_timestamp_->Set(restored.wall_time);
  ckpt_last_bytes_->Set(static_cast<double>(restored.bytes));
}

void WorkerMetrics::on_chief_role_taken(const supervisor::RestoredCheckpoint& latest) {
  ckpt_last_step_->Set(static_cast<double>(latest.step));
  ckpt_last_timestamp_->Set(latest.wall_time);
  ckpt_last_bytes_->Set(static_cast<double>(latest.bytes));
}

void WorkerMetrics::set_chief(bool is_chief) { is_chief_->Set(is_chief ? 1 : 0); }

std::string WorkerMetrics::text() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace longhaul::worker_metrics
