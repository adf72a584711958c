// List+watch cache (see informer.h).
#include "longhaul/kube/informer.h"

#include <cmath>
#include <random>

#include "longhaul/base/log.h"

namespace longhaul::kube {

namespace {

std::string metadata_string(const json& object, const char* field) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto value = metadata->find(field);
  if (value == metadata->end() || !value->is_string()) return "";
  return value->get<std::string>();
}

std::vector<std::string> owner_uids(const json& object) {
  std::vector<std::string> out;
  if (!object.is_object() || !object.contains("metadata")) return out;
  const json& metadata = object["metadata"];
  if (!metadata.is_object() || !metadata.contains("ownerReferences")) return out;
  for (const auto& ref : metadata["ownerReferences"]) {
    if (ref.is_object() && ref.contains("uid") && ref["uid"].is_string()) {
      out.push_back(ref["uid"].get<std::string>());
    }
  }
  return out;
}

// metadata.labels, or null.
const json* labels_of(const json& object) {
  if (!object.is_object()) return nullptr;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return nullptr;
  auto labels = metadata->find("labels");
  if (labels == metadata->end() || !labels->is_object()) return nullptr;
  return &*labels;
}

// Whether object key `key` ("namespace/name") is in namespace `ns`.
bool in_namespace(std::string_view key, std::string_view ns) {
  return key.size() > ns.size() && key[ns.size()] == '/' && key.substr(0, ns.size()) == ns;
}

constexpr const char* kLastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration";

}  // namespace

void strip_managed_fields(json& object) {
  if (!object.is_object()) return;
  auto metadata = object.find("metadata");
  if (metadata != object.end() && metadata->is_object()) metadata->erase("managedFields");
}

void strip_for_cache(json& object) {
  if (!object.is_object()) return;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return;
  metadata->erase("managedFields");
  auto annotations = metadata->find("annotations");
  if (annotations != metadata->end() && annotations->is_object()) {
    annotations->erase(kLastAppliedAnnotation);
    if (annotations->empty()) metadata->erase(annotations);
  }
}

std::string object_key(std::string_view ns, std::string_view name) {
  if (ns.empty()) return std::string(name);
  return std::string(ns) + "/" + std::string(name);
}

std::string object_key(const json& object) {
  return object_key(metadata_string(object, "namespace"), metadata_string(object, "name"));
}

// ---- Store ----

void Store::index_locked(const std::string& key, const ObjectPtr& object, bool add) {
  for (const std::string& uid : owner_uids(*object)) {
    if (add) {
      by_owner_[uid].insert(key);
    } else if (auto it = by_owner_.find(uid); it != by_owner_.end()) {
      it->second.erase(key);
      if (it->second.empty()) by_owner_.erase(it);
    }
  }
  if (indexed_labels_.empty()) return;
  const json* labels = labels_of(*object);
  if (labels == nullptr) return;
  for (const std::string& label : indexed_labels_) {
    auto value = labels->find(label);
    if (value == labels->end() || !value->is_string()) continue;
    const std::string& v = value->get_ref<const std::string&>();
    if (add) {
      by_label_[label][v].insert(key);
    } else if (auto by_value = by_label_.find(label); by_value != by_label_.end()) {
      if (auto keys = by_value->second.find(v); keys != by_value->second.end()) {
        keys->second.erase(key);
        if (keys->second.empty()) by_value->second.erase(keys);
      }
    }
  }
}

