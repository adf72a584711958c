// FakeApiServer: the HTTP front end (routing, auth, faults, request log, watch streaming) over
// the Store, and the direct test API.
#include "longhaul/fakeapi/server.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <utility>

#include <longhaul/base/file.h>
#include <longhaul/base/log.h>

#include "longhaul/base/http_connection.h"
#include "longhaul/base/mutex.h"
#include "store.h"
#include "tls.h"

namespace longhaul::fakeapi {

std::vector<ResourceType> default_resource_types() {
  return {
      {"", "v1", "pods", "pod", "Pod", true, true, false},
      {"", "v1", "services", "service", "Service", true, true, false},
      {"", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", true,
       true, false},
      {"", "v1", "events", "event", "Event", true, false, false},
      {"", "v1", "configmaps", "configmap", "ConfigMap", true, false, false},
      {"", "v1", "secrets", "secret", "Secret", true, false, false},
      {"", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, false, false},
      {"", "v1", "endpoints", "endpoints", "Endpoints", true, false, false},
      {"", "v1", "nodes", "node", "Node", false, true, false},
      {"", "v1", "namespaces", "namespace", "Namespace", false, true, false},
      {"events.k8s.io", "v1", "events", "event", "Event", true, false, false},
      {"coordination.k8s.io", "v1", "leases", "lease", "Lease", true, false, false},
      {"longhaul.dev", "v1alpha1", "trainingjobs", "trainingjob", "TrainingJob", true, true, true},
  };
}

namespace {

using Clock = std::chrono::steady_clock;

const http::Headers kJsonHeaders = {{"Content-Type", "application/json"},
                                    {"Cache-Control", "no-cache, private"}};

struct CompiledFault {
  FaultRule rule;
  std::regex path;
};

// Where a request goes, after the path is parsed.
struct Route {
  bool resource = false;
  ResourceType type;
  std::string ns;
  std::string name;
  std::string subresource;
  std::string verb;
  bool legacy_watch = false;
};

bool truthy(const std::string& value) { return value == "true" || value == "1"; }

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

StatusError resource_not_found() {
  return StatusError(404, "NotFound", "the server could not find the requested resource",
                     json::object());
}

// The real server answers a completed DELETE with the deleted object for these types (their
// storage sets ReturnDeletedObject) and with a Success Status for the others.
bool returns_deleted_object(const ResourceType& type) {
  if (type.custom) return true;
  if (!type.group.empty()) return false;
  for (const char* plural :
       {"pods", "services", "persistentvolumeclaims", "persistentvolumes", "nodes", "namespaces"}) {
    if (type.plural == plural) return true;
  }
  return false;
}

std::optional<int64_t> int_param(const http::Request& request, const std::string& name) {
  if (!request.has_param(name)) return std::nullopt;
  const std::string value = request.param(name);
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') {
    throw StatusError(400, "BadRequest",
                      "invalid value for query parameter " + name + ": \"" + value + "\"");
  }
  return v;
}

}  // namespace

struct FakeApiServer::Impl {
  explicit Impl(Options opts) : options(std::move(opts)), store(options, notifier) {
    fault_random.seed(options.fault_seed);
  }

  void handle(const http::Request& request, http::Connection& connection);
  Route route(const http::Request& request) const;
  bool serve_non_resource(const http::Request& request, http::Connection& connection,
                          RequestRecord& record);
  void serve_resource(const http::Request& request, const Route& route,
                      http::Connection& connection, RequestRecord& record);
  void serve_watch(const http::Request& request, const Route& route, http::Connection& connection,
                   RequestRecord& record);
  json list_object(const ResourceType& type, const ListResult& result) const;
  std::optional<FaultRule> pick_fault(const std::string& verb, const std::string& path);
  bool sleep_interruptible(std::chrono::milliseconds delay);
  void log_request(RequestRecord record);
  void send_json(http::Connection& connection, int status, const json& body, RequestRecord& record,
                 const http::Headers& extra = {});
  void send_error(http::Connection& connection, const StatusError& error, RequestRecord& record,
                  const http::Headers& extra = {});
  json discovery(const std::vector<std::string>& segments) const;

  Options options;
  ChangeNotifier notifier;
  Store store;
  std::unique_ptr<TlsContext> tls;
  std::filesystem::path owned_tls_dir;  // removed in the destructor when we created it
  std::unique_ptr<http::ConnectionServer> http;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> watch_drop_interval_ms{0};
  std::atomic<size_t> in_flight{0};

  std::mutex sleep_mu;
  std::condition_variable sleep_cv;

  mutable Mutex log_mu;
  // Held by an HTTP write from before it touches the store until its request is logged, and by
  // the in-process readers (get, try_get, list): a test that sees a write's effect also finds
  // the write in requests(). Without it a test could count the writes before the one it had
  // just seen was logged.
  mutable std::mutex commit_mu;
  std::vector<RequestRecord> log GUARDED_BY(log_mu);

