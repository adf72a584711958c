// `longhaul-worker train`: config -> metrics -> run_training -> exit code.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/metrics/worker_metrics.h"
#include "longhaul/model/cuda/cuda_backend.h"
#include "longhaul/supervisor/signals.h"
#include "longhaul/supervisor/supervisor.h"
#include "longhaul/trainer/run.h"
#include "termination_message.h"

namespace longhaul::cli {
std::string version_string() {
  return std::string(LONGHAUL_VERSION) + (LONGHAUL_HAVE_CUDA ? " (cpu, cuda)" : " (cpu)");
}

namespace {

// The config and this replica's place in the group (TF_CONFIG, or --rank/--world-size, or
// LONGHAUL_RANK/LONGHAUL_WORLD_SIZE: distributed/cluster.h) into `run`; every problem here is a
// usage error (exit 2).
dist::ReplicaIdentity load_run_config(const TrainArgs& args, trainer::RunOptions& run) {
  try {
    run.config = trainer::load_config(args.config, args.sets);
    trainer::model_config_for(run.config);  // a bad model shape is a config error
    dist::ReplicaIdentity replica = dist::resolve_replica(
        dist::replica_environment(), dist::ExplicitReplica{args.rank, args.world_size});
    run.rank = replica.rank.value_or(0);
    run.world_size = replica.world_size;
    return replica;
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
}

// --logdir, else $LONGHAUL_LOGDIR, else the config's logdir, else runs/<preset>.
std::filesystem::path choose_logdir(const TrainArgs& args, const trainer::WorkerConfig& config) {
  if (!args.logdir.empty()) return args.logdir;
  if (const char* env = std::getenv("LONGHAUL_LOGDIR"); env != nullptr && *env) return env;
  if (!config.logdir.empty()) return config.logdir;
  return "runs/" + config.model.preset;
}

// build_info's backend before the model exists: the device this run asks for (on_model corrects
// it once the model exists: `device: auto` falls back to the CPU when the GPU fails at start).
std::string requested_backend(const trainer::WorkerConfig& config) {
  std::string why_not;
  const bool on_cuda = config.device == "cuda" ||
                       (config.device == "auto" && backend_cuda::cuda_available(&why_not));
  return on_cuda ? "cuda" : "cpu";
}

// Serves /metrics on `port` (0: not served) and feeds `metrics` from the run's callbacks.
void connect_metrics(worker_metrics::WorkerMetrics& metrics, int port, trainer::RunOptions& run) {
  if (port > 0) {
    metrics.serve(port);
    LH_LOG(INFO) << "serving Prometheus metrics" << kv("port", metrics.port());
  }
  metrics.set_max_steps(run.config.training.max_steps);
  run.checkpoint_listeners.push_back(&metrics);
  run.on_step = [&metrics](const trainer::StepStats& s) {
    if (s.skipped) {
      metrics.on_skipped_step(s.step);
    } else {
      metrics.on_step(s.step, s.loss, s.learning_rate, s.grad_norm, s.tokens, s.seconds);
    }
  };
  run.on_model = [&metrics](const model::LanguageModel& m) {
    metrics.set_backend(std::string(m.device_name()));
  };
  run.on_device_plan = [&metrics](const selfcheck::DevicePlan& plan) {
    metrics.set_kernel_choices(plan.labels());
  };
  run.on_session_start = [&metrics](int64_t step, bool) { metrics.set_global_step(step); };
}

// The progress this replica leaves in its termination message (termination_message.h), fed
// from the same callbacks as the metrics (connect_metrics runs first; its callbacks stay).
void connect_termination_message(TerminationMessage& message, trainer::RunOptions& run) {
  message.set_max_steps(run.config.training.max_steps);
  run.checkpoint_listeners.push_back(&message);
  run.on_step = [&message, inner = run.on_step](const trainer::StepStats& s) {
    if (inner) inner(s);
    message.on_step(s.step);
  };
  run.on_session_start = [&message, inner = run.on_session_start](int64_t step, bool restored) {
    if (inner) inner(step, restored);
    message.on_session_start(step);
  };
}

// Recovery in place, measured (worker_metrics.h): wraps the group's regroup, when it has one.
void measure_regroups(worker_metrics::WorkerMetrics& metrics, dist::DataParallel* dp,
                      trainer::RunOptions& run) {
  if (!run.regroup) return;
  run.regroup = [inner = run.regroup, &metrics, dp](supervisor::TrainingState& state) {
    const auto start = std::chrono::steady_clock::now();
    const bool ok = inner(state);
    if (ok) {
      metrics.set_chief(dp->is_chief());  // the operator finds the chief pod by this gauge
      metrics.on_regrouped(
          state.global_step(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return ok;
  };
}

// The exit code of a session that ended without an error: 128 + the signal that stopped it
// (its final checkpoint committed), else finished.
int exit_code_for(const trainer::RunResult& result, const trainer::RunOptions& run) {
  if (result.signal == SIGTERM) {
    LH_LOG(INFO) << "stopped by SIGTERM; final checkpoint committed"
                 << kv("step", result.final_step);
    return kExitTerminated;
  }
  if (result.signal == SIGINT) {
    LH_LOG(INFO) << "stopped by SIGINT; final checkpoint committed"
                 << kv("step", result.final_step);
    return kExitInterrupted;
  }
  if (result.signal != 0) {
    LH_LOG(INFO) << "stopped by " << strsignal(result.signal) << "; final checkpoint committed"
                 << kv("step", result.final_step);
    return 128 + result.signal;  // SIGHUP: 129
  }
  if (result.final_step < run.config.training.max_steps) {
    // The session ended early without a signal (e.g. OutOfRange): treat it as finished.
    LH_LOG(WARNING) << "training stopped before max_steps" << kv("step", result.final_step);
  }
  LH_LOG(INFO) << "training finished" << kv("step", result.final_step)
               << kv("logdir", run.logdir.string());
  return kExitFinished;
}

}  // namespace

int run_train(const TrainArgs& args) {
  // 1. Config, the replica's role, the logdir.
  trainer::RunOptions run;
  const dist::ReplicaIdentity replica = load_run_config(args, run);
  run.logdir = choose_logdir(args, run.config);
  if (replica.cluster.task_type == dist::TaskType::kEvaluator) {
    return run_evaluator_task(run.config, run.logdir);
  }
  if (!replica.rank) {
    LH_LOG(INFO) << "this is a ps task: all-reduce training needs no parameter server; exiting";
    return kExitFinished;
  }
  // Signals from here on: a SIGTERM while the data loads, the model is built or the replicas
  // meet is honoured, and the grace period runs from it (supervisor.h, SignalHandler).
  supervisor::SignalHandler signals({SIGTERM, SIGINT, SIGHUP}, run.config.grace_period_secs);
  run.signals = &signals;
  if (const char* attempt = std::getenv("LONGHAUL_RESTART_ATTEMPT")) {
    LH_LOG(INFO) << "restart attempt" << kv("attempt", attempt);
  }

  // 2. Metrics.
  // longhaul_worker_is_chief: a replica of a group says 1 only once the group agreed it holds
  // the chief role (a replacement rank 0 joins as a worker; see worker/distributed/README.md).
  worker_metrics::WorkerMetrics metrics(run.rank, run.world_size <= 1, LONGHAUL_VERSION,
                                        requested_backend(run.config));
  connect_metrics(metrics, args.metrics_port >= 0 ? args.metrics_port : run.config.metrics_port,
                  run);
  // Written when run_train returns or throws: the operator's exact final progress.
  TerminationMessage termination;
  termination.set_chief(run.world_size <= 1);
  connect_termination_message(termination, run);

  // 3. Join the data-parallel group (a no-op for one replica), train.
  std::unique_ptr<dist::DataParallel> group;
  try {
    group = join_replica_group(replica, args, run);
  } catch (const Cancelled& e) {
    if (signals.signal_received() == 0) throw;
    LH_LOG(INFO) << "stopped at the rendezvous; nothing to commit" << kv("reason", e.what());
    return 128 + signals.signal_received();
  }
  if (group != nullptr) {
    metrics.set_chief(group->is_chief());
    termination.set_chief(group->is_chief());
  }
  measure_regroups(metrics, group.get(), run);
  const trainer::RunResult result = trainer::run_training(run);
  if (int code = finish_replica(replica, args, run, result, group.get()); code >= 0) return code;
  return exit_code_for(result, run);
}

}  // namespace longhaul::cli
