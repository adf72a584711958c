// Data-parallel glue of longhaul-worker (worker/distributed): `launch`, the replica group a `train`
// process joins (TF_CONFIG or --rank/--world-size), and the evaluator task.
//
// Environment read here besides what dist/cluster.h lists:
//   LONGHAUL_COLLECTIVE_TIMEOUT_SECS (default 300): a peer that hangs or a cut network is
//       declared lost after this; survivors regroup or exit 138 (supervisor.on_peer_loss).
//   LONGHAUL_PEER_LIVENESS_SECS (default 10): a peer whose heartbeat file in the rendezvous
//       folder stopped changing (a frozen process or host) is declared lost after this
//       (communicator.h, "Liveness").
//   LONGHAUL_ALLREDUCE_ALGORITHM (default ring): ring | halving-doubling | bcube.
//   LONGHAUL_ALLREDUCE_OVERLAP (default on): on | off, when train has no --allreduce-overlap.
//   LONGHAUL_ALLREDUCE_BUCKET_MB (default 0 = automatic), when train has no
//       --allreduce-bucket-mb.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>

#include <unistd.h>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/distributed/communicator.h"
#include "longhaul/distributed/evaluator.h"
#include "longhaul/distributed/launch.h"
#include "longhaul/distributed/training_done.h"
#include "longhaul/supervisor/signals.h"

namespace longhaul::cli {
namespace {

double env_secs(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (*end != '\0' || !(x > 0)) {
    throw InvalidArgument(std::string("environment variable ") + name + "='" + v +
                          "' is not a positive number of seconds");
  }
  return x;
}

// The overlapped all-reduce options: the train flags, else the environment, else the defaults.
dist::DataParallelOptions data_parallel_options(const TrainArgs& args, double timeout_secs) {
  dist::DataParallelOptions o;
  o.device_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_secs * 1000));
  std::string overlap = args.allreduce_overlap;
  if (const char* v = std::getenv("LONGHAUL_ALLREDUCE_OVERLAP"); overlap.empty() && v != nullptr) {
    overlap = v;
  }
  if (overlap == "off") {
    o.overlap_allreduce = false;
  } else if (!overlap.empty() && overlap != "on") {
    throw InvalidArgument("LONGHAUL_ALLREDUCE_OVERLAP='" + overlap + "' must be on or off");
  }
  double mb = args.allreduce_bucket_mb;
  if (const char* v = std::getenv("LONGHAUL_ALLREDUCE_BUCKET_MB"); mb < 0 && v != nullptr && *v) {
    char* end = nullptr;
    mb = std::strtod(v, &end);
    if (*end != '\0' || !(mb >= 0)) {
      throw InvalidArgument(std::string("LONGHAUL_ALLREDUCE_BUCKET_MB='") + v +
                            "' must be a non-negative number of MiB (0: automatic)");
    }
  }
  if (mb > 0) o.bucket_bytes = static_cast<size_t>(mb * 1024 * 1024);
  return o;
}