  mutable Mutex fault_mu;
  std::map<int, CompiledFault> faults GUARDED_BY(fault_mu);
  int next_fault_id GUARDED_BY(fault_mu) = 1;
  std::mt19937_64 fault_random GUARDED_BY(fault_mu);
  size_t injected GUARDED_BY(fault_mu) = 0;
};

// ---------------------------------------------------------------------------------------------
// Routing

Route FakeApiServer::Impl::route(const http::Request& request) const {
  std::vector<std::string> seg = split_path(request.path);
  Route r;
  std::string group, version;
  size_t rest;
  if (seg.size() >= 2 && seg[0] == "api") {
    version = seg[1];
    rest = 2;
  } else if (seg.size() >= 3 && seg[0] == "apis") {
    group = seg[1];
    version = seg[2];
    rest = 3;
  } else {
    return r;  // non-resource
  }
  if (seg.size() == rest) return r;  // discovery
  r.resource = true;
  if (seg[rest] == "watch") {
    r.legacy_watch = true;
    ++rest;
  }
  std::vector<std::string> parts(seg.begin() + static_cast<long>(rest), seg.end());
  std::optional<ResourceType> type;
  if (parts.size() >= 3 && parts[0] == "namespaces") {
    type = store.find(group, version, parts[2]);
    if (type && type->namespaced) {
      r.ns = parts[1];
      parts.erase(parts.begin(), parts.begin() + 2);
    } else {
      type.reset();
    }
  }
  if (!type && !parts.empty()) {
    type = store.find(group, version, parts[0]);
    // A namespaced type named with a cluster-wide path only lists/watches across namespaces.
    if (type && type->namespaced && parts.size() > 1) type.reset();
  }
  if (!type || parts.size() > 3) throw resource_not_found();
  r.type = *type;
  if (parts.size() >= 2) r.name = parts[1];
  if (parts.size() == 3) {
    r.subresource = parts[2];
    bool known = (r.subresource == "status" && r.type.status_subresource) ||
                 (r.type.group.empty() && r.type.plural == "pods" &&
                  (r.subresource == "binding" || r.subresource == "eviction"));
    if (!known) throw resource_not_found();
  }
  const std::string& m = request.method;
  bool collection = r.name.empty();
  if (m == "GET") {
    r.verb = (r.legacy_watch || truthy(request.param("watch"))) ? "watch"
             : collection                                       ? "list"
                                                                : "get";
  } else if (m == "POST" &&
             (collection || r.subresource == "binding" || r.subresource == "eviction")) {
    r.verb = "create";
  } else if (m == "PUT" && !collection) {
    r.verb = "update";
  } else if (m == "PATCH" && !collection) {
    r.verb = "patch";
  } else if (m == "DELETE") {
    r.verb = collection ? "deletecollection" : "delete";
  } else {
    throw StatusError(405, "MethodNotAllowed",
                      "the server does not allow this method on the requested resource");
  }
  if (r.type.namespaced && r.ns.empty() && r.verb != "list" && r.verb != "watch") {
    throw StatusError(405, "MethodNotAllowed",
                      "the server does not allow this method on the requested resource "
                      "(a namespaced " +
                          r.type.kind + " needs /namespaces/<ns>/ in the path)");
  }
  if ((r.subresource == "binding" || r.subresource == "eviction") && r.verb != "create") {
    throw StatusError(405, "MethodNotAllowed", "only POST is allowed on pods/" + r.subresource);
  }
  return r;
}

json FakeApiServer::Impl::discovery(const std::vector<std::string>& seg) const {
  std::vector<ResourceType> types = store.types();
  if (seg.size() == 1 && seg[0] == "api") {
    return {{"kind", "APIVersions"},
            {"versions", {"v1"}},
            {"serverAddressByClientCIDRs",
             {{{"clientCIDR", "0.0.0.0/0"},
               {"serverAddress", "127.0.0.1:" + std::to_string(http ? http->port() : 0)}}}}};
  }
  auto group_object = [&](const std::string& group) {
    json versions = json::array();
    for (const ResourceType& t : types) {
      if (t.group != group) continue;
      json v = {{"groupVersion", t.api_version()}, {"version", t.version}};
      if (std::find(versions.begin(), versions.end(), v) == versions.end()) versions.push_back(v);
    }
    return json{{"name", group}, {"versions", versions}, {"preferredVersion", versions.at(0)}};
  };
  if (seg.size() == 1 && seg[0] == "apis") {
    json groups = json::array();
    std::vector<std::string> seen;
    for (const ResourceType& t : types) {
      if (t.group.empty() || std::find(seen.begin(), seen.end(), t.group) != seen.end()) continue;
      seen.push_back(t.group);
      groups.push_back(group_object(t.group));
    }
    return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}};
  }
  if (seg.size() == 2 && seg[0] == "apis") {
    for (const ResourceType& t : types) {
      if (t.group == seg[1]) {
        json g = group_object(seg[1]);
        g["kind"] = "APIGroup";
        g["apiVersion"] = "v1";
        return g;
      }
    }
    throw resource_not_found();
  }
  std::string group = seg[0] == "api" ? "" : seg[1];
  std::string version = seg[0] == "api" ? seg[1] : seg[2];
  json resources = json::array();
  for (const ResourceType& t : types) {
    if (t.group != group || t.version != version) continue;
    json verbs = {"create", "delete", "deletecollection", "get",
                  "list",   "patch",  "update",           "watch"};
    resources.push_back({{"name", t.plural},
                         {"singularName", t.singular},
                         {"namespaced", t.namespaced},
                         {"kind", t.kind},
                         {"verbs", verbs}});
    if (t.status_subresource) {
      resources.push_back({{"name", t.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", t.namespaced},
                           {"kind", t.kind},
                           {"verbs", {"get", "patch", "update"}}});
    }
  }
  if (resources.empty()) throw resource_not_found();
  return {{"kind", "APIResourceList"},
          {"apiVersion", "v1"},
          {"groupVersion", group.empty() ? version : group + "/" + version},
          {"resources", resources}};
}

