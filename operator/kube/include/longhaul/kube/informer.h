// Informer: a list+watch cache of one resource (in one namespace or all, optionally filtered by a
// label selector on the server), client-go's reflector + indexer + handlers in one.
//
// Lifecycle: construct, add_handlers(), start(); the informer thread LISTs (paged), then WATCHes
// from the list's resourceVersion with bookmarks, applies every event to the Store, and calls the
// handlers. A watch that ends is resumed from the latest resourceVersion (bookmarks included); a
// broken watch is resumed after an exponential backoff; 410 Gone (at open or as an ERROR event)
// and other watch errors trigger a fresh LIST, whose differences against the store are delivered
// as add/update/delete. stop() cancels the open watch and joins the thread promptly.
//
// Handlers run on the informer thread, one at a time, after the store already reflects the
// change; an exception from a handler is logged and swallowed. They must not block for long.
//
// Transform: an optional function applied to every object (list items and watch events alike)
// before it enters the store and reaches the handlers, client-go's SetTransform. A cache for an
// operator's reads keeps only what it reads: strip_managed_fields drops metadata.managedFields,
// often half of an object's bytes, and strip_for_cache also kubectl's last-applied-configuration
// annotation. A stored object is then not what the server holds: PUT one back only if the
// transform dropped nothing but managedFields (the server keeps those; see strip_for_cache).
//
// Thread-safety: Store reads and Informer methods are safe from any thread. Objects are handed
// out as shared_ptr<const json> snapshots that never change.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/client.h"
#include "longhaul/kube/selector.h"

namespace longhaul::kube {

using ObjectPtr = std::shared_ptr<const json>;

// "namespace/name", or "name" for cluster-scoped objects (client-go's MetaNamespaceKeyFunc).
std::string object_key(const json& object);
std::string object_key(std::string_view ns, std::string_view name);

// Thread-safe object cache keyed by object_key, indexed by owner UID and by the values of the
// labels named at construction.
class Store {
 public:
  // list(ns, selector) with a selector that requires one value of an indexed label reads only
  // the objects with that value (e.g. a job's pods among thousands) instead of every object.
  explicit Store(std::vector<std::string> indexed_labels = {})
      : indexed_labels_(std::move(indexed_labels)) {}

  ObjectPtr get(const std::string& key) const;  // null when absent
  ObjectPtr get(std::string_view ns, std::string_view name) const;
  std::vector<ObjectPtr> list() const;
  // Objects in `ns` ("" = all namespaces) whose labels match `selector`.
  std::vector<ObjectPtr> list(std::string_view ns, const LabelSelector& selector) const;
  // Objects with an ownerReference to `uid` (e.g. the pods of a TrainingJob).
  std::vector<ObjectPtr> by_owner_uid(const std::string& uid) const;
  std::vector<std::string> keys() const;
  size_t size() const;

  // Mutations (the informer's; public for tests and fakes). Return the previous object or null.
  ObjectPtr upsert(json object);
  ObjectPtr upsert(ObjectPtr object);
  ObjectPtr erase(const std::string& key);
  // Replaces everything; returns the previous contents.
  std::map<std::string, ObjectPtr> replace(const std::vector<ObjectPtr>& objects);

