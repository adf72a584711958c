// longhaul-operator: reconciles TrainingJobs (longhaul.dev/v1alpha1).
//
// Start-up: load the cluster config (--kubeconfig, else $KUBECONFIG / ~/.kube/config, else the
// in-cluster service account), serve /metrics and /healthz + /readyz, start the informers, then
// reconcile with --workers threads while this replica leads (Lease --lease-namespace/--lease-name;
// --leader-elect=false reconciles at once). SIGTERM or SIGINT: stop reconciling (drain the
// workers), release the Lease, stop the informers, join every thread, exit 0.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/http_server.h"
#include "longhaul/base/log.h"
#include "longhaul/controller/controller.h"
#include "longhaul/kube/config.h"
#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/kube/http_client.h"
#include "longhaul/kube/leader_election.h"
#include "metrics.h"

#ifndef LONGHAUL_VERSION
#define LONGHAUL_VERSION "0.0.0"
#endif

namespace {

using namespace longhaul;

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

struct Flags {
  std::string kubeconfig, context, lease_name = "longhaul-operator", lease_namespace, identity;
  std::vector<std::string> namespaces;
  bool leader_elect = true;
  int metrics_port = 8080, health_port = 8081, workers = 4, burst = 30;
  double qps = 0, lease_duration = 15, renew_deadline = 10, retry_period = 2;
  double pod_name_release_delay = 3;
  std::string bind_address = "0.0.0.0", log_level;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--kubeconfig", f.kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)");
  app.add_option("--context", f.context, "kubeconfig context (default: current-context)");
  app.add_option("--namespace", f.namespaces, "namespace to watch; repeatable (default: all)");
  app.add_flag("--leader-elect,!--no-leader-elect", f.leader_elect,
               "elect a leader on a Lease before reconciling (default true)");
  app.add_option("--lease-name", f.lease_name, "name of the leader-election Lease");
  app.add_option("--lease-namespace", f.lease_namespace,
                 "namespace of the Lease (default: the config's namespace)");
  app.add_option("--lease-duration", f.lease_duration, "seconds a Lease is valid without renewal");
  app.add_option("--renew-deadline", f.renew_deadline, "seconds the leader retries renewing");
  app.add_option("--retry-period", f.retry_period, "seconds between Lease attempts");
  app.add_option("--identity", f.identity,
                 "leader-election identity (default: <hostname>_<random>)");
  app.add_option("--bind-address", f.bind_address, "address of the metrics and health servers");
  app.add_option("--metrics-port", f.metrics_port, "port of /metrics (0: any free port)");
  app.add_option("--health-port", f.health_port, "port of /healthz and /readyz (0: any free port)");
  app.add_option("--workers", f.workers, "reconcile worker threads")->check(CLI::Range(1, 256));
  app.add_option("--qps", f.qps,
                 "client-side API request rate limit (<= 0, the default: none; the API server's "
                 "Priority and Fairness queues and sheds load, and 429s are retried)");
  app.add_option("--burst", f.burst, "client-side API request burst (with --qps > 0)");
  app.add_option("--pod-name-release-delay", f.pod_name_release_delay,
                 "seconds a freed pod name rests before a pod is re-created under it: a kubelet "
                 "may still sync the removed pod's last status onto a same-name successor for a "
                 "moment (seen on 1.26)")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--log-level", f.log_level,
                 "debug|info|warning|error (default: LONGHAUL_LOG_LEVEL)")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
}

// --log-level, when given, wins over LONGHAUL_LOG_LEVEL (which set the level at start-up),
// whichever level either names: `--log-level info` quiets LONGHAUL_LOG_LEVEL=debug.
void set_log_level(const std::string& level) {
  if (level == "debug") log::set_level(log::Level::kDebug);
  if (level == "info") log::set_level(log::Level::kInfo);
  if (level == "warning") log::set_level(log::Level::kWarning);
  if (level == "error") log::set_level(log::Level::kError);
}

