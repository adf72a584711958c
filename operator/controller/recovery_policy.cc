// Recovery policy for restartScope Replica (see recovery_policy.h).
#include "longhaul/controller/recovery_policy.h"

#include <cstdio>

namespace longhaul::controller {

bool replica_keeps_failing(api::TrainingJobStatus& st, const std::string& pod, api::Time now) {
  std::erase_if(st.replica_failures, [&](const auto& e) {
    const auto since = api::parse_time_or_null(e.second.since);
    return !since || now - *since > kReplicaFailureWindow;
  });
  api::ReplicaFailures& f = st.replica_failures[pod];
  if (f.count == 0) f.since = api::format_time(now);
  if (f.count >= kReplicaFailuresBeforeGroupRestart) return true;
  f.count += 1;
  return false;
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