ObjectPtr Store::get(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

ObjectPtr Store::get(std::string_view ns, std::string_view name) const {
  return get(object_key(ns, name));
}

std::vector<ObjectPtr> Store::list() const {
  MutexLock lock(mu_);
  std::vector<ObjectPtr> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(object);
  return out;
}

std::vector<ObjectPtr> Store::list(std::string_view ns, const LabelSelector& selector) const {
  MutexLock lock(mu_);
  std::vector<ObjectPtr> out;
  // An indexed label the selector pins to one value: only those objects.
  for (const std::string& label : indexed_labels_) {
    const std::string* value = selector.required_value(label);
    if (value == nullptr) continue;
    auto by_value = by_label_.find(label);
    if (by_value == by_label_.end()) return out;
    auto keys = by_value->second.find(*value);
    if (keys == by_value->second.end()) return out;
    for (const std::string& key : keys->second) {
      if (!ns.empty() && !in_namespace(key, ns)) continue;
      auto it = objects_.find(key);
      if (it != objects_.end() && selector.matches_object(*it->second)) out.push_back(it->second);
    }
    return out;
  }
  // Keys are "namespace/name" in order: one namespace's objects are one range.
  auto it = ns.empty() ? objects_.begin() : objects_.lower_bound(std::string(ns) + "/");
  for (; it != objects_.end(); ++it) {
    if (!ns.empty() && !in_namespace(it->first, ns)) break;
    if (selector.matches_object(*it->second)) out.push_back(it->second);
  }
  return out;
}

std::vector<ObjectPtr> Store::by_owner_uid(const std::string& uid) const {
  MutexLock lock(mu_);
  std::vector<ObjectPtr> out;
  auto it = by_owner_.find(uid);
  if (it == by_owner_.end()) return out;
  for (const std::string& key : it->second) {
    if (auto obj = objects_.find(key); obj != objects_.end()) out.push_back(obj->second);
  }
  return out;
}

std::vector<std::string> Store::keys() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [key, object] : objects_) out.push_back(key);
  return out;
}

size_t Store::size() const {
  MutexLock lock(mu_);
  return objects_.size();
}

ObjectPtr Store::upsert(json object) {
  return upsert(std::make_shared<const json>(std::move(object)));
}

ObjectPtr Store::upsert(ObjectPtr ptr) {
  const std::string key = object_key(*ptr);
  MutexLock lock(mu_);
  ObjectPtr old;
  if (auto it = objects_.find(key); it != objects_.end()) {
    old = it->second;
    index_locked(key, old, false);
  }
  objects_[key] = ptr;
  index_locked(key, ptr, true);
  return old;
}

ObjectPtr Store::erase(const std::string& key) {
  MutexLock lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return nullptr;
  ObjectPtr old = it->second;
  index_locked(key, old, false);
  objects_.erase(it);
  return old;
}

std::map<std::string, ObjectPtr> Store::replace(const std::vector<ObjectPtr>& objects) {
  std::map<std::string, ObjectPtr> fresh;
  for (const ObjectPtr& object : objects) fresh[object_key(*object)] = object;
  MutexLock lock(mu_);
  std::map<std::string, ObjectPtr> old;
  old.swap(objects_);
  objects_ = std::move(fresh);
  by_owner_.clear();
  by_label_.clear();
  for (const auto& [key, object] : objects_) index_locked(key, object, true);
  return old;
}

// ---- Informer ----

Informer::Informer(std::shared_ptr<Client> client, InformerOptions options)
    : client_(std::move(client)),
      options_(std::move(options)),
      name_(options_.resource.kind + " ns=" + (options_.ns.empty() ? "*" : options_.ns) +
            (options_.label_selector.empty() ? "" : " selector=" + options_.label_selector)),
      store_(options_.indexed_labels) {}

Informer::~Informer() { stop(); }

void Informer::add_handlers(ResourceEventHandlers handlers) {
  if (started_.load()) {
    throw FailedPrecondition("informer " + name_ + ": add_handlers() after start()");
  }
  handlers_.push_back(std::move(handlers));
}

