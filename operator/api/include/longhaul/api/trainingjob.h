// Typed view of the TrainingJob custom resource (longhaul.dev/v1alpha1), the C++ side of
// crds/trainingjobs.longhaul.dev.yaml.
//
// parse_spec() reads `spec` from the JSON document the API server returns, applies the same
// defaults as the CRD schema (so a job created without a defaulting API server behaves the
// same), and throws longhaul::InvalidArgument whose message starts with the field path, e.g.
//   "spec.replicaSpecs.Worker.replicas: must be >= 0".
// validate_runnable() adds the checks the schema cannot express (a name too long for pod
// hostnames, and every rule the API server applies to the pods built from the templates: see
// validation.h); the reconciler turns those errors into the Failed condition with reason
// InvalidSpec before creating anything, instead of crash-looping.
//
// Status is parsed leniently (the operator reads back what it wrote) and serialised with
// to_json(); equal statuses serialise to equal JSON, which is how the reconciler skips writes.
//
// Thread-safety: plain values; no shared state.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace longhaul::api {

using json = nlohmann::json;
using Time = std::chrono::system_clock::time_point;

inline constexpr std::string_view kGroup = "longhaul.dev";
inline constexpr std::string_view kVersion = "v1alpha1";
inline constexpr std::string_view kApiVersion = "longhaul.dev/v1alpha1";
inline constexpr std::string_view kKind = "TrainingJob";

// Labels and annotations the operator puts on the objects it owns.
inline constexpr std::string_view kLabelJobName = "longhaul.dev/job-name";
inline constexpr std::string_view kLabelReplicaType = "longhaul.dev/replica-type";
inline constexpr std::string_view kLabelReplicaIndex = "longhaul.dev/replica-index";
inline constexpr std::string_view kLabelRole = "longhaul.dev/role";
inline constexpr std::string_view kRoleChief = "chief";
inline constexpr std::string_view kAnnotationRestartAttempt = "longhaul.dev/restart-attempt";
// Container restarts of this pod already counted against backoffLimit (restartPolicy OnFailure):
// the operator patches it on after the status write that counted them.
inline constexpr std::string_view kAnnotationCountedRestarts = "longhaul.dev/counted-restarts";

// The largest supported job: at most this many replicas of each type (the CRD's maximum too),
// and one Chief: 3,001 pods. Status does not grow with the job (see TrainingJobStatus).
inline constexpr int32_t kMaxReplicasPerType = 1000;
// status.podStatuses lists at most this many pods (the CRD's maxItems).
inline constexpr size_t kMaxPodStatuses = 32;

enum class ReplicaType { kChief, kWorker, kPS, kEvaluator };
inline constexpr ReplicaType kAllReplicaTypes[] = {ReplicaType::kChief, ReplicaType::kWorker,
                                                   ReplicaType::kPS, ReplicaType::kEvaluator};
std::string_view replica_type_name(ReplicaType t);   // "Chief", "Worker", "PS", "Evaluator"
std::string_view replica_type_label(ReplicaType t);  // "chief", "worker", "ps", "evaluator"
std::optional<ReplicaType> parse_replica_type(std::string_view name_or_label);

enum class RestartPolicy { kNever, kOnFailure, kExitCode };
// Replica re-creates only the lost replica (same name, rank and LONGHAUL_RESTART_ATTEMPT: it
// rejoins the survivors in place); Group re-creates every replica. "Pod" is read as Replica.
enum class RestartScope { kGroup, kReplica };
enum class CleanPodPolicy { kRunning, kAll, kNone };
enum class SuccessPolicy { kChiefSucceeds, kAllWorkers };
enum class ReclaimPolicy { kRetain, kDelete };

struct ReplicaSpec {
  int32_t replicas = 1;
  json pod_template = json::object();  // PodTemplateSpec {metadata, spec}
  RestartPolicy restart_policy = RestartPolicy::kExitCode;
};

// spec.progressIntervalSeconds: default and bounds (the CRD's too).
inline constexpr int32_t kDefaultProgressIntervalSeconds = 30;
inline constexpr int32_t kMinProgressIntervalSeconds = 5;
inline constexpr int32_t kMaxProgressIntervalSeconds = 86400;

