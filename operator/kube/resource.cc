// Resource paths and the resources the operator uses (see client.h).
#include "longhaul/kube/client.h"

namespace longhaul::kube {

std::string Resource::api_prefix() const {
  return group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
}

std::string Resource::collection_path(std::string_view ns) const {
  if (namespaced && !ns.empty()) {
    return api_prefix() + "/namespaces/" + std::string(ns) + "/" + plural;
  }
  return api_prefix() + "/" + plural;
}

std::string Resource::object_path(std::string_view ns, std::string_view name) const {
  return collection_path(ns) + "/" + std::string(name);
}

namespace resources {
const Resource kPods{"", "v1", "pods", true, "Pod"};
const Resource kServices{"", "v1", "services", true, "Service"};
const Resource kPersistentVolumeClaims{"", "v1", "persistentvolumeclaims", true,
                                       "PersistentVolumeClaim"};
const Resource kEvents{"", "v1", "events", true, "Event"};
const Resource kNodes{"", "v1", "nodes", false, "Node"};
const Resource kLeases{"coordination.k8s.io", "v1", "leases", true, "Lease"};
const Resource kTrainingJobs{"longhaul.dev", "v1alpha1", "trainingjobs", true, "TrainingJob"};
}  // namespace resources

}  // namespace longhaul::kube
