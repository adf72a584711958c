// The fake API server's object store: every Kubernetes semantic that does not depend on HTTP
// (resourceVersion, generation, status subresource isolation, conflicts, patches, graceful and
// finalizer-blocked deletion, ownerReference garbage collection, the bounded event history and
// watchers). The HTTP front end (server.cc) and the direct test API both call it.
//
// Thread-safety: every public member takes mu_; watchers are fed under mu_, so a watch that is
// registered while a write commits sees the event exactly once (replay or live). Watcher queues
// have their own mutex so a streaming thread drains them without the store lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/base/thread_annotations.h"
#include "longhaul/fakeapi/server.h"
#include "selector.h"

namespace longhaul::fakeapi {

// Wakes wait_for() callers on any store change or answered request.
class ChangeNotifier {
 public:
  void bump();
  uint64_t sequence() const;
  // Waits until the sequence differs from `seen` or the deadline passes.
  void wait_change(uint64_t seen, std::chrono::steady_clock::time_point deadline) const;

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  uint64_t sequence_ GUARDED_BY(mu_) = 0;
};

// One open watch: the store appends serialized event lines; the streaming thread drains them.
class Watcher {
 public:
  Watcher(const ResourceType& type, std::string ns, LabelSelector labels, FieldSelector fields,
          size_t max_queue);
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  const ResourceType& type() const { return type_; }
  bool matches(const json& view) const;  // namespace, labels, fields of a selector view
  int wake_fd() const { return wake_fd_; }

  void push(std::string line);
  void request_drop(DropMode mode);
  // Drains queued lines; `drop` is set when drop_watches() asked to end the stream, `overflow`
  // when the client read too slowly.
  struct Batch {
    std::vector<std::string> lines;
    std::optional<DropMode> drop;
    bool overflow = false;
  };
  Batch take();

 private:
  const ResourceType type_;
  const std::string ns_;
  const LabelSelector labels_;
  const FieldSelector fields_;
  const size_t max_queue_;
  int wake_fd_;
  Mutex mu_;
  std::deque<std::string> lines_ GUARDED_BY(mu_);
  std::optional<DropMode> drop_ GUARDED_BY(mu_);
  bool overflow_ GUARDED_BY(mu_) = false;
};

struct ListResult {
  std::vector<json> items;
  uint64_t resource_version = 0;
  std::string continue_token;
  std::optional<int64_t> remaining_item_count;
};

class Store {
 public:
  Store(const Options& options, ChangeNotifier& notifier);

  void register_type(const ResourceType& type);
  // By plural or type id; throws StatusError 404 for unknown names.
  ResourceType resolve(std::string_view name) const;
  std::optional<ResourceType> find(std::string_view group, std::string_view version,
                                   std::string_view plural) const;
  std::vector<ResourceType> types() const;

  json get(const ResourceType& type, const std::string& ns, const std::string& name) const;
  ListResult list(const ResourceType& type, const std::string& ns, const LabelSelector& labels,
                  const FieldSelector& fields, size_t limit, const std::string& continue_token,
                  const std::string& resource_version, const std::string& resource_version_match);
  json create(const ResourceType& type, const std::string& ns, json object);
  json update(const ResourceType& type, const std::string& ns, const std::string& name, json object,
              bool status_subresource);
  json patch(const ResourceType& type, const std::string& ns, const std::string& name,
             const json& patch, PatchType patch_type, bool status_subresource);
  json remove(const ResourceType& type, const std::string& ns, const std::string& name,
              const DeleteOptions& options);
  // Test control, what only a kubelet or etcd itself could write: stores `object` as it is
  // (deletionTimestamp, status and all) under ns/metadata.name, replacing any object of that
  // name with no resourceVersion check. Only the resourceVersion is assigned (and a uid and
  // creationTimestamp when missing); watchers see ADDED or MODIFIED. Returns what is stored.
  json put(const ResourceType& type, const std::string& ns, json object);
  // pods/binding: assigns spec.nodeName once.
  void bind_pod(const std::string& ns, const std::string& name, const std::string& node);
  // pods/eviction: DisruptionTarget condition, then a graceful delete.
  void evict_pod(const std::string& ns, const std::string& name, const DeleteOptions& options);

  uint64_t resource_version() const;
  void expire_history();