// Whether `train` with these arguments runs with supervisor.on_peer_loss: regroup (then launch
// replaces a lost replica alone). The config is the one the replicas load (--config, --set); a
// config that does not load is left to the replicas to report (exit 2), so this says false.
bool regroups_on_peer_loss(const std::vector<std::string>& train_args) {
  std::filesystem::path config;
  std::vector<std::string> sets;
  for (size_t i = 1; i < train_args.size(); ++i) {
    const std::string& a = train_args[i];
    const bool has_value = i + 1 < train_args.size();
    if (a == "--config" && has_value) {
      config = train_args[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config = a.substr(9);
    } else if (a == "--set" && has_value) {
      sets.push_back(train_args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      sets.push_back(a.substr(6));
    }
  }
  try {
    return trainer::load_config(config, sets).supervisor.on_peer_loss == "regroup";
  } catch (const Error&) {
    return false;
  }
}

std::atomic<int> g_evaluator_signal{0};
extern "C" void on_evaluator_signal(int sig) { g_evaluator_signal.store(sig); }

dist::RendezvousOptions rendezvous_options(const dist::ReplicaIdentity& id, const TrainArgs& args,
                                           const trainer::RunOptions& run) {
  dist::RendezvousOptions o;
  o.logdir = run.logdir;
  o.attempt = id.attempt;
  o.rendezvous_root = args.rendezvous_dir;
  o.rank = *id.rank;
  o.world_size = id.world_size;
  o.bind_host = id.bind_host;
  o.bind_iface = id.bind_iface;
  o.max_wait_secs = run.config.supervisor.max_wait_secs;
  o.collective_timeout_secs = env_secs("LONGHAUL_COLLECTIVE_TIMEOUT_SECS", 300);
  o.liveness_timeout_secs = env_secs("LONGHAUL_PEER_LIVENESS_SECS", 10);
  if (supervisor::SignalHandler* signals = run.signals) {
    o.cancelled = [signals] { return signals->stop_requested(); };
  }
  if (const char* a = std::getenv("LONGHAUL_ALLREDUCE_ALGORITHM"); a != nullptr && *a) {
    o.algorithm = dist::parse_allreduce_algorithm(a);
  }
  return o;
}

// Recovery in place (distributed/data_parallel.h), for supervisor.on_peer_loss: regroup. A
// replacement of a lost replica takes the survivors' state by broadcast instead of reading a
// checkpoint, and every replica regroups after a loss.
void enable_regroup(dist::DataParallel* p, const dist::StateSource& source,
                    const dist::RendezvousOptions& o, trainer::RunOptions& run) {
  const auto& sup = run.config.supervisor;
  if (source.survivors) {
    LH_LOG(WARNING) << "joining running replicas as the replacement of a lost one; their state "
                       "comes by broadcast, no checkpoint is read"
                    << kv("rank", p->rank()) << kv("step", source.step)
                    << kv("state_from_rank", source.root);
    const auto wait = std::chrono::milliseconds(
        static_cast<int64_t>((sup.regroup_timeout_secs + o.collective_timeout_secs) * 1000));
    run.receive_state = [p, source, wait](supervisor::TrainingState& state) {
      state.initialize();  // complete before it is overwritten (a mismatch leaves no hole)
      p->broadcast_state(state, wait, source.root);
    };
  }
  run.regroup = [p](supervisor::TrainingState& state) { return p->regroup(state); };
}

}  // namespace

std::unique_ptr<dist::DataParallel> join_replica_group(const dist::ReplicaIdentity& id,
                                                       const TrainArgs& args,
                                                       trainer::RunOptions& run) {
  // A marker left by an earlier run that a larger max_steps continues would end an evaluator
  // early: the chief removes it before training.
  if (id.rank == 0) dist::clear_training_done(run.logdir);
  if (id.world_size <= 1) return nullptr;
  const dist::RendezvousOptions o = rendezvous_options(id, args, run);
  const dist::DataParallelOptions dp_options =
      data_parallel_options(args, o.collective_timeout_secs);
  const bool regroup = run.config.supervisor.on_peer_loss == "regroup";
  // A fresh process first asks whether it joins replicas that kept their state (it replaces a
  // lost one). Every replica asks, whatever its policy, so that replicas with different
  // supervisor.on_peer_loss all exit 2 here. A member lost before the mesh connected is left
  // behind by rendezvous() itself (a new generation); with regroup, one lost before this
  // agreement (died, or frozen: communicator.h, "Liveness") sends this replica to the group's
  // next generation too, rather than out with 138, which would restart the whole group.
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(o.max_wait_secs * 1000));
  std::unique_ptr<dist::DataParallel> dp;
  dist::StateSource source;
  while (true) {
    dp.reset();  // a failed group's sockets are closed before the next rendezvous
    dp = std::make_unique<dist::DataParallel>(dist::rendezvous(o), dp_options);
    if (regroup) dp->set_regroup(o, run.config.supervisor.regroup_timeout_secs);
    try {
      source = dp->agree_state_source(std::nullopt);
      break;
    } catch (const Aborted& e) {
      if (!regroup || std::chrono::steady_clock::now() >= give_up) throw;
      LH_LOG(WARNING) << "a peer was lost while the group formed; joining its next generation"
                      << kv("rank", o.rank) << kv("error", e.what());
    }
  }
  // The first broadcast waits while the chief restores (a large checkpoint may take minutes).
  const auto first_wait = std::chrono::milliseconds(
      static_cast<int64_t>((o.max_wait_secs + o.collective_timeout_secs) * 1000));
  dist::DataParallel* p = dp.get();
  run.sync_state = [p, first_wait](supervisor::TrainingState& state) {
    p->broadcast_state(state, first_wait);
  };
  if (regroup) enable_regroup(p, source, o, run);
  // The chief role (checkpoints, events, training.done) follows the agreement: rank 0 at a
  // fresh start; a replacement joins as a worker; the lowest survivor when the chief is lost.
  run.chief_role = [p] { return p->is_chief(); };
  run.start_reducing_gradients = [p](model::LanguageModel& model) {
    p->start_gradient_averaging(model);
  };
  run.reduce_gradients = [p](model::LanguageModel& model) { p->average_gradients(model); };
  run.agree_stop = [p](bool local_stop) { return p->any_stop(local_stop); };
  run.average_loss = [p](double local_loss) { return p->mean_over_ranks(local_loss); };
  return dp;
}