// ---------------------------------------------------------------------------------------------
// Request handling

void FakeApiServer::Impl::log_request(RequestRecord record) {
  {
    MutexLock lock(log_mu);
    if (log.size() >= std::max<size_t>(options.request_log_limit, 2)) {
      log.erase(log.begin(), log.begin() + static_cast<long>(log.size() / 2));
    }
    log.push_back(std::move(record));
  }
  notifier.bump();
}

void FakeApiServer::Impl::send_json(http::Connection& connection, int status, const json& body,
                                    RequestRecord& record, const http::Headers& extra) {
  http::Headers headers = kJsonHeaders;
  headers.insert(headers.end(), extra.begin(), extra.end());
  record.status = status;
  // Logged before the answer leaves, so a client holding the answer finds it in the log.
  log_request(record);
  connection.send_response(status, headers, body.dump());
}

void FakeApiServer::Impl::send_error(http::Connection& connection, const StatusError& error,
                                     RequestRecord& record, const http::Headers& extra) {
  send_json(connection, error.http_status(), error.to_status(), record, extra);
}

bool FakeApiServer::Impl::sleep_interruptible(std::chrono::milliseconds delay) {
  std::unique_lock<std::mutex> lock(sleep_mu);
  return !sleep_cv.wait_for(lock, delay, [&] { return stopping.load(); });
}

std::optional<FaultRule> FakeApiServer::Impl::pick_fault(const std::string& verb,
                                                         const std::string& path) {
  MutexLock lock(fault_mu);
  for (auto it = faults.begin(); it != faults.end(); ++it) {
    CompiledFault& fault = it->second;
    if (!fault.rule.verb.empty() && fault.rule.verb != verb) continue;
    if (!fault.rule.path_regex.empty() && !std::regex_search(path, fault.path)) continue;
    if (fault.rule.times == 0) continue;
    if (fault.rule.probability < 1.0) {
      double draw = std::uniform_real_distribution<double>(0.0, 1.0)(fault_random);
      if (draw >= fault.rule.probability) continue;
    }
    if (fault.rule.times > 0) --fault.rule.times;
    if (fault.rule.status != 0) ++injected;
    return fault.rule;
  }
  return std::nullopt;
}

