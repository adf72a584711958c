// The operator's Prometheus metrics, built once at start-up on one registry, with labelled
// children cached. Served on --metrics-port at /metrics by longhaul::http::Server (base/), which
// connections held open by other pods cannot starve (civetweb, under prometheus-cpp's Exposer,
// served two connections at a time, each allowed to sit idle for 30 s). The chart's Grafana
// dashboard (charts/longhaul/dashboards/longhaul-operator.json) and its PrometheusRule
// (charts/longhaul/templates/prometheusrule.yaml) use these names.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "longhaul/base/http_server.h"
#include "longhaul/base/mutex.h"

namespace longhaul::operator_cli {

class OperatorMetrics {
 public:
  // Serves /metrics on bind_address:port (IPv4; port 0 picks a free one). Throws Unavailable
  // naming the port when it is taken, InvalidArgument for an address that is not IPv4.
  OperatorMetrics(const std::string& bind_address, int port, const std::string& version);
  int port() const { return server_.port(); }
  std::string text() const;  // what /metrics serves: the text exposition format

  void reconcile(std::string_view result, double seconds);           // success|error|requeue
  void reconcile_cpu(double seconds);                                // the worker thread's CPU
  void job_phase(const std::string& key, const std::string& phase);  // "" when gone
  // Per job ("namespace/name"): longhaul_operator_job_failures (failures counted against the
  // budget, status.failureCount) and longhaul_operator_job_backoff_limit
  // (runPolicy.backoffLimit), labelled namespace and name. drop_job_failure_budget removes both
  // series, for a job that is gone or finished, so no label set outlives its job.
  void job_failure_budget(const std::string& key, int failures, int backoff_limit);
  void drop_job_failure_budget(const std::string& key);
  // Every job's two series: a replica that stops leading stops reconciling, so its values would
  // go stale (and outlive jobs deleted under the next leader).
  void drop_job_failure_budgets();
  void pod_restart(std::string_view reason);
  void recovery(double seconds);  // one in-place recovery (restartScope Replica) completed
  // `seconds`: sending until the answer (not the client's rate-limit wait).
  void api_request(const std::string& verb, const std::string& code, double seconds);
  void queue_depth(size_t depth);
  void queue_latency(double seconds);
  void set_leader(bool leader);

 private:
  // The family's child for `labels`, made once and kept in counter_cache_ (takes mu_).
  prometheus::Counter& cached(prometheus::Family<prometheus::Counter>& family,
                              const std::map<std::string, std::string>& labels) EXCLUDES(mu_);
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& reconciles_;
  prometheus::Histogram& reconcile_duration_;
  prometheus::Histogram& reconcile_cpu_;
  prometheus::Histogram& api_request_duration_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Counter>& pod_restarts_;
  prometheus::Histogram& recovery_duration_;
  prometheus::Family<prometheus::Counter>& api_requests_;
  prometheus::Gauge& queue_depth_;
  prometheus::Histogram& queue_latency_;
  prometheus::Gauge& is_leader_;
  prometheus::Family<prometheus::Gauge>& job_failures_;
  prometheus::Family<prometheus::Gauge>& job_backoff_limit_;

  Mutex mu_;
  std::map<std::string, prometheus::Counter*> counter_cache_ GUARDED_BY(mu_);
  std::map<std::string, std::string> phase_of_ GUARDED_BY(mu_);  // job -> phase
  std::map<std::string, prometheus::Gauge*> phase_gauges_ GUARDED_BY(mu_);
  struct BudgetGauges {
    prometheus::Gauge* failures;
    prometheus::Gauge* backoff_limit;
  };
  std::map<std::string, BudgetGauges> budget_of_ GUARDED_BY(mu_);  // job -> its two series

  http::Server server_;  // last: stopped and joined before anything it serves goes
};

}  // namespace longhaul::operator_cli