  // Opens a watch. resource_version "" or "0": synthetic ADDED events for every current object
  // first; otherwise the history after that version is replayed. Throws StatusError 410 Expired
  // when the version is older than the history.
  // send_initial_events (sendInitialEvents=true): synthetic ADDED events for every current
  // object, then a BOOKMARK annotated "k8s.io/initial-events-end": "true".
  std::shared_ptr<Watcher> watch(const ResourceType& type, const std::string& ns,
                                 LabelSelector labels, FieldSelector fields,
                                 const std::string& resource_version,
                                 bool send_initial_events = false);
  void unwatch(const std::shared_ptr<Watcher>& watcher);
  // Queues a BOOKMARK at the current resourceVersion behind every event already queued.
  void bookmark(Watcher& watcher);
  void drop_watches(DropMode mode);
  size_t watch_count() const;

 private:
  using Key = std::pair<std::string, std::string>;  // (namespace, name)
  enum class EventType { kAdded, kModified, kDeleted };
  struct Event {
    uint64_t resource_version;
    std::string type_id;
    EventType type;
    json view;           // selector view of the object after the event
    json previous_view;  // before the event (null for ADDED)
    std::shared_ptr<const std::string> serialized;
  };

  const ResourceType& type_locked(const ResourceType& type) const REQUIRES(mu_);
  std::map<Key, json>& objects_of(const ResourceType& type) REQUIRES(mu_);
  json* find_locked(const ResourceType& type, const std::string& ns, const std::string& name)
      REQUIRES(mu_);
  // The steps of create(): the name (generateName, validity, 409 AlreadyExists); the fields the
  // server owns (kind, apiVersion, uid, creationTimestamp, generation); the defaults of pods,
  // claims and services; the write with its resourceVersion and ADDED event.
  Key claim_name_locked(const ResourceType& type, const std::string& key_ns, json& meta)
      REQUIRES(mu_);
  void set_server_fields_locked(const ResourceType& type, json& object) REQUIRES(mu_);
  void apply_create_defaults_locked(const ResourceType& type, json& object) REQUIRES(mu_);
  json store_created_locked(const ResourceType& type, const Key& key, json object) REQUIRES(mu_);
  json update_locked(const ResourceType& type, const std::string& ns, const std::string& name,
                     const json& existing, json candidate, bool status_only) REQUIRES(mu_);
  json remove_locked(const ResourceType& type, const std::string& ns, const std::string& name,
                     const DeleteOptions& options) REQUIRES(mu_);
  json remove_now_locked(const ResourceType& type, const Key& key, json object,
                         const json& previous) REQUIRES(mu_);
  void collect_garbage_locked(const json& removed) REQUIRES(mu_);
  void orphan_dependents_locked(const std::string& owner_uid) REQUIRES(mu_);
  void strip_owner_locked(const ResourceType& type, const Key& key, const std::string& owner_uid)
      REQUIRES(mu_);
  std::vector<std::tuple<ResourceType, Key>> dependents_locked(const std::string& owner_uid)
      REQUIRES(mu_);
  void commit_locked(const ResourceType& type, EventType event_type, const json& object,
                     const json* previous) REQUIRES(mu_);
  void deliver_locked(Watcher& watcher, const Event& event) const REQUIRES(mu_);
  void bookmark_locked(Watcher& watcher, bool initial_events_end) REQUIRES(mu_);
  uint64_t next_resource_version_locked() REQUIRES(mu_);
  // Options::clock (else the system clock) plus `offset`, as RFC 3339.
  std::string timestamp_locked(std::chrono::seconds offset = std::chrono::seconds(0)) const
      REQUIRES(mu_);
  std::string generate_name_locked(const std::string& prefix) REQUIRES(mu_);
  std::string new_uid_locked() REQUIRES(mu_);

  const Options options_;
  ChangeNotifier& notifier_;
  mutable Mutex mu_;
  std::map<std::string, ResourceType> types_ GUARDED_BY(mu_);           // type id -> type
  std::map<std::string, std::map<Key, json>> objects_ GUARDED_BY(mu_);  // type id -> objects
  // uid -> (type id, key)
  std::unordered_map<std::string, std::pair<std::string, Key>> by_uid_ GUARDED_BY(mu_);
  uint64_t resource_version_ GUARDED_BY(mu_) = 0;
  uint64_t oldest_watchable_ GUARDED_BY(mu_) = 0;  // a watch from a version below this gets 410
  std::deque<Event> history_ GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Watcher>> watchers_ GUARDED_BY(mu_);
  std::mt19937_64 random_ GUARDED_BY(mu_);
};

std::string base64(const std::string& bytes);
// Copies of the fields selectors look at (metadata.name/namespace/labels, pod fields, ...).
json selector_view(const json& object);

}  // namespace longhaul::fakeapi
