// Which TrainingJob controls an object: the one ownerReference walk shared by the controller
// (a pod, Service or claim event enqueues its job) and the reconciler (only the job's own pods
// count). children.h's owner_reference() writes the reference this reads.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace longhaul::controller {

// The ownerReference of `object` with controller: true and kind TrainingJob, or null when it has
// none (the API server allows at most one controller reference per object).
const nlohmann::json* controlling_job_reference(const nlohmann::json& object);

// Whether a TrainingJob controls `object`: by `job_uid` when it is known, else by `job_name`.
bool controlled_by_job(const nlohmann::json& object, const std::string& job_uid,
                       const std::string& job_name);

}  // namespace longhaul::controller