// Signals are taken synchronously by the main thread (sigwait); every thread started after this
// inherits the blocked mask.
sigset_t block_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // the leader elector's "leadership changed"
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The controller's options, with every hook feeding `metrics`.
controller::ControllerOptions controller_options(const Flags& f,
                                                 operator_cli::OperatorMetrics& metrics) {
  controller::ControllerOptions options;
  options.namespaces = f.namespaces;
  options.workers = f.workers;
  options.reconciler.name_release_delay =
      std::chrono::milliseconds(static_cast<int64_t>(f.pod_name_release_delay * 1000));
  options.on_reconcile = [&metrics](std::string_view r, double s) { metrics.reconcile(r, s); };
  options.on_reconcile_cpu = [&metrics](double s) { metrics.reconcile_cpu(s); };
  options.on_queue_depth = [&metrics](size_t d) { metrics.queue_depth(d); };
  options.on_queue_latency = [&metrics](double s) { metrics.queue_latency(s); };
  options.reconciler.on_restart = [&metrics](std::string_view r) { metrics.pod_restart(r); };
  options.reconciler.on_recovery = [&metrics](double s) { metrics.recovery(s); };
  options.reconciler.on_phase = [&metrics](const std::string& k, const std::string& p) {
    metrics.job_phase(k, p);
  };
  options.reconciler.on_failure_budget =
      [&metrics](const std::string& k, const std::optional<controller::FailureBudget>& b) {
        if (b) {
          metrics.job_failure_budget(k, b->failures, b->backoff_limit);
        } else {
          metrics.drop_job_failure_budget(k);
        }
      };
  return options;
}

// Probes: /healthz is 200 while the process runs; /readyz once the informers have synced
// (whether or not this replica leads, so standbys stay in the Service).
std::unique_ptr<http::Server> probe_server(const Flags& f, controller::Controller& ctl) {
  return std::make_unique<http::Server>(
      "/healthz", f.bind_address, f.health_port, [&ctl](std::string_view, std::string_view path) {
        if (path == "/healthz") return http::Response{200, "text/plain", "ok\n"};
        if (path == "/readyz") {
          return ctl.synced() ? http::Response{200, "text/plain", "ok\n"}
                              : http::Response{503, "text/plain", "informers not synced\n"};
        }
        return http::Response{404, "text/plain", "not found\n"};
      });
}

// Reconciles only from a synced cache.
void start_reconciling(controller::Controller& ctl, operator_cli::OperatorMetrics& metrics) {
  while (!ctl.wait_for_sync(std::chrono::seconds(5))) {
    LH_LOG(WARNING) << "informers not synced yet; waiting before reconciling";
  }
  ctl.start_workers();
  metrics.set_leader(true);
}

// The leader elector on the Lease, started. Its callbacks return at once: they wake the main
// thread (SIGUSR1), which starts or drains the workers. The Lease has a client of its own
// (`lease_client`): renewals never queue behind the reconcilers' requests in the rate limiter,
// and a renewal stuck in retries gives up before the renew deadline.
std::unique_ptr<kube::LeaderElector> start_elector(
    const Flags& f, const kube::ClusterConfig& config,
    const kube::HttpClientOptions& client_options, controller::Controller& ctl,
    std::shared_ptr<kube::HttpClient>& lease_client) {
  kube::LeaderElectionConfig lc;
  lc.lease_namespace = f.lease_namespace.empty() ? config.default_namespace : f.lease_namespace;
  lc.lease_name = f.lease_name;
  lc.identity = f.identity;
  lc.lease_duration = seconds_to_ms(f.lease_duration);
  lc.renew_deadline = seconds_to_ms(f.renew_deadline);
  lc.retry_period = seconds_to_ms(f.retry_period);
  lc.on_started_leading = [] { ::kill(::getpid(), SIGUSR1); };
  // Writes stop here, on the elector's thread, before the main thread drains the workers.
  lc.on_stopped_leading = [&ctl] {
    ctl.cancel_workers();
    ::kill(::getpid(), SIGUSR1);
  };
  kube::HttpClientOptions lease_options = client_options;
  lease_options.qps = 5;
  lease_options.burst = 10;
  lease_options.retry_budget = lc.retry_period;
  lease_client = std::make_shared<kube::HttpClient>(config, lease_options);
  auto elector = std::make_unique<kube::LeaderElector>(lease_client, lc);
  elector->start();
  return elector;
}