void FakeApiServer::Impl::handle(const http::Request& request, http::Connection& connection) {
  struct InFlight {
    Impl& impl;
    explicit InFlight(Impl& i) : impl(i) {
      ++impl.in_flight;
      impl.notifier.bump();
    }
    ~InFlight() {
      --impl.in_flight;
      impl.notifier.bump();
    }
  } in_flight_guard(*this);
  RequestRecord record;
  record.method = request.method;
  record.path = request.path;
  record.query = request.query;
  record.content_type = request.header("content-type");
  try {
    const std::string& p = request.path;
    bool health = p == "/healthz" || p == "/livez" || p == "/readyz" ||
                  p.rfind("/healthz/", 0) == 0 || p.rfind("/livez/", 0) == 0 ||
                  p.rfind("/readyz/", 0) == 0;
    if (!options.bearer_token.empty() && !health && p != "/version") {
      if (request.header("authorization") != "Bearer " + options.bearer_token) {
        throw StatusError(401, "Unauthorized", "Unauthorized");
      }
    }
    Route r = route(request);
    if (r.resource) {
      record.verb = r.verb;
      record.resource = r.type.id();
      record.subresource = r.subresource;
      record.ns = r.ns;
      record.name = r.name;
      record.write = r.verb == "create" || r.verb == "update" || r.verb == "patch" ||
                     r.verb == "delete" || r.verb == "deletecollection";
    }
    if (!health) {
      std::optional<FaultRule> fault = pick_fault(r.resource ? r.verb : "", request.path);
      if (fault) {
        if (fault->latency.count() > 0 && !sleep_interruptible(fault->latency)) {
          connection.abort();
          return;
        }
        if (fault->status != 0) {
          record.injected = true;
          std::string reason = fault->status == 429   ? "TooManyRequests"
                               : fault->status == 503 ? "ServiceUnavailable"
                               : fault->status == 504 ? "Timeout"
                                                      : "InternalError";
          json details = json::object();
          http::Headers extra;
          if (fault->retry_after_seconds) {
            details["retryAfterSeconds"] = *fault->retry_after_seconds;
            extra.emplace_back("Retry-After", std::to_string(*fault->retry_after_seconds));
          }
          std::string message = fault->status == 429
                                    ? "the server has received too many requests and has asked "
                                      "us to try again later (injected fault)"
                                    : "injected fault: the fake API server failed this request "
                                      "on purpose (FaultRule)";
          if (!fault->reason.empty()) reason = fault->reason;
          if (!fault->message.empty()) message = fault->message;
          send_error(connection, StatusError(fault->status, reason, message, details), record,
                     extra);
          return;
        }
      }
    }
    if (!r.resource) {
      serve_non_resource(request, connection, record);
    } else if (r.verb == "watch") {
      serve_watch(request, r, connection, record);
      return;  // logged when the stream started
    } else {
      std::unique_lock<std::mutex> commit(commit_mu, std::defer_lock);
      if (record.write) commit.lock();
      serve_resource(request, r, connection, record);
    }
  } catch (const StatusError& error) {
    send_error(connection, error, record);
  } catch (const json::exception& error) {
    send_error(connection,
               StatusError(400, "BadRequest",
                           std::string("the request body is not valid JSON: ") + error.what()),
               record);
  } catch (const Error& error) {
    send_error(connection, StatusError(500, "InternalError", error.what()), record);
  }
}

bool FakeApiServer::Impl::serve_non_resource(const http::Request& request,
                                             http::Connection& connection, RequestRecord& record) {
  const std::string& p = request.path;
  if (p == "/healthz" || p == "/livez" || p == "/readyz" || p.rfind("/healthz/", 0) == 0 ||
      p.rfind("/livez/", 0) == 0 || p.rfind("/readyz/", 0) == 0) {
    record.status = 200;
    log_request(record);
    connection.send_response(200, {{"Content-Type", "text/plain; charset=utf-8"}}, "ok");
    return true;
  }
  if (request.method != "GET") {
    throw StatusError(405, "MethodNotAllowed", "the server does not allow this method");
  }
  if (p == "/version") {
    send_json(connection, 200,
              {{"major", "1"},
               {"minor", "31"},
               {"gitVersion", "v1.31.0-longhaul-fake"},
               {"gitCommit", "0000000000000000000000000000000000000000"},
               {"gitTreeState", "clean"},
               {"buildDate", "2026-01-01T00:00:00Z"},
               {"goVersion", "none"},
               {"compiler", "longhaul"},
               {"platform", "linux/amd64"}},
              record);
    return true;
  }
  std::vector<std::string> seg = split_path(p);
  if (!seg.empty() && (seg[0] == "api" || seg[0] == "apis") && seg.size() <= 3) {
    send_json(connection, 200, discovery(seg), record);
    return true;
  }
  if (seg.empty()) {
    send_json(
        connection, 200,
        {{"paths", {"/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"}}},
        record);
    return true;
  }
  throw resource_not_found();
}

json FakeApiServer::Impl::list_object(const ResourceType& type, const ListResult& result) const {
  json items = json::array();
  for (const json& item : result.items) {
    json copy = item;
    if (!type.custom) {
      // Built-in types are listed without per-item kind/apiVersion, as the real server does.
      copy.erase("kind");
      copy.erase("apiVersion");
    }
    items.push_back(std::move(copy));
  }
  json meta = {{"resourceVersion", std::to_string(result.resource_version)}};
  if (!result.continue_token.empty()) meta["continue"] = result.continue_token;
  if (result.remaining_item_count) meta["remainingItemCount"] = *result.remaining_item_count;
  return {{"kind", type.kind + "List"},
          {"apiVersion", type.api_version()},
          {"metadata", meta},
          {"items", items}};
}

