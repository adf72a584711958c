// MemoryClient (see memory_client.h).
#include "memory_client.h"

#include <sstream>

namespace longhaul::controller::testing {
namespace {

std::string name_of(const kube::json& o) { return o.at("metadata").value("name", std::string()); }

bool matches(const kube::json& o, const std::string& selector) {
  if (selector.empty()) return true;
  std::stringstream ss(selector);
  std::string term;
  const kube::json labels = o.at("metadata").value("labels", kube::json::object());
  while (std::getline(ss, term, ',')) {
    const auto eq = term.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = term.substr(0, eq), v = term.substr(eq + 1);
    if (!labels.contains(k) || labels[k] != v) return false;
  }
  return true;
}

}  // namespace

void MemoryClient::count(const std::string& verb, const std::string& plural) {
  ++writes_[{verb, plural}];
}

kube::json MemoryClient::get(const kube::Resource& r, std::string_view ns, std::string_view name) {
  MutexLock lock(mu_);
  auto it = objects_.find({r.plural, std::string(ns), std::string(name)});
  if (it == objects_.end()) {
    throw kube::NotFoundError(r.plural + " \"" + std::string(name) + "\" not found");
  }
  return it->second;
}

kube::json MemoryClient::list(const kube::Resource& r, std::string_view ns,
                              const kube::ListOptions& opts) {
  MutexLock lock(mu_);
  json items = json::array();
  for (const auto& [k, o] : objects_) {
    if (std::get<0>(k) == r.plural && (ns.empty() || std::get<1>(k) == ns) &&
        matches(o, opts.label_selector)) {
      items.push_back(o);
    }
  }
  return {{"items", items}, {"metadata", {{"resourceVersion", std::to_string(rv_)}}}};
}

kube::json MemoryClient::create(const kube::Resource& r, std::string_view ns, const json& object) {
  if (before_create) before_create(r, object);  // may throw, as the API server would answer
  MutexLock lock(mu_);
  count("create", r.plural);
  json o = object;
  const Key key{r.plural, std::string(ns), name_of(o)};
  if (objects_.contains(key)) {
    throw kube::AlreadyExistsError(r.plural + " \"" + name_of(o) + "\" already exists");
  }
  o["metadata"]["namespace"] = std::string(ns);
  o["metadata"]["uid"] = "uid-" + std::to_string(uid_++);
  o["metadata"]["resourceVersion"] = std::to_string(++rv_);
  o["metadata"]["generation"] = 1;
  o["metadata"]["creationTimestamp"] = now_text;
  objects_[key] = o;
  return o;
}

// The stored object `object` updates; throws NotFound, or Conflict when `object` carries another
// resourceVersion (an update guarded by it, as the API server does). Caller holds mu_.
kube::json& MemoryClient::current_locked(const kube::Resource& r, std::string_view ns,
                                         const json& object) {
  auto it = objects_.find(Key{r.plural, std::string(ns), name_of(object)});
  if (it == objects_.end()) throw kube::NotFoundError(name_of(object) + " not found");
  if (it->second["metadata"]["resourceVersion"] != object["metadata"]["resourceVersion"]) {
    throw kube::ConflictError("stale resourceVersion");
  }
  return it->second;
}

kube::json MemoryClient::update(const kube::Resource& r, std::string_view ns, const json& object) {
  MutexLock lock(mu_);
  count("update", r.plural);
  json& stored = current_locked(r, ns, object);
  json o = object;
  if (stored.contains("status")) o["status"] = stored["status"];
  if (o["spec"] != stored["spec"]) {
    o["metadata"]["generation"] = stored["metadata"].value("generation", 1) + 1;
  }
  o["metadata"]["resourceVersion"] = std::to_string(++rv_);
  stored = o;
  return o;
}

kube::json MemoryClient::update_status(const kube::Resource& r, std::string_view ns,
                                       const json& object) {
  MutexLock lock(mu_);
  count("update_status", r.plural);
  json& stored = current_locked(r, ns, object);
  stored["status"] = object.value("status", json::object());
  stored["metadata"]["resourceVersion"] = std::to_string(++rv_);
  return stored;
}

kube::json MemoryClient::patch(const kube::Resource& r, std::string_view ns, std::string_view name,
                               const json& patch, kube::PatchType, bool) {
  MutexLock lock(mu_);
  count("patch", r.plural);
  auto it = objects_.find({r.plural, std::string(ns), std::string(name)});
  if (it == objects_.end()) throw kube::NotFoundError(std::string(name) + " not found");
  // As a real API server: a uid in a patch must be the object's (metadata.uid is immutable), so
  // a write aimed at a deleted pod never lands on a same-name pod created since.
  const json* md = patch.is_object() && patch.contains("metadata") ? &patch["metadata"] : nullptr;
  const std::string uid =
      md != nullptr && md->is_object() ? md->value("uid", std::string()) : std::string();
  if (!uid.empty() && uid != it->second["metadata"].value("uid", std::string())) {
    throw kube::InvalidError(422, std::string(name) + ": metadata.uid: Invalid value: \"" + uid +
                                      "\": field is immutable");
  }
  it->second.merge_patch(patch);
  it->second["metadata"]["resourceVersion"] = std::to_string(++rv_);
  return it->second;
}

void MemoryClient::remove(const kube::Resource& r, std::string_view ns, std::string_view name,
                          const kube::DeleteOptions& opts) {
  MutexLock lock(mu_);
  count("delete", r.plural);
  auto it = objects_.find({r.plural, std::string(ns), std::string(name)});
  if (it == objects_.end()) throw kube::NotFoundError(std::string(name) + " not found");
  if (opts.precondition_uid && it->second["metadata"].value("uid", "") != *opts.precondition_uid) {
    throw kube::ConflictError("uid precondition failed");
  }
  const bool force = opts.grace_period_seconds && *opts.grace_period_seconds == 0;
  if (r.plural == "pods" && graceful_pod_deletion && !force) {
    if (!it->second["metadata"].contains("deletionTimestamp")) {
      it->second["metadata"]["deletionTimestamp"] = now_text;
      it->second["metadata"]["resourceVersion"] = std::to_string(++rv_);
    }
    return;
  }
  const std::string uid = it->second["metadata"].value("uid", "");
  objects_.erase(it);
  cascade(uid);
}

void MemoryClient::cascade(const std::string& uid) {
  std::vector<std::string> removed;
  for (auto it = objects_.begin(); it != objects_.end();) {
    bool owned = false;
    for (const json& ref : it->second["metadata"].value("ownerReferences", json::array())) {
      owned |= ref.value("uid", "") == uid;
    }
    if (owned) {
      removed.push_back(it->second["metadata"].value("uid", ""));
      it = objects_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& u : removed) cascade(u);
}

std::unique_ptr<kube::WatchStream> MemoryClient::watch(const kube::Resource&, std::string_view,
                                                       const kube::ListOptions&) {
  throw Unavailable("MemoryClient does not serve watches");
}

void MemoryClient::put(const kube::Resource& r, const json& object) {
  MutexLock lock(mu_);
  json o = object;
  o["metadata"]["resourceVersion"] = std::to_string(++rv_);
  objects_[{r.plural, o["metadata"].value("namespace", "default"), name_of(o)}] = o;
}

std::vector<kube::json> MemoryClient::all(const kube::Resource& r, std::string_view ns) {
  std::vector<json> out;
  const json listed = list(r, ns, {});
  for (const json& o : listed["items"]) out.push_back(o);
  return out;
}

bool MemoryClient::has(const kube::Resource& r, std::string_view ns, std::string_view name) {
  MutexLock lock(mu_);
  return objects_.contains({r.plural, std::string(ns), std::string(name)});
}

void MemoryClient::erase(const kube::Resource& r, std::string_view ns, std::string_view name) {
  MutexLock lock(mu_);
  objects_.erase({r.plural, std::string(ns), std::string(name)});
}

int MemoryClient::writes() const {
  MutexLock lock(mu_);
  int n = 0;
  for (const auto& [_, c] : writes_) n += c;
  return n;
}

int MemoryClient::writes_of(const std::string& verb, const std::string& plural) const {
  MutexLock lock(mu_);
  auto it = writes_.find({verb, plural});
  return it == writes_.end() ? 0 : it->second;
}

void MemoryClient::reset_counts() {
  MutexLock lock(mu_);
  writes_.clear();
}

}  // namespace longhaul::controller::testing
