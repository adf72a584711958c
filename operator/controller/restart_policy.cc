// Restart policy: success, failure or a restart by scope (see restart_policy.h).
#include "longhaul/controller/restart_policy.h"

#include "longhaul/controller/recovery_policy.h"

namespace longhaul::controller {

namespace {

// restartScope Group: disrupted pods restart the group at once, without spending the failure
// budget; a retryable failure spends one and restarts it after the failure backoff.
RestartDecision decide_group_scope(const RestartInput& in, RestartDecision d) {
  const ClassifiedPods& pods = in.pods;
  const int32_t limit = in.spec.run_policy.backoff_limit;
  if (!pods.disrupted.empty()) {
    d.disruptions = static_cast<int32_t>(pods.disrupted.size());
    std::string msg = pods.disrupted.front().c.message;
    if (pods.disrupted.size() > 1) {
      msg += " and " + std::to_string(pods.disrupted.size() - 1) + " more";
    }
    d.group_restart = {pods.disrupted.front().c.reason, msg + " (no failure budget spent)", false};
    return d;
  }
  d.failures = 1;
  const int32_t failures = in.failure_count + d.failures;
  const LostPod& first = pods.retryable.front();
  if (failures > limit) {
    d.finish = budget_exceeded(limit, failures, first.c.message);
  } else {
    d.group_restart = {first.c.reason, first.c.message + failures_spent(failures, limit), true};
  }
  return d;
}

}  // namespace

RestartDecision::Finish budget_exceeded(int32_t backoff_limit, int32_t failures,
                                        const std::string& what) {
  return {std::string(api::phase::kFailed), std::string(api::reason::kBackoffLimitExceeded),
          "backoffLimit " + std::to_string(backoff_limit) + " exceeded (" +
              std::to_string(failures) + " failures): " + what};
}

std::string failures_spent(int32_t failures, int32_t backoff_limit) {
  return ", failures " + std::to_string(failures) + "/" + std::to_string(backoff_limit);
}

RestartDecision decide_restart(const RestartInput& in) {
  RestartDecision d;
  d.replica_failures = in.replica_failures;
  const api::RunPolicy& policy = in.spec.run_policy;
  if (const auto success = job_succeeded(in.spec, in.pods.outcomes, in.chief_pod_ref)) {
    d.finish = {std::string(api::phase::kSucceeded), success->reason, success->message};
  } else if (!in.pods.permanent.empty()) {
    const LostPod& first = in.pods.permanent.front();
    d.finish = {std::string(api::phase::kFailed), first.c.reason, first.c.message};
  } else if (in.failure_count > policy.backoff_limit) {
    d.finish = budget_exceeded(policy.backoff_limit, in.failure_count,
                               "pod " + in.container_restart_pod_ref + " restarted its containers");
  } else if (in.pods.lost()) {
    return policy.restart_scope == api::RestartScope::kGroup
               ? decide_group_scope(in, std::move(d))
               : decide_replica_scope(in, std::move(d));
  }
  return d;
}

}  // namespace longhaul::controller
