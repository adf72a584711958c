// The operator's Prometheus metrics (see metrics.h).
#include "metrics.h"

#include <prometheus/text_serializer.h>

namespace longhaul::operator_cli {
namespace {

const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025,
    0.05,   0.1,   0.25,  0.5,   1,     2.5,    5,    10,    30};
// From a replacement pod that starts at once to one that pulls an image or waits for a node.
const prometheus::Histogram::BucketBoundaries kRecoveryBuckets = {0.5, 1,  2,   5,   10,  20,
                                                                  30,  60, 120, 300, 600, 1800};
const char* kPhases[] = {"Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"};

}  // namespace

OperatorMetrics::OperatorMetrics(const std::string& bind_address, int port,
                                 const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()),
      reconciles_(prometheus::BuildCounter()
                      .Name("longhaul_operator_reconciles_total")
                      .Help("TrainingJob reconciles by result (success, error, requeue)")
                      .Register(*registry_)),
      reconcile_duration_(prometheus::BuildHistogram()
                              .Name("longhaul_operator_reconcile_duration_seconds")
                              .Help("Time spent in one reconcile of one TrainingJob")
                              .Register(*registry_)
                              .Add({}, kLatencyBuckets)),
      reconcile_cpu_(prometheus::BuildHistogram()
                         .Name("longhaul_operator_reconcile_cpu_seconds")
                         .Help("CPU time of the worker thread in one reconcile (the operator's "
                               "own time, without waiting for the API server)")
                         .Register(*registry_)
                         .Add({}, kLatencyBuckets)),
      api_request_duration_(prometheus::BuildHistogram()
                                .Name("longhaul_operator_api_request_duration_seconds")
                                .Help("Kubernetes API request latency (not watches), sent until "
                                      "answered; the client-side rate limit's wait is not "
                                      "included")
                                .Register(*registry_)
                                .Add({}, kLatencyBuckets)),
      jobs_(prometheus::BuildGauge()
                .Name("longhaul_operator_jobs")
                .Help("TrainingJobs known to this operator by phase")
                .Register(*registry_)),
      pod_restarts_(prometheus::BuildCounter()
                        .Name("longhaul_operator_pod_restarts_total")
                        .Help("Restart decisions by reason (preemption, retryable exit, ...)")
                        .Register(*registry_)),
      recovery_duration_(
          prometheus::BuildHistogram()
              .Name("longhaul_operator_recovery_seconds")
              .Help("restartScope Replica: time from a lost replica observed to every replica "
                    "Running again, per recovery in place")
              .Register(*registry_)
              .Add({}, kRecoveryBuckets)),
      api_requests_(prometheus::BuildCounter()
                        .Name("longhaul_operator_api_requests_total")
                        .Help("Kubernetes API requests by verb and HTTP code")
                        .Register(*registry_)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("longhaul_operator_workqueue_depth")
                       .Help("Job keys ready in the work queue")
                       .Register(*registry_)
                       .Add({})),
      queue_latency_(prometheus::BuildHistogram()
                         .Name("longhaul_operator_workqueue_latency_seconds")
                         .Help("Time a job key waited in the work queue before a worker took it")
                         .Register(*registry_)
                         .Add({}, kLatencyBuckets)),
      is_leader_(prometheus::BuildGauge()
                     .Name("longhaul_operator_is_leader")
                     .Help("1 while this replica holds the leader Lease (or election is off)")
                     .Register(*registry_)
                     .Add({})),
      job_failures_(prometheus::BuildGauge()
                        .Name("longhaul_operator_job_failures")
                        .Help("Failures of an unfinished TrainingJob counted against its "
                              "runPolicy.backoffLimit (status.failureCount; preemptions are not "
                              "counted); the job fails when this exceeds the limit")
                        .Register(*registry_)),
      job_backoff_limit_(prometheus::BuildGauge()
                             .Name("longhaul_operator_job_backoff_limit")
                             .Help("runPolicy.backoffLimit of an unfinished TrainingJob: the "
                                   "failures it may spend before it is marked Failed")
                             .Register(*registry_)),
      server_("Prometheus metrics", bind_address, port,
              [this](std::string_view method, std::string_view path) {
                if (path != "/metrics") return http::Response{404, "text/plain", "try /metrics\n"};
                if (method != "GET") return http::Response{405, "text/plain", "GET only\n"};
                return http::Response{200, "text/plain; version=0.0.4; charset=utf-8", text()};
              }) {
  prometheus::BuildGauge()
      .Name("longhaul_operator_build_info")
      .Help("Build information; always 1")
      .Register(*registry_)
      .Add({{"version", version}})
      .Set(1);
  for (const char* phase : kPhases) phase_gauges_[phase] = &jobs_.Add({{"phase", phase}});
  server_.start();
}

