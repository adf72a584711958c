// Failure and restart policy: how a finished or disrupted pod of a TrainingJob is classified,
// and how long to back off before re-creating it.
//
// A pod is *disrupted* (preempted, evicted, node shutdown, deleted from under the operator) when
// it carries the DisruptionTarget condition, when status.reason names a disruption (Evicted,
// Preempted, Shutdown, Terminated, NodeShutdown, NodeLost), or when it is being deleted by
// someone else. Disruptions are restarted without spending backoffLimit, whatever the exit code.
// Otherwise a Failed pod is classified by its first non-zero container exit code:
// permanentExitCodes fail the job, retryableExitCodes retry, then by default 128-255 (signals:
// 137 OOM/SIGKILL, 143 SIGTERM, 138 peer lost) retry and 1-127 fail. A pod whose replica has
// restartPolicy Never fails the job on any non-disruption failure.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"

namespace longhaul::controller {

using json = nlohmann::json;

enum class PodOutcome {
  kActive,            // pending or running (or finished Succeeded on a non-deciding replica)
  kSucceeded,         // phase Succeeded
  kDisrupted,         // preempted / evicted / node shutdown / deleted: restart, no budget
  kRetryableFailure,  // restart, spends one failure of backoffLimit
  kPermanentFailure,  // fails the job
};
std::string_view outcome_name(PodOutcome o);

struct PodClassification {
  PodOutcome outcome = PodOutcome::kActive;
  std::string reason;   // a condition/Event reason constant from longhaul::api::reason
  std::string message;  // "pod ns/job-worker-1 container trainer exited with code 137 ..."
  std::optional<int> exit_code;
};

// Returns the disruption reason ("PreemptionByScheduler", "Evicted", "Deleted", ...) when the
// pod was disrupted, else nullopt. A deletionTimestamp counts only when `deleted_by_us` is false.
std::optional<std::string> disruption_reason(const json& pod);

enum class ExitCodeClass { kRetryable, kPermanent };
ExitCodeClass classify_exit_code(int code, const api::RunPolicy& policy);

// The first non-zero terminated exit code of the pod's containers (current state, then last
// state), with the container's name. nullopt when no container terminated non-zero.
std::optional<std::pair<std::string, int>> failed_container(const json& pod);

// Sum of containerStatuses[].restartCount (in-place restarts by the kubelet).
int32_t container_restarts(const json& pod);

PodClassification classify_pod(const json& pod, const api::ReplicaSpec& replica,
                               const api::RunPolicy& policy);

// Delay before the restart that follows the n-th consecutive failure (n >= 1):
// min(max, initial * 2^(n-1)) scaled by a jitter factor in [1, 1.2) from `jitter01` in [0, 1),
// capped again at maxSeconds. n == 0 (a disruption) gives zero.
std::chrono::milliseconds restart_backoff(const api::BackoffSpec& backoff, int n, double jitter01);

}  // namespace longhaul::controller
