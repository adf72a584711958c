// Success policy (see success_policy.h).
#include "longhaul/controller/success_policy.h"

namespace longhaul::controller {

std::optional<SuccessDecision> job_succeeded(const api::TrainingJobSpec& spec,
                                             const PodOutcomes& outcomes,
                                             const std::string& chief_pod_ref) {
  auto succeeded = [&](api::ReplicaType t, int i) {
    auto it = outcomes.find({t, i});
    return it != outcomes.end() && it->second == PodOutcome::kSucceeded;
  };
  const auto chief = spec.chief();
  if (!chief) return std::nullopt;
  if (spec.success_policy == api::SuccessPolicy::kChiefSucceeds) {
    if (!succeeded(chief->first, chief->second)) return std::nullopt;
    return SuccessDecision{std::string(api::reason::kChiefSucceeded),
                           "chief pod " + chief_pod_ref + " succeeded"};
  }
  int workers = 0;
  for (api::ReplicaType t : {api::ReplicaType::kChief, api::ReplicaType::kWorker}) {
    auto it = spec.replica_specs.find(t);
    if (it == spec.replica_specs.end()) continue;
    for (int i = 0; i < it->second.replicas; ++i) {
      if (!succeeded(t, i)) return std::nullopt;
      ++workers;
    }
  }
  if (workers == 0) return std::nullopt;
  return SuccessDecision{std::string(api::reason::kAllWorkersSucceeded),
                         "all " + std::to_string(workers) + " chief and worker pods succeeded"};
}

}  // namespace longhaul::controller
