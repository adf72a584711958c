// Where the reconciler reads the cluster: the job, its pods, and whether a child object exists.
// ApiClusterView reads everything from the API server (tests, or a reconciler without caches);
// InformerClusterView, the operator's, serves pods, Services and claims from informer caches
// and still reads the job itself from the API.
//
// Thread-safety: both are safe for concurrent use (the client and the informer stores are).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/kube/client.h"
#include "longhaul/kube/informer.h"

namespace longhaul::controller {

using json = nlohmann::json;

class ClusterView {
 public:
  virtual ~ClusterView() = default;
  // Throws kube::NotFoundError when the job does not exist. Must be fresh enough that a status
  // the reconciler wrote is seen by its next reconcile (the API, not a lagging cache), because
  // the status write is guarded by resourceVersion anyway.
  virtual json get_job(const std::string& ns, const std::string& name) = 0;
  // Pods labelled longhaul.dev/job-name=<job> in `ns` (owner filtering is the reconciler's).
  virtual std::vector<json> list_pods(const std::string& ns, const std::string& job) = 0;
  // Whether the object exists (Service, PersistentVolumeClaim).
  virtual bool exists(const kube::Resource& r, const std::string& ns, const std::string& name) = 0;
};

// Reads everything with GET/LIST through `client`.
class ApiClusterView : public ClusterView {
 public:
  explicit ApiClusterView(kube::Client& client) : client_(client) {}
  json get_job(const std::string& ns, const std::string& name) override;
  std::vector<json> list_pods(const std::string& ns, const std::string& job) override;
  bool exists(const kube::Resource& r, const std::string& ns, const std::string& name) override;

 private:
  kube::Client& client_;
};

// Pods from `pod_informers`, Services and claims from `child_informers` (an object not cached,
// e.g. a claim the user named without our label, is asked of the API); the job from the API.
// The client and both lists must outlive the view; the lists may grow after construction.
class InformerClusterView : public ClusterView {
 public:
  using Informers = std::vector<std::unique_ptr<kube::Informer>>;
  InformerClusterView(kube::Client& client, const Informers& pod_informers,
                      const Informers& child_informers)
      : client_(client), pod_informers_(pod_informers), child_informers_(child_informers) {}
  json get_job(const std::string& ns, const std::string& name) override;
  std::vector<json> list_pods(const std::string& ns, const std::string& job) override;
  bool exists(const kube::Resource& r, const std::string& ns, const std::string& name) override;

 private:
  kube::Client& client_;
  const Informers& pod_informers_;
  const Informers& child_informers_;
};

}  // namespace longhaul::controller