void Informer::start() {
  if (started_.exchange(true)) return;
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    if (current_stream_ != nullptr) current_stream_->stop();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Informer::has_synced() const {
  MutexLock lock(mu_);
  return synced_;
}

bool Informer::wait_for_sync(std::chrono::milliseconds timeout) const {
  MutexLock lock(mu_);
  cv_.wait_for(mu_, timeout, [this]() REQUIRES(mu_) { return synced_ || stopping_; });
  return synced_;
}

std::string Informer::resource_version() const {
  MutexLock lock(mu_);
  return resource_version_;
}

void Informer::set_resource_version(const json& object) {
  std::string rv = metadata_string(object, "resourceVersion");
  if (rv.empty()) return;
  MutexLock lock(mu_);
  resource_version_ = rv;
}

bool Informer::backoff(int failures) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  double ms =
      static_cast<double>(options_.initial_backoff.count()) * std::pow(2.0, std::min(failures, 30));
  ms = std::min(ms, static_cast<double>(options_.max_backoff.count()));
  ms *= std::uniform_real_distribution<double>(0.5, 1.0)(rng);
  MutexLock lock(mu_);
  cv_.wait_for(mu_, std::chrono::duration<double, std::milli>(ms),
               [this]() REQUIRES(mu_) { return stopping_; });
  return !stopping_;
}

void Informer::notify_add(const json& object) {
  for (const auto& h : handlers_) {
    if (!h.on_add) continue;
    try {
      h.on_add(object);
    } catch (const std::exception& e) {
      LH_LOG(ERROR) << "informer add handler threw" << kv("informer", name_)
                    << kv("object", object_key(object)) << kv("error", e.what());
    }
  }
}

void Informer::notify_update(const json& old_object, const json& new_object) {
  for (const auto& h : handlers_) {
    if (!h.on_update) continue;
    try {
      h.on_update(old_object, new_object);
    } catch (const std::exception& e) {
      LH_LOG(ERROR) << "informer update handler threw" << kv("informer", name_)
                    << kv("object", object_key(new_object)) << kv("error", e.what());
    }
  }
}

void Informer::notify_delete(const json& object) {
  for (const auto& h : handlers_) {
    if (!h.on_delete) continue;
    try {
      h.on_delete(object);
    } catch (const std::exception& e) {
      LH_LOG(ERROR) << "informer delete handler threw" << kv("informer", name_)
                    << kv("object", object_key(object)) << kv("error", e.what());
    }
  }
}

void Informer::list_and_sync() {
  ListOptions opts;
  opts.label_selector = options_.label_selector;
  opts.field_selector = options_.field_selector;
  opts.limit = options_.list_page_size;
  json list = client_->list(options_.resource, options_.ns, opts);
  list_count_.fetch_add(1);
  std::vector<ObjectPtr> items;
  if (auto found = list.find("items"); found != list.end() && found->is_array()) {
    items.reserve(found->size());
    for (json& item : *found) {
      transform(item);
      items.push_back(std::make_shared<const json>(std::move(item)));
    }
  }
  auto old = store_.replace(items);
  set_resource_version(list);
  list = json();  // the items moved out; the rest is not needed while the handlers run
  // Deliver the differences against what the handlers saw before.
  for (const ObjectPtr& item : items) {
    const std::string key = object_key(*item);
    auto it = old.find(key);
    if (it == old.end()) {
      notify_add(*item);
    } else {
      if (metadata_string(*it->second, "resourceVersion") !=
          metadata_string(*item, "resourceVersion")) {
        notify_update(*it->second, *item);
      }
      old.erase(it);
    }
  }
  for (const auto& [key, object] : old) notify_delete(*object);
  {
    MutexLock lock(mu_);
    synced_ = true;
  }
  cv_.notify_all();
  LH_LOG(DEBUG) << "informer listed" << kv("informer", name_) << kv("objects", items.size())
                << kv("resource_version", resource_version());
}

void Informer::transform(json& object) const {
  if (!options_.transform) return;
  try {
    options_.transform(object);
  } catch (const std::exception& e) {
    LH_LOG(ERROR) << "informer transform threw; caching the object as it is"
                  << kv("informer", name_) << kv("object", object_key(object))
                  << kv("error", e.what());
  }
}