struct LogdirSpec {
  std::string claim_name;  // non-empty: mount this existing claim, create nothing
  std::string storage_class_name;
  std::string size = "10Gi";
  std::vector<std::string> access_modes = {"ReadWriteMany"};
  std::string mount_path = "/logdir";
  ReclaimPolicy reclaim_policy = ReclaimPolicy::kRetain;
};

struct BackoffSpec {
  int32_t initial_seconds = 10;
  int32_t max_seconds = 300;
};

struct RunPolicy {
  int32_t backoff_limit = 6;
  RestartScope restart_scope = RestartScope::kReplica;
  std::vector<int32_t> retryable_exit_codes;
  std::vector<int32_t> permanent_exit_codes;
  BackoffSpec backoff;
  int32_t node_lost_timeout_seconds = 120;
  std::optional<int64_t> active_deadline_seconds;
  std::optional<int32_t> ttl_seconds_after_finished;
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kRunning;
  bool suspend = false;
};

struct TrainingJobSpec {
  std::map<ReplicaType, ReplicaSpec> replica_specs;  // only the types present in the manifest
  LogdirSpec logdir;
  RunPolicy run_policy;
  SuccessPolicy success_policy = SuccessPolicy::kChiefSucceeds;
  // How often the operator reads the chief's training progress and, at most, rewrites
  // status.progress (see controller/progress.h).
  int32_t progress_interval_seconds = kDefaultProgressIntervalSeconds;

  // The chief: Chief 0 when a Chief replica exists, else Worker 0. nullopt when neither has
  // replicas (validate_runnable rejects that).
  std::optional<std::pair<ReplicaType, int>> chief() const;
  int32_t total_replicas() const;
};

// Parses `spec` (the object under the resource's "spec" key). Throws InvalidArgument naming the
// field path on any type or range error.
TrainingJobSpec parse_spec(const json& spec);
// Checks what the schema cannot: containers present, names fit DNS labels, a chief exists.
// Throws InvalidArgument naming the field path.
void validate_runnable(const TrainingJobSpec& spec, std::string_view job_name);
json to_json(const TrainingJobSpec& spec);

// ---- status ----

namespace phase {
inline constexpr std::string_view kPending = "Pending";
inline constexpr std::string_view kRunning = "Running";
inline constexpr std::string_view kRestarting = "Restarting";
inline constexpr std::string_view kSucceeded = "Succeeded";
inline constexpr std::string_view kFailed = "Failed";
inline constexpr std::string_view kSuspended = "Suspended";
}  // namespace phase

namespace condition {
inline constexpr std::string_view kCreated = "Created";
inline constexpr std::string_view kRunning = "Running";
inline constexpr std::string_view kRestarting = "Restarting";
inline constexpr std::string_view kSucceeded = "Succeeded";
inline constexpr std::string_view kFailed = "Failed";
inline constexpr std::string_view kSuspended = "Suspended";
// restartScope Replica: True while replicas are being replaced in place (the group is short).
inline constexpr std::string_view kRecovering = "Recovering";
}  // namespace condition

