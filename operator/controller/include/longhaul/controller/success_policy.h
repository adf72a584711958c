// Success policy: when a TrainingJob has succeeded.
//
// ChiefSucceeds: the chief pod (Chief 0, else Worker 0) of the current incarnation Succeeded.
// AllWorkers: every Worker replica (and the Chief, when there is one) Succeeded.
// Other replicas finishing with success do not finish the job and are not restarted.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/failure_policy.h"

namespace longhaul::controller {

// Outcome of each current pod, keyed by (type, index).
using PodOutcomes = std::map<std::pair<api::ReplicaType, int>, PodOutcome>;

struct SuccessDecision {
  std::string reason;   // api::reason::kChiefSucceeded / kAllWorkersSucceeded
  std::string message;  // "chief pod ns/job-chief-0 succeeded"
};

std::optional<SuccessDecision> job_succeeded(const api::TrainingJobSpec& spec,
                                             const PodOutcomes& outcomes,
                                             const std::string& chief_pod_ref);

}  // namespace longhaul::controller