void Informer::apply(WatchEvent& event) {
  switch (event.type) {
    case WatchEvent::Type::kAdded:
    case WatchEvent::Type::kModified: {
      set_resource_version(event.object);
      transform(event.object);
      auto object = std::make_shared<const json>(std::move(event.object));
      ObjectPtr old = store_.upsert(object);
      if (old) {
        notify_update(*old, *object);
      } else {
        notify_add(*object);
      }
      return;
    }
    case WatchEvent::Type::kDeleted: {
      set_resource_version(event.object);
      transform(event.object);
      store_.erase(object_key(event.object));
      notify_delete(event.object);
      return;
    }
    case WatchEvent::Type::kBookmark:
      set_resource_version(event.object);
      return;
    case WatchEvent::Type::kError: {
      const int code = event.object.is_object() ? event.object.value("code", 0) : 0;
      LH_LOG(INFO) << "watch error event; relisting" << kv("informer", name_) << kv("code", code)
                   << kv("message",
                         event.object.is_object() ? event.object.value("message", "") : "");
      return;
    }
  }
}

namespace {

// The options of the next watch: from `resource_version`, with bookmarks, and a timeout of
// watch_timeout plus up to half again at random, so informers do not reconnect in lockstep.
ListOptions watch_options(const InformerOptions& options, std::string resource_version,
                          std::mt19937_64& rng) {
  ListOptions opts;
  opts.label_selector = options.label_selector;
  opts.field_selector = options.field_selector;
  opts.resource_version = std::move(resource_version);
  opts.allow_watch_bookmarks = true;
  const auto base = options.watch_timeout.count();
  opts.timeout_seconds = static_cast<int>(
      base + std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(0, base / 2))(rng));
  return opts;
}

}  // namespace

bool Informer::watch_once(const ListOptions& opts, WatchOutcome& out) {
  try {
    std::unique_ptr<WatchStream> stream = client_->watch(options_.resource, options_.ns, opts);
    {
      MutexLock lock(mu_);
      if (stopping_) return false;
      current_stream_ = stream.get();
    }
    struct Unpublish {
      Informer* self;
      ~Unpublish() {
        MutexLock lock(self->mu_);
        self->current_stream_ = nullptr;
      }
    } unpublish{this};
    while (auto event = stream->next()) {
      if (event->type == WatchEvent::Type::kError) {
        out.error_code = event->object.is_object() ? event->object.value("code", 0) : 0;
        apply(*event);
        out.relist = true;
        break;
      }
      ++out.events;
      apply(*event);
    }
  } catch (const GoneError& e) {
    LH_LOG(INFO) << "watch resourceVersion expired; relisting" << kv("informer", name_)
                 << kv("error", e.what());
    out.relist = true;
    out.error_code = 410;
  }
  return true;
}

void Informer::run() {
  // `failures` counts consecutive attempts that made no progress; it sets the backoff and is
  // reset once a watch delivers an event or lives for a while.
  bool need_list = true;
  int failures = 0;
  std::mt19937_64 rng(std::random_device{}());
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    if (need_list) {
      try {
        list_and_sync();
        need_list = false;
      } catch (const std::exception& e) {
        LH_LOG(WARNING) << "informer list failed; retrying" << kv("informer", name_)
                        << kv("error", e.what());
        if (!backoff(failures++)) return;
        continue;
      }
    }
    const ListOptions opts = watch_options(options_, resource_version(), rng);
    const auto watch_start = std::chrono::steady_clock::now();
    WatchOutcome watch;
    try {
      if (!watch_once(opts, watch)) return;
    } catch (const std::exception& e) {
      LH_LOG(WARNING) << "informer watch failed; resuming" << kv("informer", name_)
                      << kv("error", e.what());
      if (watch.events > 0) failures = 0;
      if (!backoff(failures++)) return;
      continue;
    }
    need_list = watch.relist;
    const bool progressed = watch.events > 0 || std::chrono::steady_clock::now() - watch_start >=
                                                    std::chrono::seconds(1);
    if (progressed) failures = 0;
    if (need_list) {
      // 410 Gone is routine (relist at once); repeated or other errors back off.
      if ((watch.error_code != 410 || failures > 0) && !backoff(failures)) return;
      ++failures;
      continue;
    }
    // The stream ended (timeoutSeconds or the server closed it): resume from the latest
    // resourceVersion, backing off only when it ended at once without events.
    if (!progressed && !backoff(failures++)) return;
  }
}

}  // namespace longhaul::kube