// Condition reasons (also used as Event reasons).
namespace reason {
inline constexpr std::string_view kJobCreated = "TrainingJobCreated";
inline constexpr std::string_view kAllReplicasRunning = "AllReplicasRunning";
inline constexpr std::string_view kReplicasPending = "ReplicasPending";
inline constexpr std::string_view kPreempted = "PodPreempted";  // disruption: no budget spent
inline constexpr std::string_view kPodDeleted = "PodDeletedExternally";
inline constexpr std::string_view kRetryableExit = "RetryableExitCode";
inline constexpr std::string_view kContainerRestarted = "ContainerRestarted";
inline constexpr std::string_view kRestartDone = "RestartCompleted";
inline constexpr std::string_view kChiefSucceeded = "ChiefSucceeded";
inline constexpr std::string_view kAllWorkersSucceeded = "AllWorkersSucceeded";
inline constexpr std::string_view kPermanentExit = "PermanentExitCode";
inline constexpr std::string_view kPodFailedNeverRestart = "PodFailedRestartPolicyNever";
inline constexpr std::string_view kBackoffLimitExceeded = "BackoffLimitExceeded";
inline constexpr std::string_view kDeadlineExceeded = "DeadlineExceeded";
inline constexpr std::string_view kInvalidSpec = "InvalidSpec";
inline constexpr std::string_view kSuspended = "JobSuspended";
inline constexpr std::string_view kResumed = "JobResumed";
// Created=False: the API server refused a create (quota, admission, unavailable); retried.
inline constexpr std::string_view kFailedCreate = "FailedCreate";
// Recovering=False: every replica runs again after in-place replacements.
inline constexpr std::string_view kReplicasRecovered = "ReplicasRecovered";
// restartScope Replica fell back to a Group restart: a replica kept failing, or a replica
// asked for it (exit 138: the survivors gave up waiting for a replacement).
inline constexpr std::string_view kReplicaKeepsFailing = "ReplicaKeepsFailing";
inline constexpr std::string_view kGroupRestartRequested = "GroupRestartRequested";
// Event-only reasons.
inline constexpr std::string_view kCreatedPod = "CreatedPod";
inline constexpr std::string_view kDeletedPod = "DeletedPod";
inline constexpr std::string_view kForceDeletedPod = "ForceDeletedPod";
inline constexpr std::string_view kCreatedService = "CreatedService";
inline constexpr std::string_view kCreatedClaim = "CreatedClaim";
inline constexpr std::string_view kTtlExpired = "TTLExpired";
inline constexpr std::string_view kCleanedUpPods = "CleanedUpPods";
}  // namespace reason

struct Condition {
  std::string type;
  std::string status;  // "True", "False", "Unknown"
  std::string reason;
  std::string message;
  std::string last_transition_time;  // RFC 3339
  bool operator==(const Condition&) const = default;
};

struct ReplicaStatus {
  // Replicas of this type the operator manages (spec replicas at the last write). Pod names with
  // an index below it are known to status.unsettledPods: absent there means "settled".
  int32_t replicas = 0;
  int32_t active = 0;  // pods of the current incarnation not finished
  int32_t ready = 0;
  int32_t succeeded = 0;
  int32_t failed = 0;
  bool operator==(const ReplicaStatus&) const = default;
};

// What the operator knows about one pod name. Most of it lives on the pod itself (the
// restart-attempt and counted-restarts annotations); status.unsettledPods keeps a record only
// while the pod does not show it yet (see TrainingJobStatus::pods).
struct PodRecord {
  int64_t restart_attempt = 0;     // the incarnation wanted under this name
  bool created = false;            // that incarnation was observed in the cluster
  int32_t container_restarts = 0;  // container restarts already added to failureCount
  bool operator==(const PodRecord&) const = default;
};

// In-place replacements after failures of one replica within the fallback window
// (restartScope Replica; see controller/recovery_policy.h).
struct ReplicaFailures {
  int32_t count = 0;
  std::string since;  // RFC 3339: the first failure of the window
  bool operator==(const ReplicaFailures&) const = default;
};

// The chief's training progress as the operator last recorded it (status.progress), read from
// the chief's Prometheus metrics. Absent until the first successful read.
struct TrainingProgress {
  int64_t step = 0;                  // the chief's global step
  int64_t max_steps = 0;             // training.max_steps; 0 when the chief does not say
  int64_t last_checkpoint_step = 0;  // 0 with last_checkpoint_time empty: none yet
  std::string last_checkpoint_time;  // RFC 3339
  std::string observed_time;         // RFC 3339: when the operator recorded these values
  std::string steps;                 // "1200/5000" (the STEP column); "1200" without max_steps
  // The pod these values were read from: the one holding the chief role, which after the
  // TF_CONFIG chief was lost and replaced in place is a promoted worker (status.chiefPod still
  // names the TF_CONFIG chief).
  std::string pod;
  // The training rate and what it predicts, from the chief's step between two reads (smoothed;
  // 3 significant digits). 0 / empty: not known, or the step did not move since the last read.
  double steps_per_second = 0;
  std::string eta;                        // time left to max_steps at that rate: "2h05m", "40s"
  std::string estimated_completion_time;  // RFC 3339: when max_steps is reached at that rate
  std::string last_step_time;  // RFC 3339: when the step last moved (first seen; exact at exit)
  bool operator==(const TrainingProgress&) const = default;
};

