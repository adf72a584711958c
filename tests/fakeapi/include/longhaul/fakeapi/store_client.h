// StoreClient: a kube::Client over the fake API server's object store, called directly (no HTTP,
// no server thread), for unit tests that drive operator code through kube::Client — the
// reconciler's tests use it. Every Kubernetes semantic comes from the store the fake server
// serves (resourceVersion and 409 on stale writes, generation, the status subresource, patches
// and the uid they may not change, delete preconditions, pod graceful deletion, ownerReference
// garbage collection), so a unit test and a scenario over HTTP see the same API. Store errors
// reach the caller as the typed kube errors the HTTP client throws (kube::throw_api_error).
//
// What it adds is test control: counts of the writes made through it (per verb and plural),
// a hook that may refuse a create, the time the store stamps, a switch that leaves deleted pods
// Terminating as on a node whose kubelet is gone, and helpers that write as a kubelet or etcd
// would (not counted). No watches: watch() throws Unavailable.
//
// Thread-safety: the kube::Client calls and helpers are safe from any thread (the store has its
// own lock; the counts theirs). The public fields (graceful_pod_deletion, before_create,
// now_text) are settings: set them from the test thread while no other thread uses the client.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/base/thread_annotations.h"
#include "longhaul/kube/client.h"

namespace longhaul::fakeapi {

class Store;
class ChangeNotifier;

class StoreClient : public kube::Client {
 public:
  using json = kube::json;

  StoreClient();
  ~StoreClient() override;

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

  // Test helpers: writes a kubelet or etcd would make, not counted as writes.
  // Stores `object` as it is (status, deletionTimestamp) in metadata.namespace ("default"
  // when unset), replacing any object of that name; bumps the resourceVersion.
  void put(const kube::Resource& r, const json& object);
  std::vector<json> all(const kube::Resource& r, std::string_view ns);
  bool has(const kube::Resource& r, std::string_view ns, std::string_view name);
  // Removes the object now, Terminating or not (a kubelet confirming a pod's deletion); no-op
  // when it is gone.
  void erase(const kube::Resource& r, std::string_view ns, std::string_view name);

  // Writes made through the kube::Client calls, refused or not (a create refused by
  // before_create is not made, so not counted). Verbs: create, update, update_status, patch,
  // delete.
  int writes() const;
  int writes_of(const std::string& verb, const std::string& plural) const;
  void reset_counts();

  // On: a pod deleted without gracePeriodSeconds 0 stays Terminating (deletionTimestamp set,
  // grace period from the delete or the pod spec) until erase() or a force delete, as on a node
  // whose kubelet never confirms. Off: the store decides (unscheduled pods go at once).
  bool graceful_pod_deletion = false;
  // Called before each create; throwing refuses it (an injected API error).
  std::function<void(const kube::Resource&, const json&)> before_create;
  // The time the store stamps (creationTimestamp, deletionTimestamp), RFC 3339.
  std::string now_text = "2026-11-21T13:00:00Z";

 private:
  void count(const std::string& verb, const std::string& plural);

  std::unique_ptr<ChangeNotifier> notifier_;
  std::unique_ptr<Store> store_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, int> writes_ GUARDED_BY(mu_);  // (verb, plural)
};

}  // namespace longhaul::fakeapi