// Follows leadership changes until SIGTERM or SIGINT; then stops every write and returns.
void serve_until_signalled(const sigset_t& signals, controller::Controller& ctl,
                           kube::LeaderElector* elector, operator_cli::OperatorMetrics& metrics) {
  for (;;) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGUSR1) {
      if (elector && elector->is_leader()) {
        if (!ctl.workers_active()) {  // not started, or cancelled by a loss since regained
          ctl.stop_workers();
          start_reconciling(ctl, metrics);
        }
      } else if (elector && ctl.workers_running()) {
        LH_LOG(WARNING) << "lost leadership: stopped writing, draining the workers";
        metrics.set_leader(false);
        ctl.stop_workers();
        metrics.drop_job_failure_budgets();  // the next leader exports them
      }
      continue;
    }
    LH_LOG(INFO) << "shutting down" << kv("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    ctl.cancel_workers();  // writes stop now; the drain below waits only for reads in flight
    return;
  }
}

int run(int argc, char** argv) {
  CLI::App app{"longhaul-operator: reconciles TrainingJobs (longhaul.dev/v1alpha1)"};
  app.set_version_flag("--version", std::string("longhaul-operator ") + LONGHAUL_VERSION);
  Flags flags;
  add_flags(app, flags);
  CLI11_PARSE(app, argc, argv);
  set_log_level(flags.log_level);
  if (flags.identity.empty()) flags.identity = kube::default_identity();
  const sigset_t signals = block_signals();
  // A few I/O threads serve every connection; cpprestsdk's 40 cost more in switches (#11).
  kube::set_io_threads(std::clamp(std::thread::hardware_concurrency(), 2u, 8u));

  const kube::ClusterConfig config = kube::load_default_config(flags.kubeconfig, flags.context);
  operator_cli::OperatorMetrics metrics(flags.bind_address, flags.metrics_port, LONGHAUL_VERSION);
  kube::HttpClientOptions client_options;
  client_options.qps = flags.qps;
  client_options.burst = flags.burst;
  client_options.observer = [&metrics](const kube::RequestObservation& o) {
    metrics.api_request(o.verb, o.code, o.duration.count());
  };
  auto client = std::make_shared<kube::HttpClient>(config, client_options);
  controller::Controller ctl(client, nullptr, controller_options(flags, metrics));
  std::unique_ptr<http::Server> health = probe_server(flags, ctl);
  health->start();
  LH_LOG(INFO) << "longhaul-operator starting" << kv("version", LONGHAUL_VERSION)
               << kv("cluster", config.source) << kv("identity", flags.identity)
               << kv("metrics_port", metrics.port()) << kv("health_port", health->port())
               << kv("leader_elect", flags.leader_elect ? "true" : "false");
  ctl.start();

  std::shared_ptr<kube::HttpClient> lease_client;
  std::unique_ptr<kube::LeaderElector> elector;
  if (flags.leader_elect) {
    elector = start_elector(flags, config, client_options, ctl, lease_client);
  } else {
    start_reconciling(ctl, metrics);
  }
  serve_until_signalled(signals, ctl, elector.get(), metrics);

  // Drain the workers first (no reconcile may run once the Lease is given up), then release the
  // Lease, then stop the informers.
  metrics.set_leader(false);
  ctl.stop_workers();
  if (elector) elector->stop();
  ctl.stop();
  health->stop();
  client->close();
  if (lease_client) lease_client->close();
  LH_LOG(INFO) << "longhaul-operator stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    LH_LOG(ERROR) << "longhaul-operator failed" << kv("error", e.what());
    return 1;
  }
}