 private:
  void index_locked(const std::string& key, const ObjectPtr& object, bool add) REQUIRES(mu_);
  const std::vector<std::string> indexed_labels_;
  mutable Mutex mu_;
  std::map<std::string, ObjectPtr> objects_ GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> by_owner_ GUARDED_BY(mu_);  // uid -> keys
  // indexed label -> value -> keys
  std::map<std::string, std::map<std::string, std::set<std::string>>> by_label_ GUARDED_BY(mu_);
};

struct ResourceEventHandlers {
  std::function<void(const json& object)> on_add;
  std::function<void(const json& old_object, const json& new_object)> on_update;
  std::function<void(const json& object)> on_delete;  // the last known state
};

// Drops metadata.managedFields (the server's field ownership: every field's path again, per
// writer). Safe for objects that are written back with PUT (also to /status): the server keeps
// the managedFields a write omits.
void strip_managed_fields(json& object);

// strip_managed_fields, and the kubectl.kubernetes.io/last-applied-configuration annotation (the
// whole object again, as text); an annotations map left empty goes too. Anything else is kept.
// Only for objects that are never written back: a PUT without the annotation keeps it when it
// goes to /status, but takes its writer's ownership of it away (checked on the real API server:
// tests/operator/cache_real_test.cc).
void strip_for_cache(json& object);

// Applies to an object in place before the store and the handlers see it. Should not throw: an
// exception is logged and the object is cached as the transform left it (never dropped).
using ObjectTransform = std::function<void(json& object)>;

struct InformerOptions {
  Resource resource;
  std::string ns;  // "" = all namespaces
  std::string label_selector;
  std::string field_selector;
  // Each watch asks the server to end after this long (timeoutSeconds), then resumes; client-go
  // uses 5-10 minutes. Jittered up to +50%.
  std::chrono::seconds watch_timeout{300};
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{30000};
  std::optional<int> list_page_size = 500;
  // Labels whose values the store indexes (Store's constructor).
  std::vector<std::string> indexed_labels;
  // Applied to every object before it is stored (see the top of this file); none by default.
  ObjectTransform transform;
};

class Informer {
 public:
  Informer(std::shared_ptr<Client> client, InformerOptions options);
  ~Informer();  // stop()
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Before start() only (throws FailedPrecondition afterwards). Several sets may be added.
  void add_handlers(ResourceEventHandlers handlers);
  void start();
  // Idempotent; returns once the informer thread has exited.
  void stop();

  // True once the first LIST has been applied and its add handlers have run.
  bool has_synced() const;
  // Waits for has_synced(); false on timeout or when stopped first.
  bool wait_for_sync(std::chrono::milliseconds timeout) const;

  const Store& store() const { return store_; }
  // The latest resourceVersion seen (list, event or bookmark).
  std::string resource_version() const;
  // Number of LISTs done (the first one and every relist), for tests and diagnostics.
  int list_count() const { return list_count_.load(); }

 private:
  // What one watch did: events applied, the code of an ERROR event or a 410 Gone, whether the
  // cache must be listed again.
  struct WatchOutcome {
    int events = 0;
    int error_code = 0;
    bool relist = false;
  };
  void run();
  void list_and_sync();
  // Watches from the latest resourceVersion until the stream ends, applying every event. Fills
  // `out` as it goes (read it even when this throws); a 410 Gone, at open or as an ERROR event,
  // sets out.relist instead of throwing. Returns false when the informer is stopping.
  bool watch_once(const ListOptions& opts, WatchOutcome& out);
  // Applies one watch event to the store and calls the handlers (an ERROR event is only logged).
  // Takes the event's object: it moves into the store.
  void apply(WatchEvent& event);
  void transform(json& object) const;
  bool backoff(int failures);  // false when stopping
  void set_resource_version(const json& object);
  void notify_add(const json& object);
  void notify_update(const json& old_object, const json& new_object);
  void notify_delete(const json& object);

  const std::shared_ptr<Client> client_;
  const InformerOptions options_;
  const std::string name_;  // for logs: "Pod ns=... selector=..."
  Store store_;
  std::vector<ResourceEventHandlers> handlers_;  // fixed after start()
  std::thread thread_;
  std::atomic<bool> started_{false};
  std::atomic<int> list_count_{0};

  mutable Mutex mu_;
  mutable CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool synced_ GUARDED_BY(mu_) = false;
  WatchStream* current_stream_ GUARDED_BY(mu_) = nullptr;  // the open watch, for stop()
  std::string resource_version_ GUARDED_BY(mu_);
};

}  // namespace longhaul::kube
