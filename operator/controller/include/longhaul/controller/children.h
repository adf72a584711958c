// The objects a TrainingJob owns, built from its spec: the pods `<job>-<type>-<index>`, the
// headless Service `<job>` that gives every pod the stable DNS name
// `<pod>.<job>.<namespace>.svc`, and the logdir PersistentVolumeClaim `<job>-logdir`.
//
// Every pod gets: the template's metadata and spec; labels longhaul.dev/job-name,
// replica-type, replica-index (and longhaul.dev/role=chief on the chief); the annotation
// longhaul.dev/restart-attempt; a controller ownerReference to the job; hostname = pod name and
// subdomain = Service name; restartPolicy from the replica spec (Never for Never/ExitCode: the
// operator re-creates pods itself; OnFailure for OnFailure); the logdir volume mounted at
// logdir.mountPath in every container; and the env TF_CONFIG (Kubeflow's format, every replica
// type listed), LONGHAUL_JOB_NAME, LONGHAUL_REPLICA_TYPE, LONGHAUL_REPLICA_INDEX, LONGHAUL_RANK
// (chief 0, then workers; -1 for PS and Evaluator), LONGHAUL_WORLD_SIZE (chief + workers),
// LONGHAUL_CHIEF_ADDRESS (host:port), LONGHAUL_RESTART_ATTEMPT, LONGHAUL_LOGDIR.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"

namespace longhaul::controller {

using json = nlohmann::json;

inline constexpr int kDefaultPort = 2222;
inline constexpr std::string_view kPortName = "longhaul";
inline constexpr std::string_view kLogdirVolume = "longhaul-logdir";

std::string pod_name(std::string_view job, api::ReplicaType type, int index);
std::string service_name(std::string_view job);
// claimName when given, else "<job>-logdir".
std::string claim_name(std::string_view job, const api::TrainingJobSpec& spec);
// The replica's port: the first container port named "longhaul", else the first container's
// first port, else 2222.
int replica_port(const api::ReplicaSpec& replica);
// "<pod>.<service>.<ns>.svc"
std::string pod_host(std::string_view job, std::string_view ns, api::ReplicaType type, int index);

// {"cluster":{"chief":[...],"worker":[...],...},"task":{"type":..,"index":..},"environment":"cloud"}
json tf_config(std::string_view job, std::string_view ns, const api::TrainingJobSpec& spec,
               api::ReplicaType type, int index);

// A controller ownerReference pointing at `job` (apiVersion, kind, name, uid).
json owner_reference(const json& job);

// `restart_attempt` is the pod's incarnation (the restart-attempt annotation);
// `rendezvous_attempt` (default: the same) is its LONGHAUL_RESTART_ATTEMPT, the attempt of the
// group it joins: a replica replaced in place keeps the survivors' attempt.
json build_pod(const json& job, const api::TrainingJobSpec& spec, api::ReplicaType type, int index,
               int64_t restart_attempt, std::optional<int64_t> rendezvous_attempt = std::nullopt);
json build_service(const json& job, const api::TrainingJobSpec& spec);
// The claim is owned by the job only with reclaimPolicy Delete, so Retain keeps it after the
// job is deleted.
json build_claim(const json& job, const api::TrainingJobSpec& spec);

}  // namespace longhaul::controller
