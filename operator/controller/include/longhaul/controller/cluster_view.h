// Where the reconciler reads the cluster: the job, its pods, and whether a child object exists.
// ApiClusterView reads everything from the API server (tests, or a reconciler without caches);
// InformerClusterView, the operator's, serves everything from informer caches, the job included
// unless the cache has not yet caught up with the operator's own last write of it (JobVersions).
//
// Thread-safety: both are safe for concurrent use (the client and the informer stores are).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/client.h"
#include "longhaul/kube/informer.h"

namespace longhaul::controller {

using json = nlohmann::json;

// The versions of jobs that a cached copy must show before it may be used: the operator's own
// last write of each job (or the last version it read from the API). A reconcile that read the
// job from a cache lagging behind the operator's last status write would decide on a status
// older than its own decisions and could act on it without writing (nothing would stop it: the
// status write, guarded by resourceVersion, is the only write that fails on a stale object), so
// such a read goes to the API instead. resourceVersions are compared for equality only (API
// conventions: they are opaque): any other version in the cache means "read from the API", and
// that version is then awaited.
class JobVersions {
 public:
  // `job` (as the API server returned it) is the newest version the operator knows.
  void saw(const json& job);
  // A write of the job answered 409 Conflict: the next read goes to the API.
  void conflicted(const std::string& key);
  void forget(const std::string& key);
  // Whether `cached` (null: not in the cache) may be used for `key`. A cache that shows the
  // awaited version has caught up: nothing is awaited any more for that job.
  bool usable(const std::string& key, const json* cached);
  size_t awaited() const;  // jobs whose cached copy is not yet usable (tests, diagnostics)

 private:
  mutable Mutex mu_;
  // "ns/name" -> resourceVersion ("" = any read)
  std::map<std::string, std::string> awaited_ GUARDED_BY(mu_);
};

class ClusterView {
 public:
  virtual ~ClusterView() = default;
  // Throws kube::NotFoundError when the job does not exist. Must be at least as fresh as the
  // reconciler's own last write of the job (wrote_job): a reconcile must never decide on a
  // status older than its own previous decisions.
  virtual json get_job(const std::string& ns, const std::string& name) = 0;
  // The reconciler wrote the job (the API server's answer), or a write of it answered 409, or
  // the job is gone. A view that caches jobs uses these to know when its copy is fresh enough.
  virtual void wrote_job(const json& /*job*/) {}
  virtual void job_write_conflicted(const std::string& /*ns*/, const std::string& /*name*/) {}
  virtual void forget_job(const std::string& /*ns*/, const std::string& /*name*/) {}
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

// Jobs from `job_informers` (from the API when the cache lags behind the operator's own write or
// does not have the job), pods from `pod_informers`, Services and claims from `child_informers`
// (cached only: they carry the operator's label; see exists()). The client and the lists must
// outlive the view; the lists may grow after construction.
class InformerClusterView : public ClusterView {
 public:
  using Informers = std::vector<std::unique_ptr<kube::Informer>>;
  InformerClusterView(kube::Client& client, const Informers& job_informers,
                      const Informers& pod_informers, const Informers& child_informers)
      : client_(client),
        job_informers_(job_informers),
        pod_informers_(pod_informers),
        child_informers_(child_informers) {}
  json get_job(const std::string& ns, const std::string& name) override;
  void wrote_job(const json& job) override;
  void job_write_conflicted(const std::string& ns, const std::string& name) override;
  void forget_job(const std::string& ns, const std::string& name) override;
  std::vector<json> list_pods(const std::string& ns, const std::string& job) override;
  bool exists(const kube::Resource& r, const std::string& ns, const std::string& name) override;

 private:
  kube::Client& client_;
  const Informers& job_informers_;
  const Informers& pod_informers_;
  const Informers& child_informers_;
  JobVersions versions_;
};

}  // namespace longhaul::controller
