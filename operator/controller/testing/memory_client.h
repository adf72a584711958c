// MemoryClient: an in-memory kube::Client for the reconciler's unit tests (tests only). It keeps
// objects per resource/namespace/name with resourceVersions (409 on stale updates and on
// creating an existing name), the status subresource, equality label selectors, and counts
// writes. Pods deleted with a grace period stay Terminating (deletionTimestamp set) when
// `graceful_pod_deletion` is on, like pods on a lost node; otherwise deletes are immediate.
// Deleting an object removes what it owns (a simplified garbage collector). No watches.
//
// Thread-safety: every method takes one mutex.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/client.h"

namespace longhaul::controller::testing {

class MemoryClient : public kube::Client {
 public:
  using json = kube::json;

  json get(const kube::Resource& r, std::string_view ns, std::string_view name) override;
  json list(const kube::Resource& r, std::string_view ns, const kube::ListOptions& opts) override;
  json create(const kube::Resource& r, std::string_view ns, const json& object) override;
  json update(const kube::Resource& r, std::string_view ns, const json& object) override;
  json update_status(const kube::Resource& r, std::string_view ns, const json& object) override;
  json patch(const kube::Resource& r, std::string_view ns, std::string_view name, const json& patch,
             kube::PatchType type, bool status_subresource) override;
  void remove(const kube::Resource& r, std::string_view ns, std::string_view name,
              const kube::DeleteOptions& opts) override;
  std::unique_ptr<kube::WatchStream> watch(const kube::Resource& r, std::string_view ns,
                                           const kube::ListOptions& opts) override;

  // Test helpers ("kubelet" writes: not counted).
  void put(const kube::Resource& r, const json& object);  // upsert as-is (bumps resourceVersion)
  std::vector<json> all(const kube::Resource& r, std::string_view ns);
  bool has(const kube::Resource& r, std::string_view ns, std::string_view name);
  void erase(const kube::Resource& r, std::string_view ns, std::string_view name);
  int writes() const;  // create/update/update_status/patch/remove calls that succeeded or not
  int writes_of(const std::string& verb, const std::string& plural) const;
  void reset_counts();

  bool graceful_pod_deletion = false;
  // Called before each create (outside the lock); throwing refuses it (injected API errors).
  std::function<void(const kube::Resource&, const json&)> before_create;
  std::string now_text = "2026-11-21T13:00:00Z";  // deletionTimestamp for graceful deletes

 private:
  using Key = std::tuple<std::string, std::string, std::string>;  // plural, ns, name
  void count(const std::string& verb, const std::string& plural) REQUIRES(mu_);
  json& current_locked(const kube::Resource& r, std::string_view ns, const json& object)
      REQUIRES(mu_);
  void cascade(const std::string& uid) REQUIRES(mu_);
  mutable Mutex mu_;
  std::map<Key, json> objects_ GUARDED_BY(mu_);
  int64_t rv_ GUARDED_BY(mu_) = 1;
  int64_t uid_ GUARDED_BY(mu_) = 1;
  std::map<std::pair<std::string, std::string>, int> writes_ GUARDED_BY(mu_);
};

}  // namespace longhaul::controller::testing