struct TrainingJobStatus {
  std::string phase;
  std::vector<Condition> conditions;
  std::map<std::string, ReplicaStatus> replica_statuses;  // keyed "Chief", "Worker", ...
  // status.unsettledPods, keyed by pod name: per-pod decisions the pods do not show yet (an
  // incarnation not yet seen created, container restarts counted but not yet annotated). The
  // reconciler derives every other pod's record from the pod itself (reconciler.cc), so the map
  // is empty once a job has converged. Serialised compactly: pods "<job>-<type>-<i>" with equal
  // records share one key "<job>-<type>-[0-6,9-999]".
  std::map<std::string, PodRecord> pods;
  // True when `pods` was read from status.pods, written by operators before unsettledPods: a
  // record for every pod name the job had (absent: a new name). Written back as it was read.
  bool legacy_pods = false;
  // The pods that matter (status.podStatuses), at most kMaxPodStatuses: the chief first, then
  // failed pods, then pods not running (pending, terminating, not created), in rank order;
  // running pods are counted in replicaStatuses only. podStatusesOmitted counts the pods that
  // matter but did not fit.
  struct PodStatus {
    std::string name;
    std::string phase;   // the pod's phase; "Pending" too for a pod not created yet
    std::string reason;  // e.g. ImagePullBackOff, "Error (exit code 1)", Terminating, NotCreated
    bool operator==(const PodStatus&) const = default;
  };
  std::vector<PodStatus> pod_statuses;
  int32_t pod_statuses_omitted = 0;
  std::string ready;  // "3/4", for the printer column
  int32_t restart_count = 0;
  int32_t preemption_count = 0;
  int32_t failure_count = 0;
  std::string failure_budget;  // "2/6"
  std::string chief_pod;
  int64_t restart_attempt = 0;
  // The attempt of the last whole-group (re)start: pods get it as LONGHAUL_RESTART_ATTEMPT, so a
  // replica replaced in place rejoins the survivors' rendezvous. nullopt (a status written
  // before the field existed): each pod's own record attempt, as then.
  std::optional<int64_t> group_restart_attempt;
  // restartScope Replica: replicas replaced in place, when the current recovery began (RFC 3339
  // with microseconds; empty when the group is whole), how long the last one took (fault
  // observed -> every replica Running again), and recent failures per pod name.
  int32_t recoveries = 0;
  std::string recovering_since;
  std::optional<int64_t> last_recovery_milliseconds;
  std::map<std::string, ReplicaFailures> replica_failures;
  std::string next_restart_time;
  int64_t observed_generation = 0;
  std::string start_time;
  std::string completion_time;
  std::optional<TrainingProgress> progress;
  bool operator==(const TrainingJobStatus&) const = default;
};

TrainingJobStatus parse_status(const json& status);  // lenient: missing fields take defaults
json to_json(const TrainingJobStatus& status);

// Sets condition `type`. lastTransitionTime changes only when `status` changes; reason and
// message are updated in place. Returns true when anything changed.
bool set_condition(TrainingJobStatus& s, std::string_view type, std::string_view status,
                   std::string_view reason, std::string_view message, Time now);
const Condition* find_condition(const TrainingJobStatus& s, std::string_view type);
bool condition_true(const TrainingJobStatus& s, std::string_view type);
bool is_finished(const TrainingJobStatus& s);  // phase Succeeded or Failed

// RFC 3339 in UTC with second precision ("2026-11-21T13:20:39Z"), as Kubernetes writes times.
std::string format_time(Time t);
// With microseconds ("2026-11-21T13:20:39.123456Z"), Kubernetes' MicroTime.
std::string format_micro_time(Time t);
// Accepts fractional seconds and "Z" or numeric offsets. Throws InvalidArgument.
Time parse_time(std::string_view text);
std::optional<Time> parse_time_or_null(std::string_view text);

}  // namespace longhaul::api