namespace {

DeleteOptions delete_options(const http::Request& request) {
  DeleteOptions options;
  if (!request.body.empty()) {
    json body = json::parse(request.body);
    if (body.contains("gracePeriodSeconds") && body["gracePeriodSeconds"].is_number()) {
      options.grace_period_seconds = body["gracePeriodSeconds"].get<int64_t>();
    }
    if (body.contains("preconditions") && body["preconditions"].is_object()) {
      const json& pre = body["preconditions"];
      if (pre.contains("uid") && pre["uid"].is_string()) {
        options.precondition_uid = pre["uid"].get<std::string>();
      }
      if (pre.contains("resourceVersion") && pre["resourceVersion"].is_string()) {
        options.precondition_resource_version = pre["resourceVersion"].get<std::string>();
      }
    }
    if (body.contains("propagationPolicy") && body["propagationPolicy"].is_string()) {
      options.propagation_policy = body["propagationPolicy"].get<std::string>();
    }
    if (body.contains("orphanDependents") && body["orphanDependents"].is_boolean() &&
        options.propagation_policy.empty()) {
      options.propagation_policy = body["orphanDependents"].get<bool>() ? "Orphan" : "Background";
    }
  }
  if (auto grace = int_param(request, "gracePeriodSeconds")) options.grace_period_seconds = grace;
  if (request.has_param("propagationPolicy")) {
    options.propagation_policy = request.param("propagationPolicy");
  }
  if (request.has_param("orphanDependents") && options.propagation_policy.empty()) {
    options.propagation_policy =
        truthy(request.param("orphanDependents")) ? "Orphan" : "Background";
  }
  return options;
}

// The Status a subresource create (binding, eviction) answers with.
json created_status() {
  return {{"kind", "Status"},
          {"apiVersion", "v1"},
          {"metadata", json::object()},
          {"status", "Success"},
          {"code", 201}};
}

json parse_body(const http::Request& request) {
  std::string content_type = request.header("content-type");
  if (content_type.find("protobuf") != std::string::npos ||
      content_type.find("yaml") != std::string::npos) {
    throw StatusError(
        415, "UnsupportedMediaType",
        "the fake API server accepts only application/json bodies, not " + content_type);
  }
  if (request.body.empty()) {
    throw StatusError(400, "BadRequest", "the request body is empty; send a JSON object");
  }
  return json::parse(request.body);
}

}  // namespace

void FakeApiServer::Impl::serve_resource(const http::Request& request, const Route& r,
                                         http::Connection& connection, RequestRecord& record) {
  const ResourceType& type = r.type;
  bool status = r.subresource == "status";
  if (r.verb == "get") {
    send_json(connection, 200, store.get(type, r.ns, r.name), record);
  } else if (r.verb == "list") {
    LabelSelector labels = LabelSelector::parse(request.param("labelSelector"));
    FieldSelector fields = FieldSelector::parse(request.param("fieldSelector"), type);
    int64_t limit = int_param(request, "limit").value_or(0);
    ListResult result =
        store.list(type, r.ns, labels, fields, static_cast<size_t>(std::max<int64_t>(limit, 0)),
                   request.param("continue"), request.param("resourceVersion"),
                   request.param("resourceVersionMatch"));
    send_json(connection, 200, list_object(type, result), record);
  } else if (r.verb == "create" && r.subresource == "binding") {
    json body = parse_body(request);
    std::string node = body.contains("target") ? body["target"].value("name", "") : "";
    if (node.empty()) {
      throw StatusError(422, "Invalid",
                        "Binding \"" + r.name +
                            "\" is invalid: target.name: "
                            "Required value");
    }
    store.bind_pod(r.ns, r.name, node);
    send_json(connection, 201, created_status(), record);
  } else if (r.verb == "create" && r.subresource == "eviction") {
    json body = request.body.empty() ? json::object() : json::parse(request.body);
    http::Request inner;
    if (body.contains("deleteOptions")) inner.body = body["deleteOptions"].dump();
    store.evict_pod(r.ns, r.name, delete_options(inner));
    send_json(connection, 201, created_status(), record);
  } else if (r.verb == "create") {
    send_json(connection, 201, store.create(type, r.ns, parse_body(request)), record);
  } else if (r.verb == "update") {
    send_json(connection, 200, store.update(type, r.ns, r.name, parse_body(request), status),
              record);
  } else if (r.verb == "patch") {
    std::string content_type = request.header("content-type");
    content_type = content_type.substr(0, content_type.find(';'));
    PatchType patch_type;
    if (content_type == "application/merge-patch+json") {
      patch_type = PatchType::kMerge;
    } else if (content_type == "application/strategic-merge-patch+json") {
      patch_type = PatchType::kStrategicMerge;
    } else if (content_type == "application/json-patch+json") {
      patch_type = PatchType::kJson;
    } else {
      throw StatusError(415, "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types "
                        "include: application/json-patch+json, application/merge-patch+json, "
                        "application/strategic-merge-patch+json (the fake API server does not "
                        "support application/apply-patch+yaml)");
    }
    json patch = json::parse(request.body);
    send_json(connection, 200, store.patch(type, r.ns, r.name, patch, patch_type, status), record);
  } else if (r.verb == "delete") {
    json removed = store.remove(type, r.ns, r.name, delete_options(request));
    bool pending = false;  // still there: graceful pod deletion, finalizers, foreground
    try {
      pending = store.get(type, r.ns, r.name)["metadata"]["uid"] == removed["metadata"]["uid"];
    } catch (const StatusError&) {
    }
    if (!pending && !returns_deleted_object(type)) {
      // Types without ReturnDeletedObject answer a Success Status naming what was deleted.
      json details = {{"name", r.name}, {"kind", type.plural}, {"uid", removed["metadata"]["uid"]}};
      if (!type.group.empty()) details["group"] = type.group;
      send_json(connection, 200,
                {{"kind", "Status"},
                 {"apiVersion", "v1"},
                 {"metadata", json::object()},
                 {"status", "Success"},
                 {"details", details}},
                record);
    } else {
      send_json(connection, 200, removed, record);
    }
  } else if (r.verb == "deletecollection") {
    LabelSelector labels = LabelSelector::parse(request.param("labelSelector"));
    FieldSelector fields = FieldSelector::parse(request.param("fieldSelector"), type);
    DeleteOptions options = delete_options(request);
    ListResult matching = store.list(type, r.ns, labels, fields, 0, "", "", "");
    ListResult deleted;
    for (const json& item : matching.items) {
      const json& meta = item["metadata"];
      try {
        deleted.items.push_back(
            store.remove(type, meta.value("namespace", ""), meta.value("name", ""), options));
      } catch (const StatusError& e) {
        if (e.http_status() != 404) throw;
      }
    }
    deleted.resource_version = store.resource_version();
    send_json(connection, 200, list_object(type, deleted), record);
  }
}

