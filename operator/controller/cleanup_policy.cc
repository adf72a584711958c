// Clean-up policy (see cleanup_policy.h).
#include "longhaul/controller/cleanup_policy.h"

namespace longhaul::controller {

bool should_clean_pod(api::CleanPodPolicy policy, bool deadline_exceeded,
                      const nlohmann::json& pod) {
  const auto& md = pod.value("metadata", nlohmann::json::object());
  if (md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null()) return false;
  const std::string phase = pod.value("status", nlohmann::json::object()).value("phase", "");
  const bool finished = phase == "Succeeded" || phase == "Failed";
  if (policy == api::CleanPodPolicy::kAll) return true;
  if (policy == api::CleanPodPolicy::kNone && !deadline_exceeded) return false;
  return !finished;
}

std::optional<std::chrono::system_clock::duration> ttl_remaining(
    const api::RunPolicy& policy, const api::TrainingJobStatus& status, api::Time now) {
  if (!policy.ttl_seconds_after_finished || !api::is_finished(status)) return std::nullopt;
  const auto done = api::parse_time_or_null(status.completion_time);
  if (!done) return std::nullopt;
  return *done + std::chrono::seconds(*policy.ttl_seconds_after_finished) - now;
}

}  // namespace longhaul::controller
