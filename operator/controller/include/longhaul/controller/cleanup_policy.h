// Clean-up policy: what happens to pods and the job itself once a TrainingJob finished.
//
// cleanPodPolicy Running deletes pods still pending or running (finished pods stay for their
// logs), All deletes every pod, None keeps them. A job failed by activeDeadlineSeconds always
// stops its running pods (as a Kubernetes Job does), even under None.
// ttlSecondsAfterFinished deletes the job (and, by owner references, its pods, its Service and a
// claim with reclaimPolicy Delete) that long after completionTime.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"

namespace longhaul::controller {

// Whether `pod` (not already being deleted) is removed after the job finished.
bool should_clean_pod(api::CleanPodPolicy policy, bool deadline_exceeded,
                      const nlohmann::json& pod);

// Time left until the job is deleted; zero or negative: delete now; nullopt: never (no TTL or
// not finished).
std::optional<std::chrono::system_clock::duration> ttl_remaining(
    const api::RunPolicy& policy, const api::TrainingJobStatus& status, api::Time now);

}  // namespace longhaul::controller