void FakeApiServer::Impl::serve_watch(const http::Request& request, const Route& r,
                                      http::Connection& connection, RequestRecord& record) {
  LabelSelector labels = LabelSelector::parse(request.param("labelSelector"));
  std::string field_text = request.param("fieldSelector");
  if (!r.name.empty()) {
    field_text = "metadata.name=" + r.name + (field_text.empty() ? "" : "," + field_text);
  }
  FieldSelector fields = FieldSelector::parse(field_text, r.type);
  std::optional<int64_t> timeout_seconds = int_param(request, "timeoutSeconds");
  bool bookmarks = truthy(request.param("allowWatchBookmarks"));

  const http::Headers headers = kJsonHeaders;
  std::shared_ptr<Watcher> watcher;
  try {
    watcher =
        store.watch(r.type, r.ns, std::move(labels), std::move(fields),
                    request.param("resourceVersion"), truthy(request.param("sendInitialEvents")));
  } catch (const StatusError& error) {
    if (error.http_status() != 410) throw;
    // The real server answers 200 and sends the 410 Status as an ERROR event.
    record.status = 200;
    log_request(record);
    if (connection.begin_chunked(200, headers)) {
      json event = {{"type", "ERROR"}, {"object", error.to_status()}};
      connection.write_chunk(event.dump() + "\n");
      connection.end_chunked();
    }
    return;
  }
  struct Unwatch {
    Store& store;
    const std::shared_ptr<Watcher>& watcher;
    ~Unwatch() { store.unwatch(watcher); }
  } unwatch{store, watcher};

  record.status = 200;
  log_request(record);
  if (!connection.begin_chunked(200, headers)) return;

  const auto start = Clock::now();
  const auto end =
      start +
      (timeout_seconds && *timeout_seconds > 0
           ? std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(*timeout_seconds))
           : std::chrono::duration_cast<Clock::duration>(options.default_watch_timeout));
  auto drop_interval = std::chrono::milliseconds(watch_drop_interval_ms.load());
  const auto drop_at = drop_interval.count() > 0 ? start + drop_interval : Clock::time_point::max();
  const bool send_bookmarks = bookmarks && options.bookmark_interval.count() > 0;
  auto next_bookmark =
      send_bookmarks ? start + options.bookmark_interval : Clock::time_point::max();
  for (;;) {
    auto deadline = std::min({end, drop_at, next_bookmark});
    http::Connection::WaitResult woke = connection.wait(watcher->wake_fd(), deadline);
    if (woke == http::Connection::WaitResult::kClientClosed) return;
    if (woke == http::Connection::WaitResult::kWoken) {
      Watcher::Batch batch = watcher->take();
      if (batch.drop == DropMode::kAbort) {
        connection.abort();
        return;
      }
      for (const std::string& line : batch.lines) {
        if (!connection.write_chunk(line)) return;
      }
      if (batch.overflow || batch.drop == DropMode::kGraceful) {
        connection.end_chunked();
        return;
      }
      continue;
    }
    auto now = Clock::now();
    if (now >= end) {
      connection.end_chunked();
      return;
    }
    if (now >= drop_at) {
      connection.abort();
      return;
    }
    if (now >= next_bookmark) {
      store.bookmark(*watcher);
      next_bookmark = now + options.bookmark_interval;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// FakeApiServer

FakeApiServer::FakeApiServer(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}

FakeApiServer::~FakeApiServer() {
  stop();
  if (!impl_->owned_tls_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(impl_->owned_tls_dir, ignored);
  }
}

void FakeApiServer::start() {
  if (impl_->http && impl_->http->running()) return;
  if (impl_->options.tls.enabled && !impl_->tls) {
    std::filesystem::path dir = impl_->options.tls.cert_dir;
    if (dir.empty()) {
      std::string pattern = (std::filesystem::temp_directory_path() / "longhaul-fakeapi-XXXXXX");
      if (::mkdtemp(pattern.data()) == nullptr) {
        throw_errno("fake API server: cannot create a directory for TLS certificates", pattern,
                    errno);
      }
      dir = pattern;
      impl_->owned_tls_dir = dir;
    }
    impl_->tls = TlsContext::create(dir, impl_->options.bind_address);
  }
  impl_->stopping = false;
  http::ConnectionServer::TransportFactory transport;
  if (impl_->tls) transport = [tls = impl_->tls.get()] { return tls->transport(); };
  impl_->http = std::make_unique<http::ConnectionServer>(
      "fake API server",
      [this](const http::Request& request, http::Connection& connection) {
        impl_->handle(request, connection);
      },
      std::move(transport), "choose another --port (0 picks a free one)");
  impl_->http->start(impl_->options.bind_address, impl_->options.port);
  LH_LOG(DEBUG) << "fake API server listening" << kv("url", url());
}

void FakeApiServer::stop() {
  if (!impl_->http) return;
  {
    std::lock_guard<std::mutex> lock(impl_->sleep_mu);
    impl_->stopping = true;
  }
  impl_->sleep_cv.notify_all();
  impl_->http->stop();
  impl_->http.reset();
  impl_->notifier.bump();
}

bool FakeApiServer::running() const { return impl_->http && impl_->http->running(); }

int FakeApiServer::port() const { return impl_->http ? impl_->http->port() : 0; }

std::string FakeApiServer::url() const {
  std::string host = impl_->options.bind_address;
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  return std::string(impl_->tls ? "https" : "http") + "://" + host + ":" + std::to_string(port());
}

std::filesystem::path FakeApiServer::ca_file() const {
  return impl_->tls ? impl_->tls->ca_file() : std::filesystem::path();
}

void FakeApiServer::write_kubeconfig(const std::filesystem::path& path, std::string_view ns) const {
  std::string yaml;
  yaml += "apiVersion: v1\nkind: Config\nclusters:\n- name: longhaul-fake\n  cluster:\n";
  yaml += "    server: " + url() + "\n";
  if (impl_->tls) {
    yaml += "    certificate-authority-data: " + base64(impl_->tls->ca_pem()) + "\n";
  }
  yaml += "users:\n- name: longhaul-fake\n  user:";
  if (impl_->options.bearer_token.empty()) {
    yaml += " {}\n";
  } else {
    yaml += "\n    token: \"" + impl_->options.bearer_token + "\"\n";
  }
  yaml += "contexts:\n- name: longhaul-fake\n  context:\n    cluster: longhaul-fake\n";
  yaml += "    user: longhaul-fake\n    namespace: " + std::string(ns) + "\n";
  yaml += "current-context: longhaul-fake\npreferences: {}\n";
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  file::write_atomically(path, yaml);
}

json FakeApiServer::get(std::string_view resource, std::string_view ns,
                        std::string_view name) const {
  std::lock_guard<std::mutex> commit(impl_->commit_mu);
  return impl_->store.get(impl_->store.resolve(resource), std::string(ns), std::string(name));
}

std::optional<json> FakeApiServer::try_get(std::string_view resource, std::string_view ns,
                                           std::string_view name) const {
  try {
    return get(resource, ns, name);
  } catch (const StatusError& e) {
    if (e.http_status() == 404) return std::nullopt;
    throw;
  }
}

std::vector<json> FakeApiServer::list(std::string_view resource, std::string_view ns,
                                      std::string_view label_selector,
                                      std::string_view field_selector) const {
  ResourceType type = impl_->store.resolve(resource);
  std::lock_guard<std::mutex> commit(impl_->commit_mu);
  return impl_->store
      .list(type, std::string(ns), LabelSelector::parse(label_selector),
            FieldSelector::parse(field_selector, type), 0, "", "", "")
      .items;
}

json FakeApiServer::create(std::string_view resource, std::string_view ns, const json& object) {
  return impl_->store.create(impl_->store.resolve(resource), std::string(ns), object);
}

namespace {
std::string name_of(const json& object) {
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].contains("name") ||
      !object["metadata"]["name"].is_string()) {
    throw StatusError(400, "BadRequest", "the object has no metadata.name");
  }
  return object["metadata"]["name"].get<std::string>();
}
}  // namespace