int finish_replica(const dist::ReplicaIdentity& id, const TrainArgs& args,
                   const trainer::RunOptions& run, const trainer::RunResult& result,
                   dist::DataParallel* dp) {
  const bool finished = result.final_step >= run.config.training.max_steps;
  const bool chief = dp != nullptr ? dp->is_chief() : id.rank == 0;
  if (dp != nullptr && dp->averaged_steps() > 0) {
    // How much of the gradient all-reduce the backward pass hid (bench/dist_bench.sh reads it).
    const double busy = dp->allreduce_busy_seconds(), exposed = dp->allreduce_seconds();
    LH_LOG(INFO) << "gradient all-reduce" << kv("rank", dp->rank())
                 << kv("steps", dp->averaged_steps()) << kv("allreduce_seconds", busy)
                 << kv("blocked_seconds", exposed)
                 << kv("hidden_fraction", busy > 0 ? std::max(0.0, 1.0 - exposed / busy) : 0.0)
                 << kv("buckets_per_step", dp->last_bucket_count());
  }
  if (result.regroup_failed) {
    LH_LOG(WARNING) << "a lost replica was not replaced within supervisor.regroup_timeout_secs; "
                    << (chief ? "committed a final checkpoint of the last completed step; " : "")
                    << "exit 138 so the whole group restarts" << kv("rank", *id.rank)
                    << kv("step", result.final_step);
    return kExitAborted;
  }
  if (dp != nullptr && dp->regroups() > 0) {
    LH_LOG(INFO) << "recovered from lost peers in place" << kv("rank", *id.rank)
                 << kv("regroups", dp->regroups());
  }
  if (dp != nullptr && result.signal == 0 && !finished && dp->stop_requested_by_peer()) {
    LH_LOG(WARNING) << "stopped because another replica stopped (preempted or signalled); the "
                       "chief committed a final checkpoint; exit 138 so the group restarts"
                    << kv("rank", dp->rank()) << kv("step", result.final_step);
    return kExitAborted;
  }
  if (chief && finished && result.signal == 0) {
    dist::write_training_done(run.logdir, result.final_step);
  }
  if (dp != nullptr && dp->regroup_enabled() && finished) {
    // With recovery in place the chief may be any rank: nobody leaves before it committed.
    const auto wait = std::chrono::milliseconds(static_cast<int64_t>(
        (run.config.supervisor.max_wait_secs + env_secs("LONGHAUL_COLLECTIVE_TIMEOUT_SECS", 300)) *
        1000));
    try {
      dp->finish_with_chief(result.final_step, wait);
    } catch (const Aborted& e) {
      LH_LOG(WARNING) << "a replica was lost after the last step, before the chief confirmed its "
                         "final checkpoint; exit 138 so the group restarts from the latest one"
                      << kv("rank", dp->rank()) << kv("error", e.what());
      return kExitAborted;
    } catch (const Cancelled& e) {
      // A stop while waiting for the chief (its final checkpoint may take long): this replica
      // has nothing to commit; the chief's checkpoint is the chief's.
      const int sig = run.signals != nullptr ? run.signals->signal_received() : 0;
      LH_LOG(INFO) << "stopped while waiting for the chief to confirm its final checkpoint"
                   << kv("rank", dp->rank()) << kv("reason", e.what());
      return sig != 0 ? 128 + sig : kExitAborted;
    }
  }
  if (chief && finished && result.signal == 0 && dp != nullptr && args.rendezvous_dir.empty()) {
    dist::remove_rendezvous_dir(run.logdir, id.attempt);
  }
  return -1;  // the caller decides as for one replica
}

int run_evaluator_task(const trainer::WorkerConfig& config, const std::filesystem::path& logdir) {
  dist::EvaluatorOptions o;
  o.config = config;
  o.logdir = logdir;
  o.poll_secs = 1;  // a new checkpoint is evaluated within a second; not a group's wait
  struct sigaction sa {};
  sa.sa_handler = on_evaluator_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_term {
  }, old_int{};
  ::sigaction(SIGTERM, &sa, &old_term);
  ::sigaction(SIGINT, &sa, &old_int);
  o.should_stop = [] { return g_evaluator_signal.load() != 0; };
  dist::EvaluatorResult result;
  try {
    result = dist::run_evaluator(o);
  } catch (...) {
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigaction(SIGINT, &old_int, nullptr);
    throw;
  }
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGINT, &old_int, nullptr);
  const int sig = g_evaluator_signal.load();
  if (sig == SIGTERM) return kExitTerminated;
  if (sig == SIGINT) return kExitInterrupted;
  return kExitFinished;
}

int run_launch_command(const LaunchArgs& args) {
  dist::LaunchOptions o;
  o.replicas = args.replicas;
  o.max_restarts = args.max_restarts;
  o.evaluator = args.evaluator;
  o.args = args.command;
  o.grace_secs = args.grace_secs;
  if (!o.args.empty() && o.args.front() != "train") {
    throw InvalidArgument(
        "launch runs `train` replicas: put `-- train [flags]` after the launch "
        "flags (got '" +
        o.args.front() + "')");
  }
  o.replace_lost_replicas = regroups_on_peer_loss(o.args);
  return dist::run_launch(o).exit_code;
}

}  // namespace longhaul::cli
