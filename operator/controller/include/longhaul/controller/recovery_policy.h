// Recovery policy for restartScope Replica: a lost replica is re-created alone, in place, and
// the job says so (condition Recovering, status.recoveries, the measured recovery time).
//
// When a replica is replaced in place:
// - a disruption (preemption, eviction, node shutdown or loss, deletion by someone else) of any
//   replica, chief included: always, without spending backoffLimit;
// - a retryable exit: while that replica has been replaced after failures fewer than
//   kReplicaFailuresBeforeGroupRestart times within kReplicaFailureWindow; spends one failure.
// When the whole group restarts instead (with the failure backoff, like restartScope Group):
// - the same replica failed again past that limit (a replica that keeps failing: a fresh group
//   is the better bet, e.g. against state that a crash-looping rank keeps pulling back in);
// - a replica exited kGroupRestartExitCode (138): longhaul workers use it for "the survivors
//   gave up waiting for a replacement" (supervisor.regroup_timeout_secs), which asks for a new
//   group attempt.
// A permanent exit fails the job whatever the scope.
//
// State lives in the job's status only (recoveringSince, replicaFailures, ...), so an operator
// restarted mid-recovery measures and decides the same.
//
// Thread-safety: functions on values. The decisions (count_replica_failure,
// decide_replica_scope) return what they decided and change nothing; the recovery bookkeeping
// (begin_, end_, abandon_recovery) changes only the status it is given.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/restart_policy.h"

namespace longhaul::controller {

inline constexpr int32_t kReplicaFailuresBeforeGroupRestart = 3;
inline constexpr std::chrono::seconds kReplicaFailureWindow{600};
inline constexpr int kGroupRestartExitCode = 138;

struct ReplicaFailureCount {
  std::map<std::string, api::ReplicaFailures> failures;  // status.replicaFailures after it
  // The replica was already replaced kReplicaFailuresBeforeGroupRestart times within the
  // window (this failure is not counted then): the group should restart.
  bool keeps_failing = false;
};

// Counts a retryable failure of `pod` in `failures` (status.replicaFailures), dropping the
// windows that ended by `now`.
ReplicaFailureCount count_replica_failure(std::map<std::string, api::ReplicaFailures> failures,
                                          const std::string& pod, api::Time now);

// restartScope Replica: the decision for lost replicas (in.pods.lost()), completing `d` (which
// carries in.replica_failures). A retryable exit kGroupRestartExitCode, else the first replica
// that keeps failing, restarts the whole group (disruptions counted, one failure spent, a
// recovery under way abandoned); otherwise disrupted replicas are replaced without spending the
// budget, then each retryable failure spends one and is replaced, until backoffLimit is
// exceeded (the job fails; the replacements decided before it stand).
RestartDecision decide_replica_scope(const RestartInput& in, RestartDecision d);

// Marks the start of a recovery (the group is short): Recovering=True with `reason` and
// `message`, recoveringSince = now unless a recovery is already under way. Counts one recovery.
void begin_recovery(api::TrainingJobStatus& st, std::string_view reason, const std::string& message,
                    api::Time now);

// The group is whole again: Recovering=False (ReplicasRecovered), lastRecoveryMilliseconds set.
// Returns the recovery's duration in seconds, or nullopt when no recovery was under way.
std::optional<double> end_recovery(api::TrainingJobStatus& st, int replicas, api::Time now);

// A recovery ends without the group being whole (a Group restart, the job finished):
// Recovering=False with `reason`; nothing is measured.
void abandon_recovery(api::TrainingJobStatus& st, std::string_view reason,
                      const std::string& message, api::Time now);

}  // namespace longhaul::controller
