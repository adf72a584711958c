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

json InformerClusterView::get_job(const std::string& ns, const std::string& name) {
  return client_.get(res::kTrainingJobs, ns, name);
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
