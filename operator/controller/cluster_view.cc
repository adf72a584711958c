// The reconciler's reads of the cluster (see cluster_view.h).
#include "longhaul/controller/cluster_view.h"

#include "longhaul/api/trainingjob.h"
#include "longhaul/kube/selector.h"

namespace longhaul::controller {

namespace res = kube::resources;

json ApiClusterView::get_job(const std::string& ns, const std::string& name) {
  return client_.get(res::kTrainingJobs, ns, name);
}

std::vector<json> ApiClusterView::list_pods(const std::string& ns, const std::string& job) {
  kube::ListOptions opts;
  opts.label_selector = std::string(api::kLabelJobName) + "=" + job;
  json list = client_.list(res::kPods, ns, opts);
  std::vector<json> out;
  for (json& item : list.value("items", json::array())) out.push_back(std::move(item));
  return out;
}

bool ApiClusterView::exists(const kube::Resource& r, const std::string& ns,
                            const std::string& name) {
  try {
    client_.get(r, ns, name);
    return true;
  } catch (const kube::NotFoundError&) {
    return false;
  }
}

namespace {

const std::string& resource_version(const json& object) {
  static const std::string none;
  const auto md = object.find("metadata");
  if (md == object.end()) return none;
  const auto rv = md->find("resourceVersion");
  return rv != md->end() && rv->is_string() ? rv->get_ref<const std::string&>() : none;
}

}  // namespace

void JobVersions::saw(const json& job) {
  const std::string& rv = resource_version(job);
  MutexLock lock(mu_);
  awaited_[kube::object_key(job)] = rv;
}

void JobVersions::conflicted(const std::string& key) {
  MutexLock lock(mu_);
  awaited_[key] = "";
}

void JobVersions::forget(const std::string& key) {
  MutexLock lock(mu_);
  awaited_.erase(key);
}

bool JobVersions::usable(const std::string& key, const json* cached) {
  if (cached == nullptr) return false;
  MutexLock lock(mu_);
  const auto it = awaited_.find(key);
  if (it == awaited_.end()) return true;
  if (it->second.empty() || it->second != resource_version(*cached)) return false;
  awaited_.erase(it);  // the cache has caught up
  return true;
}

size_t JobVersions::awaited() const {
  MutexLock lock(mu_);
  return awaited_.size();
}

json InformerClusterView::get_job(const std::string& ns, const std::string& name) {
  const std::string key = kube::object_key(ns, name);
  for (const auto& inf : job_informers_) {
    if (const kube::ObjectPtr cached = inf->store().get(key);
        cached != nullptr && versions_.usable(key, cached.get())) {
      return *cached;
    }
  }
  // Not cached yet (or gone), or older than what the operator wrote: the API has it. The cache
  // is used again once it shows this version.
  json job = client_.get(res::kTrainingJobs, ns, name);
  versions_.saw(job);
  return job;
}

void InformerClusterView::wrote_job(const json& job) { versions_.saw(job); }

void InformerClusterView::job_write_conflicted(const std::string& ns, const std::string& name) {
  versions_.conflicted(kube::object_key(ns, name));
}

void InformerClusterView::forget_job(const std::string& ns, const std::string& name) {
  versions_.forget(kube::object_key(ns, name));
}

std::vector<json> InformerClusterView::list_pods(const std::string& ns, const std::string& job) {
  const auto selector = kube::LabelSelector::parse(std::string(api::kLabelJobName) + "=" + job);
  std::vector<json> out;
  for (const auto& inf : pod_informers_) {
    for (const kube::ObjectPtr& p : inf->store().list(ns, selector)) out.push_back(*p);
  }
  return out;
}

bool InformerClusterView::exists(const kube::Resource& r, const std::string& ns,
                                 const std::string& name) {
  for (const auto& inf : child_informers_) {
    const kube::ObjectPtr obj = inf->store().get(ns, name);
    if (obj != nullptr && obj->value("kind", r.kind) == r.kind) return true;
  }
  // From the cache only: the operator's Services and claims carry its label, and a claim the
  // user names is never looked up. An object of that name without the label answers the create
  // with 409 AlreadyExists, which the reconciler takes as "exists" (reconciler.h). Asking the
  // API here cost two GETs per new job (a 1,000-job start: 2,000 requests that found nothing).
  return false;
}

}  // namespace longhaul::controller
