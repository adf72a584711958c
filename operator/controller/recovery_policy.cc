// Recovery policy for restartScope Replica (see recovery_policy.h).
#include "longhaul/controller/recovery_policy.h"

#include <cstdio>

namespace longhaul::controller {

ReplicaFailureCount count_replica_failure(std::map<std::string, api::ReplicaFailures> failures,
                                          const std::string& pod, api::Time now) {
  std::erase_if(failures, [&](const auto& e) {
    const auto since = api::parse_time_or_null(e.second.since);
    return !since || now - *since > kReplicaFailureWindow;
  });
  api::ReplicaFailures& f = failures[pod];
  if (f.count == 0) f.since = api::format_time(now);
  const bool keeps_failing = f.count >= kReplicaFailuresBeforeGroupRestart;
  if (!keeps_failing) f.count += 1;
  return {std::move(failures), keeps_failing};
}

RestartDecision decide_replica_scope(const RestartInput& in, RestartDecision d) {
  const ClassifiedPods& pods = in.pods;
  const int32_t limit = in.spec.run_policy.backoff_limit;
  // The retryable failure that asks for a new group attempt (exit 138), or else the first of a
  // replica that keeps failing (each failure looked at is counted in replicaFailures).
  const LostPod* group_cause = nullptr;
  std::string_view group_reason;
  for (const LostPod& f : pods.retryable) {
    if (f.c.exit_code == kGroupRestartExitCode) {
      group_cause = &f;
      group_reason = api::reason::kGroupRestartRequested;
      break;
    }
  }
  if (group_cause == nullptr) {
    for (const LostPod& f : pods.retryable) {
      ReplicaFailureCount counted =
          count_replica_failure(std::move(d.replica_failures), f.name, in.now);
      d.replica_failures = std::move(counted.failures);
      if (counted.keeps_failing) {
        group_cause = &f;
        group_reason = api::reason::kReplicaKeepsFailing;
        break;
      }
    }
  }
  if (group_cause != nullptr) {
    d.disruptions = static_cast<int32_t>(pods.disrupted.size());
    d.failures = 1;
    const int32_t failures = in.failure_count + d.failures;
    const std::string why =
        group_cause->c.message +
        (group_reason == api::reason::kGroupRestartRequested
             ? std::string(" (a new group attempt was asked for)")
             : " (replaced in place " + std::to_string(kReplicaFailuresBeforeGroupRestart) +
                   " times within " + std::to_string(kReplicaFailureWindow.count()) + "s)");
    d.abandoned_recovery = {std::string(group_reason), why + ": restarting the whole group"};
    if (failures > limit) {
      d.finish = budget_exceeded(limit, failures, why);
    } else {
      d.group_restart = {std::string(group_reason), why + failures_spent(failures, limit), true};
    }
    return d;
  }
  for (const LostPod& p : pods.disrupted) {
    d.disruptions += 1;
    d.replacements.push_back({p.name, p.c.reason, p.c.message + " (no failure budget spent)"});
  }
  for (const LostPod& f : pods.retryable) {
    d.failures += 1;
    const int32_t failures = in.failure_count + d.failures;
    if (failures > limit) {
      d.finish = budget_exceeded(limit, failures, f.c.message);
      break;
    }
    d.replacements.push_back({f.name, f.c.reason, f.c.message + failures_spent(failures, limit)});
  }
  return d;
}

void begin_recovery(api::TrainingJobStatus& st, std::string_view reason, const std::string& message,
                    api::Time now) {
  if (st.recovering_since.empty()) st.recovering_since = api::format_micro_time(now);
  st.recoveries += 1;
  api::set_condition(st, api::condition::kRecovering, "True", reason, message, now);
}

std::optional<double> end_recovery(api::TrainingJobStatus& st, int replicas, api::Time now) {
  if (!api::condition_true(st, api::condition::kRecovering)) return std::nullopt;
  const auto since = api::parse_time_or_null(st.recovering_since);
  std::optional<double> seconds;
  std::string message = "all " + std::to_string(replicas) + " replicas running again";
  if (since) {
    const auto ms = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(now - *since).count());
    st.last_recovery_milliseconds = ms;
    seconds = static_cast<double>(ms) / 1000.0;
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.3fs after the fault was observed", *seconds);
    message += buf;
  }
  st.recovering_since.clear();
  api::set_condition(st, api::condition::kRecovering, "False", api::reason::kReplicasRecovered,
                     message, now);
  return seconds;
}

void abandon_recovery(api::TrainingJobStatus& st, std::string_view reason,
                      const std::string& message, api::Time now) {
  st.recovering_since.clear();
  if (api::condition_true(st, api::condition::kRecovering)) {
    api::set_condition(st, api::condition::kRecovering, "False", reason, message, now);
  }
}

}  // namespace longhaul::controller
