// Restart policy: what a reconcile pass decides from the pods it classified (failure_policy.h):
// the job succeeded, failed, or restarts, and how.
//
// In this order: the success policy (success_policy.h) wins; then a permanent failure fails the
// job; then failures already past backoffLimit (container restarts in place, counted before the
// decision) fail it; then a lost pod (disrupted, or failed with a retryable exit) restarts by
// restartScope:
// - Group: a disruption restarts the whole group at once without spending backoffLimit (every
//   disrupted pod counts one preemption); else one retryable failure spends one failure and
//   restarts the group after the failure backoff, or fails the job past backoffLimit.
// - Replica: lost replicas are replaced in place, or the whole group restarts
//   (recovery_policy.h says when).
//
// The decision is a value: the reconciler applies it to the status (counters, conditions,
// records), the pods and the Events, in the order the fields are listed in RestartDecision.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/failure_policy.h"
#include "longhaul/controller/success_policy.h"

namespace longhaul::controller {

// A current pod that finished or was disrupted, with its classification.
struct LostPod {
  std::string name;  // the pod's name ("j-worker-1")
  PodClassification c;
};

// What the current pods of a job show: each one's outcome, and the lost ones by kind, in rank
// order (chief first).
struct ClassifiedPods {
  PodOutcomes outcomes;
  std::vector<LostPod> disrupted, retryable, permanent;
  bool lost() const { return !disrupted.empty() || !retryable.empty(); }
};

// What a restart decision reads. References must outlive the call.
struct RestartInput {
  const api::TrainingJobSpec& spec;
  const ClassifiedPods& pods;
  std::string chief_pod_ref;  // "ns/j-chief-0", for the success message
  // status.failureCount, this pass's container restarts in place included.
  int32_t failure_count = 0;
  // "ns/pod": the last pod that restarted containers in place (the budget message).
  std::string container_restart_pod_ref;
  std::map<std::string, api::ReplicaFailures> replica_failures;  // status.replicaFailures
  api::Time now;
};

// What a pass decided; empty (no field set, zero counts) when nothing is to be done.
struct RestartDecision {
  struct Reason {
    std::string reason, message;
    bool operator==(const Reason&) const = default;
  };
  struct Replacement {
    std::string pod, reason, message;  // message: why, without the "replacing ..." part
    bool operator==(const Replacement&) const = default;
  };
  struct GroupRestart {
    std::string reason, message;
    bool after_backoff = false;  // after the failure backoff (restart_backoff), else at once
    bool operator==(const GroupRestart&) const = default;
  };
  struct Finish {
    std::string phase, reason, message;
    bool operator==(const Finish&) const = default;
  };

  int32_t disruptions = 0;  // added to status.preemptionCount
  int32_t failures = 0;     // added to status.failureCount
  // status.replicaFailures as the decision leaves it.
  std::map<std::string, api::ReplicaFailures> replica_failures;
  // A recovery in place under way ends without the group whole (Recovering=False).
  std::optional<Reason> abandoned_recovery;
  // Replicas re-created alone, in this order (restartScope Replica).
  std::vector<Replacement> replacements;
  std::optional<GroupRestart> group_restart;
  // The job finishes (after the replacements above, when a later failure ran out of budget).
  std::optional<Finish> finish;

  bool operator==(const RestartDecision&) const = default;
};

RestartDecision decide_restart(const RestartInput& in);

// Failed with BackoffLimitExceeded: "backoffLimit 3 exceeded (4 failures): <what>".
RestartDecision::Finish budget_exceeded(int32_t backoff_limit, int32_t failures,
                                        const std::string& what);

// ", failures 2/6": how much of backoffLimit is spent, appended to a restart's message.
std::string failures_spent(int32_t failures, int32_t backoff_limit);

}  // namespace longhaul::controller