json FakeApiServer::update(std::string_view resource, std::string_view ns, const json& object) {
  return impl_->store.update(impl_->store.resolve(resource), std::string(ns), name_of(object),
                             object, false);
}

json FakeApiServer::update_status(std::string_view resource, std::string_view ns,
                                  const json& object) {
  return impl_->store.update(impl_->store.resolve(resource), std::string(ns), name_of(object),
                             object, true);
}

json FakeApiServer::patch(std::string_view resource, std::string_view ns, std::string_view name,
                          const json& patch, PatchType type, bool status_subresource) {
  return impl_->store.patch(impl_->store.resolve(resource), std::string(ns), std::string(name),
                            patch, type, status_subresource);
}

json FakeApiServer::patch_status(std::string_view resource, std::string_view ns,
                                 std::string_view name, const json& status_patch) {
  return patch(resource, ns, name, json{{"status", status_patch}}, PatchType::kMerge, true);
}

json FakeApiServer::remove(std::string_view resource, std::string_view ns, std::string_view name,
                           const DeleteOptions& options) {
  return impl_->store.remove(impl_->store.resolve(resource), std::string(ns), std::string(name),
                             options);
}

void FakeApiServer::finalize_pod_deletion(std::string_view ns, std::string_view name) {
  DeleteOptions options;
  options.grace_period_seconds = 0;
  remove("pods", ns, name, options);
}

