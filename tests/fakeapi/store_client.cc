// StoreClient (see longhaul/fakeapi/store_client.h): each kube::Client call is the store call
// the fake server's HTTP front end would make for the same request.
#include "longhaul/fakeapi/store_client.h"

#include "longhaul/api/trainingjob.h"
#include "longhaul/kube/http_client.h"
#include "selector.h"
#include "store.h"

namespace longhaul::fakeapi {
namespace {

std::string describe(const std::string& verb, const kube::Resource& r, std::string_view ns,
                     std::string_view name) {
  std::string what = verb + " " + r.plural;
  if (!ns.empty()) what += " " + std::string(ns) + (name.empty() ? "" : "/");
  if (!name.empty()) what += (ns.empty() ? " " : "") + std::string(name);
  return what;
}

// Runs a store call; a StatusError becomes the kube error an HTTP client gets for that answer.
template <typename Call>
auto translated(const std::string& what, Call call) -> decltype(call()) {
  try {
    return call();
  } catch (const StatusError& e) {
    kube::throw_api_error(e.http_status(), e.to_status().dump(), what);
  }
}

ResourceType type_of(const Store& store, const kube::Resource& r, const std::string& what) {
  return translated(what, [&] {
    std::optional<ResourceType> type = store.find(r.group, r.version, r.plural);
    if (!type) {
      throw StatusError(404, "NotFound",
                        "the server could not find the requested resource (" + r.plural + ")");
    }
    return *type;
  });
}

std::string name_of(const kube::json& object) {
  const auto meta = object.find("metadata");
  return meta != object.end() && meta->is_object() ? meta->value("name", std::string())
                                                   : std::string();
}

DeleteOptions store_delete_options(const kube::DeleteOptions& opts) {
  DeleteOptions out;
  out.grace_period_seconds = opts.grace_period_seconds;
  out.precondition_uid = opts.precondition_uid;
  out.precondition_resource_version = opts.precondition_resource_version;
  out.propagation_policy = opts.propagation_policy;
  return out;
}

PatchType store_patch_type(kube::PatchType type) {
  switch (type) {
    case kube::PatchType::kStrategicMerge:
      return PatchType::kStrategicMerge;
    case kube::PatchType::kJson:
      return PatchType::kJson;
    case kube::PatchType::kMerge:
      break;
  }
  return PatchType::kMerge;
}

}  // namespace

StoreClient::StoreClient() : notifier_(std::make_unique<ChangeNotifier>()) {
  Options options;
  options.clock = [this] { return api::parse_time(now_text); };
  store_ = std::make_unique<Store>(options, *notifier_);
}

StoreClient::~StoreClient() = default;

void StoreClient::count(const std::string& verb, const std::string& plural) {
  MutexLock lock(mu_);
  ++writes_[{verb, plural}];
}

kube::json StoreClient::get(const kube::Resource& r, std::string_view ns, std::string_view name) {
  const std::string what = describe("get", r, ns, name);
  const ResourceType type = type_of(*store_, r, what);
  return translated(what, [&] { return store_->get(type, std::string(ns), std::string(name)); });
}

kube::json StoreClient::list(const kube::Resource& r, std::string_view ns,
                             const kube::ListOptions& opts) {
  const std::string what = describe("list", r, ns, "");
  const ResourceType type = type_of(*store_, r, what);
  return translated(what, [&] {
    // One page: the kube::Client contract is every item (a client follows "continue" itself).
    const ListResult result = store_->list(
        type, std::string(ns), LabelSelector::parse(opts.label_selector),
        FieldSelector::parse(opts.field_selector, type), 0, "", opts.resource_version, "");
    return json{{"apiVersion", type.api_version()},
                {"kind", type.kind + "List"},
                {"metadata", {{"resourceVersion", std::to_string(result.resource_version)}}},
                {"items", result.items}};
  });
}

kube::json StoreClient::create(const kube::Resource& r, std::string_view ns, const json& object) {
  if (before_create) before_create(r, object);  // may throw, as the API server would answer
  count("create", r.plural);
  const std::string what = describe("create", r, ns, name_of(object));
  const ResourceType type = type_of(*store_, r, what);
  return translated(what, [&] { return store_->create(type, std::string(ns), object); });
}

kube::json StoreClient::update(const kube::Resource& r, std::string_view ns, const json& object) {
  count("update", r.plural);
  const std::string what = describe("update", r, ns, name_of(object));
  const ResourceType type = type_of(*store_, r, what);
  return translated(
      what, [&] { return store_->update(type, std::string(ns), name_of(object), object, false); });
}

kube::json StoreClient::update_status(const kube::Resource& r, std::string_view ns,
                                      const json& object) {
  count("update_status", r.plural);
  const std::string what = describe("update status of", r, ns, name_of(object));
  const ResourceType type = type_of(*store_, r, what);
  return translated(
      what, [&] { return store_->update(type, std::string(ns), name_of(object), object, true); });
}

kube::json StoreClient::patch(const kube::Resource& r, std::string_view ns, std::string_view name,
                              const json& patch, kube::PatchType patch_type,
                              bool status_subresource) {
  count("patch", r.plural);
  const std::string what = describe("patch", r, ns, name);
  const ResourceType type = type_of(*store_, r, what);
  return translated(what, [&] {
    return store_->patch(type, std::string(ns), std::string(name), patch,
                         store_patch_type(patch_type), status_subresource);
  });
}

void StoreClient::remove(const kube::Resource& r, std::string_view ns, std::string_view name,
                         const kube::DeleteOptions& opts) {
  count("delete", r.plural);
  const std::string what = describe("delete", r, ns, name);
  const ResourceType type = type_of(*store_, r, what);
  const bool force = opts.grace_period_seconds && *opts.grace_period_seconds == 0;
  translated(what, [&] {
    if (graceful_pod_deletion && !force && type.group.empty() && type.plural == "pods") {
      // The API server marks the pod; no kubelet ever confirms, so it stays Terminating.
      json pod = store_->get(type, std::string(ns), std::string(name));
      json& meta = pod["metadata"];
      if (opts.precondition_uid && meta.value("uid", std::string()) != *opts.precondition_uid) {
        throw StatusError(409, "Conflict",
                          "Precondition failed: UID in precondition: " + *opts.precondition_uid +
                              ", UID in object meta: " + meta.value("uid", std::string()));
      }
      if (meta.contains("deletionTimestamp")) return;
      const int64_t grace = opts.grace_period_seconds.value_or(
          pod.value("spec", json::object()).value("terminationGracePeriodSeconds", int64_t{30}));
      meta["deletionTimestamp"] = now_text;
      meta["deletionGracePeriodSeconds"] = grace;
      store_->put(type, std::string(ns), pod);
      return;
    }
    store_->remove(type, std::string(ns), std::string(name), store_delete_options(opts));
  });
}

std::unique_ptr<kube::WatchStream> StoreClient::watch(const kube::Resource& r, std::string_view,
                                                      const kube::ListOptions&) {
  throw Unavailable("StoreClient serves no watches (watch " + r.plural +
                    "): use FakeApiServer over HTTP for code that watches");
}

void StoreClient::put(const kube::Resource& r, const json& object) {
  const std::string ns =
      object.contains("metadata") ? object["metadata"].value("namespace", "default") : "default";
  const std::string what = describe("put", r, ns, name_of(object));
  const ResourceType type = type_of(*store_, r, what);
  translated(what, [&] { return store_->put(type, ns, object); });
}

std::vector<kube::json> StoreClient::all(const kube::Resource& r, std::string_view ns) {
  std::vector<json> out;
  const json listed = list(r, ns, {});
  for (const json& o : listed["items"]) out.push_back(o);
  return out;
}

bool StoreClient::has(const kube::Resource& r, std::string_view ns, std::string_view name) {
  try {
    get(r, ns, name);
    return true;
  } catch (const kube::NotFoundError&) {
    return false;
  }
}

void StoreClient::erase(const kube::Resource& r, std::string_view ns, std::string_view name) {
  const std::string what = describe("erase", r, ns, name);
  const ResourceType type = type_of(*store_, r, what);
  DeleteOptions now;
  now.grace_period_seconds = 0;
  try {
    store_->remove(type, std::string(ns), std::string(name), now);
  } catch (const StatusError& e) {
    if (e.http_status() != 404) kube::throw_api_error(e.http_status(), e.to_status().dump(), what);
  }
}

int StoreClient::writes() const {
  MutexLock lock(mu_);
  int n = 0;
  for (const auto& [_, c] : writes_) n += c;
  return n;
}

int StoreClient::writes_of(const std::string& verb, const std::string& plural) const {
  MutexLock lock(mu_);
  auto it = writes_.find({verb, plural});
  return it == writes_.end() ? 0 : it->second;
}

void StoreClient::reset_counts() {
  MutexLock lock(mu_);
  writes_.clear();
}

}  // namespace longhaul::fakeapi