prometheus::Counter& OperatorMetrics::cached(prometheus::Family<prometheus::Counter>& family,
                                             const std::map<std::string, std::string>& labels) {
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(&family));
  for (const auto& [k, v] : labels) key += "|" + k + "=" + v;
  MutexLock lock(mu_);
  auto it = counter_cache_.find(key);
  if (it != counter_cache_.end()) return *it->second;
  prometheus::Counter& c = family.Add(labels);
  counter_cache_[key] = &c;
  return c;
}

void OperatorMetrics::reconcile(std::string_view result, double seconds) {
  cached(reconciles_, {{"result", std::string(result)}}).Increment();
  reconcile_duration_.Observe(seconds);
}

std::string OperatorMetrics::text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void OperatorMetrics::reconcile_cpu(double seconds) { reconcile_cpu_.Observe(seconds); }

void OperatorMetrics::job_phase(const std::string& key, const std::string& phase) {
  MutexLock lock(mu_);
  auto it = phase_of_.find(key);
  const std::string old = it == phase_of_.end() ? "" : it->second;
  if (old == phase) return;
  if (!old.empty() && phase_gauges_.contains(old)) phase_gauges_[old]->Decrement();
  if (phase.empty()) {
    phase_of_.erase(key);
    return;
  }
  phase_of_[key] = phase;
  if (!phase_gauges_.contains(phase)) phase_gauges_[phase] = &jobs_.Add({{"phase", phase}});
  phase_gauges_[phase]->Increment();
}

void OperatorMetrics::job_failure_budget(const std::string& key, int failures, int backoff_limit) {
  MutexLock lock(mu_);
  auto it = budget_of_.find(key);
  if (it == budget_of_.end()) {
    const size_t slash = key.find('/');
    const std::map<std::string, std::string> labels = {
        {"namespace", key.substr(0, slash)},
        {"name", slash == std::string::npos ? "" : key.substr(slash + 1)}};
    it =
        budget_of_
            .emplace(key, BudgetGauges{&job_failures_.Add(labels), &job_backoff_limit_.Add(labels)})
            .first;
  }
  it->second.failures->Set(failures);
  it->second.backoff_limit->Set(backoff_limit);
}

void OperatorMetrics::drop_job_failure_budget(const std::string& key) {
  MutexLock lock(mu_);
  const auto it = budget_of_.find(key);
  if (it == budget_of_.end()) return;
  job_failures_.Remove(it->second.failures);
  job_backoff_limit_.Remove(it->second.backoff_limit);
  budget_of_.erase(it);
}

void OperatorMetrics::drop_job_failure_budgets() {
  MutexLock lock(mu_);
  for (const auto& [key, gauges] : budget_of_) {
    job_failures_.Remove(gauges.failures);
    job_backoff_limit_.Remove(gauges.backoff_limit);
  }
  budget_of_.clear();
}

void OperatorMetrics::pod_restart(std::string_view reason) {
  cached(pod_restarts_, {{"reason", std::string(reason)}}).Increment();
}

void OperatorMetrics::recovery(double seconds) { recovery_duration_.Observe(seconds); }

void OperatorMetrics::api_request(const std::string& verb, const std::string& code,
                                  double seconds) {
  cached(api_requests_, {{"verb", verb}, {"code", code}}).Increment();
  if (verb != "watch") api_request_duration_.Observe(seconds);
}

void OperatorMetrics::queue_depth(size_t depth) { queue_depth_.Set(static_cast<double>(depth)); }
void OperatorMetrics::queue_latency(double seconds) { queue_latency_.Observe(seconds); }
void OperatorMetrics::set_leader(bool leader) { is_leader_.Set(leader ? 1 : 0); }

}  // namespace longhaul::operator_cli