uint64_t FakeApiServer::resource_version() const { return impl_->store.resource_version(); }

void FakeApiServer::register_resource(const ResourceType& type) {
  impl_->store.register_type(type);
}

bool FakeApiServer::wait_for(const std::function<bool()>& predicate,
                             std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    uint64_t seen = impl_->notifier.sequence();
    if (predicate()) return true;
    if (Clock::now() >= deadline) return false;
    impl_->notifier.wait_change(seen, deadline);
  }
}

std::vector<RequestRecord> FakeApiServer::requests() const {
  MutexLock lock(impl_->log_mu);
  return impl_->log;
}

size_t FakeApiServer::count_requests(const RequestMatch& match) const {
  std::optional<std::regex> path;
  if (!match.path_regex.empty()) {
    try {
      path.emplace(match.path_regex);
    } catch (const std::regex_error& e) {
      throw InvalidArgument("fake API server: RequestMatch path_regex '" + match.path_regex +
                            "' is not a valid ECMAScript regex: " + e.what());
    }
  }
  MutexLock lock(impl_->log_mu);
  size_t n = 0;
  for (const RequestRecord& r : impl_->log) {
    if (!match.method.empty() && r.method != match.method) continue;
    if (path && !std::regex_search(r.path, *path)) continue;
    if (!match.verb.empty() && r.verb != match.verb) continue;
    if (!match.resource.empty() && r.resource != match.resource &&
        r.resource.substr(0, r.resource.find('.')) != match.resource) {
      continue;
    }
    if (!match.subresource.empty() && r.subresource != match.subresource) continue;
    if (!match.ns.empty() && r.ns != match.ns) continue;
    if (!match.name.empty() && r.name != match.name) continue;
    if (match.status && r.status != *match.status) continue;
    if (match.write && r.write != *match.write) continue;
    if (match.injected && r.injected != *match.injected) continue;
    ++n;
  }
  return n;
}

size_t FakeApiServer::requests_in_flight() const { return impl_->in_flight.load(); }

void FakeApiServer::clear_requests() {
  MutexLock lock(impl_->log_mu);
  impl_->log.clear();
}

std::vector<RequestRecord> FakeApiServer::take_requests() {
  MutexLock lock(impl_->log_mu);
  return std::exchange(impl_->log, {});
}

int FakeApiServer::add_fault(const FaultRule& rule) {
  CompiledFault fault{rule, std::regex()};
  try {
    fault.path = std::regex(rule.path_regex.empty() ? std::string(".") : rule.path_regex);
  } catch (const std::regex_error& e) {
    throw InvalidArgument("fake API server: fault path_regex '" + rule.path_regex +
                          "' is not a valid ECMAScript regex: " + e.what());
  }
  MutexLock lock(impl_->fault_mu);
  int id = impl_->next_fault_id++;
  impl_->faults.emplace(id, std::move(fault));
  return id;
}

void FakeApiServer::remove_fault(int id) {
  MutexLock lock(impl_->fault_mu);
  impl_->faults.erase(id);
}

void FakeApiServer::clear_faults() {
  MutexLock lock(impl_->fault_mu);
  impl_->faults.clear();
}

void FakeApiServer::set_fault_seed(uint64_t seed) {
  MutexLock lock(impl_->fault_mu);
  impl_->fault_random.seed(seed);
}

size_t FakeApiServer::injected_fault_count() const {
  MutexLock lock(impl_->fault_mu);
  return impl_->injected;
}

void FakeApiServer::drop_watches(DropMode mode) { impl_->store.drop_watches(mode); }

void FakeApiServer::set_watch_drop_interval(std::chrono::milliseconds interval) {
  impl_->watch_drop_interval_ms = interval.count();
}

void FakeApiServer::expire_history() { impl_->store.expire_history(); }

size_t FakeApiServer::open_watch_count() const { return impl_->store.watch_count(); }

}  // namespace longhaul::fakeapi
