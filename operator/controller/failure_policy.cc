// Failure and restart policy (see failure_policy.h).
#include "longhaul/controller/failure_policy.h"

#include <algorithm>
#include <cmath>

namespace longhaul::controller {
namespace {

const json& field_or_null(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string string_at(const json& obj, const char* key) {
  const json& v = field_or_null(obj, key);
  return v.is_string() ? v.get<std::string>() : "";
}

std::string pod_ref(const json& pod) {
  const json& md = field_or_null(pod, "metadata");
  return string_at(md, "namespace") + "/" + string_at(md, "name");
}

}  // namespace

std::string_view outcome_name(PodOutcome o) {
  switch (o) {
    case PodOutcome::kActive:
      return "Active";
    case PodOutcome::kSucceeded:
      return "Succeeded";
    case PodOutcome::kDisrupted:
      return "Disrupted";
    case PodOutcome::kRetryableFailure:
      return "RetryableFailure";
    case PodOutcome::kPermanentFailure:
      return "PermanentFailure";
  }
  return "";
}

std::optional<std::string> disruption_reason(const json& pod) {
  const json& status = field_or_null(pod, "status");
  const json& conditions = field_or_null(status, "conditions");
  if (conditions.is_array()) {
    for (const json& c : conditions) {
      if (string_at(c, "type") == "DisruptionTarget" && string_at(c, "status") == "True") {
        const std::string r = string_at(c, "reason");
        return r.empty() ? "DisruptionTarget" : r;
      }
    }
  }
  static const char* kReasons[] = {"Evicted",      "Preempted", "Shutdown",    "Terminated",
                                   "NodeShutdown", "NodeLost",  "NodeAffinity"};
  const std::string r = string_at(status, "reason");
  for (const char* k : kReasons) {
    if (r == k) return r;
  }
  const json& md = field_or_null(pod, "metadata");
  if (!field_or_null(md, "deletionTimestamp").is_null()) return std::string("Deleted");
  return std::nullopt;
}

ExitCodeClass classify_exit_code(int code, const api::RunPolicy& p) {
  auto in = [code](const std::vector<int32_t>& v) {
    return std::find(v.begin(), v.end(), code) != v.end();
  };
  if (in(p.permanent_exit_codes)) return ExitCodeClass::kPermanent;
  if (in(p.retryable_exit_codes)) return ExitCodeClass::kRetryable;
  return code >= 128 ? ExitCodeClass::kRetryable : ExitCodeClass::kPermanent;
}

std::optional<std::pair<std::string, int>> failed_container(const json& pod) {
  const json& statuses = field_or_null(field_or_null(pod, "status"), "containerStatuses");
  if (!statuses.is_array()) return std::nullopt;
  for (const char* which : {"state", "lastState"}) {
    for (const json& cs : statuses) {
      const json& term = field_or_null(field_or_null(cs, which), "terminated");
      const json& code = field_or_null(term, "exitCode");
      if (code.is_number_integer() && code.get<int>() != 0) {
        return std::pair{string_at(cs, "name"), code.get<int>()};
      }
    }
  }
  return std::nullopt;
}

int32_t container_restarts(const json& pod) {
  const json& statuses = field_or_null(field_or_null(pod, "status"), "containerStatuses");
  int32_t n = 0;
  if (statuses.is_array()) {
    for (const json& cs : statuses) {
      const json& rc = field_or_null(cs, "restartCount");
      if (rc.is_number_integer()) n += rc.get<int32_t>();
    }
  }
  return n;
}

PodClassification classify_pod(const json& pod, const api::ReplicaSpec& replica,
                               const api::RunPolicy& policy) {
  PodClassification c;
  const std::string phase = string_at(field_or_null(pod, "status"), "phase");
  if (auto why = disruption_reason(pod); why && phase != "Succeeded") {
    c.outcome = PodOutcome::kDisrupted;
    c.reason = std::string(api::reason::kPreempted);
    c.message = "pod " + pod_ref(pod) + " was disrupted (" + *why + ")";
    return c;
  }
  if (phase == "Succeeded") {
    c.outcome = PodOutcome::kSucceeded;
    return c;
  }
  if (phase != "Failed") return c;  // Pending, Running, Unknown: still active

  auto container = failed_container(pod);
  if (container) c.exit_code = container->second;
  const std::string what = container
                               ? "pod " + pod_ref(pod) + " container " + container->first +
                                     " exited with code " + std::to_string(container->second)
                               : "pod " + pod_ref(pod) + " failed (" +
                                     (string_at(field_or_null(pod, "status"), "reason").empty()
                                          ? std::string("no exit code")
                                          : string_at(field_or_null(pod, "status"), "reason")) +
                                     ")";
  if (replica.restart_policy == api::RestartPolicy::kNever) {
    c.outcome = PodOutcome::kPermanentFailure;
    c.reason = std::string(api::reason::kPodFailedNeverRestart);
    c.message = what + " and its replica's restartPolicy is Never";
    return c;
  }
  // No exit code (e.g. the pod failed before a container ran): retry, it spends the budget.
  if (!container || classify_exit_code(container->second, policy) == ExitCodeClass::kRetryable) {
    c.outcome = PodOutcome::kRetryableFailure;
    c.reason = std::string(api::reason::kRetryableExit);
    c.message = what + " (retryable)";
    return c;
  }
  c.outcome = PodOutcome::kPermanentFailure;
  c.reason = std::string(api::reason::kPermanentExit);
  c.message = what + " (permanent)";
  return c;
}

std::chrono::milliseconds restart_backoff(const api::BackoffSpec& b, int n, double jitter01) {
  if (n <= 0) return std::chrono::milliseconds(0);
  const double max_ms = 1000.0 * b.max_seconds;
  double ms = 1000.0 * b.initial_seconds * std::pow(2.0, std::min(n - 1, 30));
  ms = std::min(ms, max_ms);
  ms *= 1.0 + 0.2 * std::clamp(jitter01, 0.0, 0.999999);
  ms = std::min(ms, max_ms);
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace longhaul::controller
