#include "store.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include <sys/eventfd.h>
#include <unistd.h>

#include "longhaul/base/rfc3339.h"

namespace longhaul::fakeapi {
namespace {

Code code_for_status(int http_status, const std::string& reason) {
  switch (http_status) {
    case 400:
    case 415:
    case 422:
      return Code::kInvalidArgument;
    case 401:
    case 403:
      return Code::kPermissionDenied;
    case 404:
      return Code::kNotFound;
    case 409:
      return reason == "AlreadyExists" ? Code::kAlreadyExists : Code::kAborted;
    case 410:
      return Code::kOutOfRange;
    case 429:
    case 500:
    case 503:
    case 504:
      return Code::kUnavailable;
    default:
      return Code::kInternal;
  }
}

// `pods "x"` or `trainingjobs.longhaul.dev "x"`, as the API server names objects in messages.
std::string qualified(const ResourceType& type, const std::string& name) {
  return type.id() + " \"" + name + "\"";
}

json details_for(const ResourceType& type, const std::string& name) {
  json details = {{"name", name}, {"kind", type.plural}};
  if (!type.group.empty()) details["group"] = type.group;
  return details;
}

StatusError not_found(const ResourceType& type, const std::string& name) {
  return StatusError(404, "NotFound", qualified(type, name) + " not found",
                     details_for(type, name));
}

StatusError conflict(const ResourceType& type, const std::string& name, const std::string& why) {
  return StatusError(409, "Conflict",
                     "Operation cannot be fulfilled on " + qualified(type, name) + ": " + why,
                     details_for(type, name));
}

StatusError invalid(const ResourceType& type, const std::string& name, const std::string& field,
                    const std::string& message) {
  json details = details_for(type, name);
  details["kind"] = type.kind;
  details["causes"] =
      json::array({{{"reason", "FieldValueInvalid"}, {"message", message}, {"field", field}}});
  return StatusError(422, "Invalid",
                     type.kind + " \"" + name + "\" is invalid: " + field + ": " + message,
                     details);
}

bool valid_dns_subdomain(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  if (!std::isalnum(static_cast<unsigned char>(name.front())) ||
      !std::isalnum(static_cast<unsigned char>(name.back()))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (std::islower(static_cast<unsigned char>(c)) ||
            std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.');
  });
}

const json& metadata_of(const json& object) {
  static const json empty = json::object();
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : empty;
}

std::string string_field(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A patch whose result names another uid than the stored object's is refused, as a real API server
// does (422, "metadata.uid: Invalid value: ...: field is immutable"): a client that puts the uid
// it read into a patch (the kubelet's status patches, the operator's annotations) makes it a
// precondition, so a write aimed at a deleted object never lands on a same-name successor.
void check_uid_unchanged(const ResourceType& type, const std::string& name, const json& existing,
                         const json& candidate) {
  const std::string uid = string_field(metadata_of(candidate), "uid");
  if (!uid.empty() && uid != string_field(metadata_of(existing), "uid")) {
    throw invalid(type, name, "metadata.uid", "Invalid value: \"" + uid + "\": field is immutable");
  }
}

bool has_finalizers(const json& object) {
  const json& meta = metadata_of(object);
  auto it = meta.find("finalizers");
  return it != meta.end() && it->is_array() && !it->empty();
}

// An object whose deletion was requested and that nothing holds any more: no finalizers and no
// pending graceful period (a pod a kubelet has not finalized keeps deletionGracePeriodSeconds>0).
bool deletion_complete(const json& object) {
  const json& meta = metadata_of(object);
  if (!meta.contains("deletionTimestamp") || has_finalizers(object)) return false;
  auto grace = meta.find("deletionGracePeriodSeconds");
  return grace == meta.end() || !grace->is_number() || grace->get<int64_t>() == 0;
}

bool is_pods(const ResourceType& type) { return type.group.empty() && type.plural == "pods"; }

// What generation tracks: everything but metadata (and status when it is a subresource).
bool spec_changed(const ResourceType& type, const json& before, const json& after) {
  json a = before;
  json b = after;
  for (json* o : {&a, &b}) {
    o->erase("metadata");
    o->erase("kind");
    o->erase("apiVersion");
    if (type.status_subresource) o->erase("status");
  }
  return a != b;
}

// Pod specs are immutable except a few fields (the real server's validation); a client that
// tries more gets 422 here rather than first on a real cluster.
std::string forbidden_pod_spec_change(const json& before, const json& after) {
  auto normalize = [](json spec) {
    if (!spec.is_object()) return spec;
    for (const char* list : {"containers", "initContainers", "ephemeralContainers"}) {
      if (spec.contains(list) && spec[list].is_array()) {
        for (json& c : spec[list]) {
          if (c.is_object()) c.erase("image");
        }
      }
    }
    for (const char* k : {"activeDeadlineSeconds", "tolerations", "schedulingGates",
                          "terminationGracePeriodSeconds"}) {
      spec.erase(k);
    }
    return spec;
  };
  json a = before.contains("spec") ? before["spec"] : json::object();
  json b = after.contains("spec") ? after["spec"] : json::object();
  if (normalize(a) == normalize(b)) return {};
  return "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
         "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
         "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be "
         "set to 1 if it was previously negative)";
}

std::string forbidden_claim_spec_change(const json& before, const json& after) {
  auto normalize = [](json spec) {
    if (spec.is_object() && spec.contains("resources") && spec["resources"].is_object()) {
      spec["resources"].erase("requests");
    }
    return spec;
  };
  json a = before.contains("spec") ? before["spec"] : json::object();
  json b = after.contains("spec") ? after["spec"] : json::object();
  if (normalize(a) == normalize(b)) return {};
  return "Forbidden: spec is immutable after creation except resources.requests and "
         "volumeAttributesClassName for bound claims";
}

void default_pod(json& pod) {
  json& spec = pod["spec"];
  if (!spec.is_object()) spec = json::object();
  if (!spec.contains("restartPolicy")) spec["restartPolicy"] = "Always";
  if (!spec.contains("terminationGracePeriodSeconds")) spec["terminationGracePeriodSeconds"] = 30;
  if (!spec.contains("dnsPolicy")) spec["dnsPolicy"] = "ClusterFirst";
  if (!spec.contains("schedulerName")) spec["schedulerName"] = "default-scheduler";
  // The ServiceAccount admission plugin's default.
  if (!spec.contains("serviceAccountName")) spec["serviceAccountName"] = "default";
  for (const char* list : {"initContainers", "containers"}) {
    if (!spec.contains(list) || !spec[list].is_array()) continue;
    for (json& c : spec[list]) {
      if (!c.is_object()) continue;
      if (!c.contains("terminationMessagePath")) {
        c["terminationMessagePath"] = "/dev/termination-log";
      }
      if (!c.contains("terminationMessagePolicy")) c["terminationMessagePolicy"] = "File";
      if (!c.contains("imagePullPolicy")) {
        std::string image = string_field(c, "image");
        bool latest = image.find(':') == std::string::npos ||
                      (image.size() >= 7 && image.compare(image.size() - 7, 7, ":latest") == 0);
        c["imagePullPolicy"] = latest ? "Always" : "IfNotPresent";
      }
    }
  }
  pod["status"] = {{"phase", "Pending"}};
}

json pod_condition(const std::string& type, const std::string& reason, const std::string& message,
                   const std::string& now) {
  json c = {{"type", type}, {"status", "True"}, {"lastTransitionTime", now}};
  if (!reason.empty()) c["reason"] = reason;
  if (!message.empty()) c["message"] = message;
  return c;
}

void set_condition(json& object, const json& condition) {
  json& conditions = object["status"]["conditions"];
  if (!conditions.is_array()) conditions = json::array();
  for (json& c : conditions) {
    if (c.value("type", "") == condition["type"]) {
      c = condition;
      return;
    }
  }
  conditions.push_back(condition);
}

std::string base64_encode(const std::string& in) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  while (i + 2 < in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {table[v >> 18], table[(v >> 12) & 63], table[(v >> 6) & 63], table[v & 63]};
    i += 3;
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += {table[v >> 18], table[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {table[v >> 18], table[(v >> 12) & 63], table[(v >> 6) & 63], '='};
  }
  return out;
}

std::string base64_decode(const std::string& in) {
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+' || c == '-')
      v = 62;
    else if (c == '/' || c == '_')
      v = 63;
    else
      continue;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

uint64_t parse_resource_version(const std::string& text) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), ::isdigit) || text.size() > 19) {
    throw StatusError(400, "BadRequest", "invalid resource version: \"" + text + "\"");
  }
  return std::stoull(text);
}

std::string event_type_name(int type) {
  static const char* names[] = {"ADDED", "MODIFIED", "DELETED"};
  return names[type];
}

// The body of a create: a JSON object whose kind and apiVersion, when given, are the
// collection's (400 BadRequest otherwise, as the API server answers).
void check_create_body(const ResourceType& type, const json& object) {
  if (!object.is_object()) {
    throw StatusError(400, "BadRequest", "the body of the request is not a JSON object");
  }
  if (object.contains("kind") && object["kind"] != type.kind) {
    throw StatusError(400, "BadRequest",
                      "the kind \"" + object["kind"].dump() + "\" of the body does not match " +
                          type.kind + " (the collection in the URL)");
  }
  if (object.contains("apiVersion") && object["apiVersion"] != type.api_version()) {
    throw StatusError(400, "BadRequest",
                      "the API version in the data (" + object["apiVersion"].dump() +
                          ") does not match the expected API version (" + type.api_version() + ")");
  }
}

// A namespaced object takes the namespace of the URL (which must be given, and agree with the
// body's); a cluster-scoped one has none.
void place_in_namespace(const ResourceType& type, const std::string& ns, json& meta) {
  if (!type.namespaced) {
    meta.erase("namespace");
    return;
  }
  if (ns.empty()) {
    throw StatusError(400, "BadRequest", "a namespace is required to create " + type.plural);
  }
  const std::string body_ns = string_field(meta, "namespace");
  if (!body_ns.empty() && body_ns != ns) {
    throw StatusError(400, "BadRequest",
                      "the namespace of the provided object does not match the namespace sent "
                      "on the request");
  }
  meta["namespace"] = ns;
}

// A new PersistentVolumeClaim is Pending, or Bound at once (with the access modes and capacity
// it asked for) when the server binds claims.
void default_claim_status(json& claim, bool bind) {
  claim["status"] = {{"phase", "Pending"}};
  if (!bind) return;
  const json& spec = claim["spec"];
  claim["status"]["phase"] = "Bound";
  if (spec.is_object() && spec.contains("accessModes")) {
    claim["status"]["accessModes"] = spec["accessModes"];
  }
  if (spec.is_object() && spec.contains("resources") && spec["resources"].contains("requests")) {
    claim["status"]["capacity"] = spec["resources"]["requests"];
  }
}

// A new Service's defaults: type ClusterIP, sessionAffinity None, a cluster IP drawn from
// `random` (only when none is given), TCP ports whose targetPort is their port.
void default_service_spec(json& service, std::mt19937_64& random) {
  json& spec = service["spec"];
  if (!spec.is_object()) spec = json::object();
  if (!spec.contains("type")) spec["type"] = "ClusterIP";
  if (!spec.contains("sessionAffinity")) spec["sessionAffinity"] = "None";
  if (!spec.contains("clusterIP")) {
    const uint64_t n = random();
    spec["clusterIP"] =
        "10.96." + std::to_string((n >> 8) % 256) + "." + std::to_string(n % 254 + 1);
  }
  if (!spec.contains("clusterIPs")) spec["clusterIPs"] = json::array({spec["clusterIP"]});
  if (spec.contains("ports") && spec["ports"].is_array()) {
    for (json& port : spec["ports"]) {
      if (!port.contains("protocol")) port["protocol"] = "TCP";
      if (!port.contains("targetPort") && port.contains("port")) {
        port["targetPort"] = port["port"];
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

StatusError::StatusError(int http_status, std::string reason, const std::string& message,
                         json details)
    : Error(code_for_status(http_status, reason), message),
      http_status_(http_status),
      reason_(std::move(reason)),
      details_(std::move(details)) {}

json StatusError::to_status() const {
  json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
                 {"status", "Failure"}, {"message", what()},  {"reason", reason_},
                 {"code", http_status_}};
  if (!details_.empty()) status["details"] = details_;
  return status;
}

std::string base64(const std::string& bytes) { return base64_encode(bytes); }

json selector_view(const json& object) {
  json view = json::object();
  const json& meta = metadata_of(object);
  json& vm = view["metadata"];
  vm = json::object();
  for (const char* k : {"name", "namespace", "labels"}) {
    if (meta.contains(k)) vm[k] = meta[k];
  }
  auto copy = [&](const char* section, std::initializer_list<const char*> keys) {
    auto it = object.find(section);
    if (it == object.end() || !it->is_object()) return;
    for (const char* k : keys) {
      if (it->contains(k)) view[section][k] = (*it)[k];
    }
  };
  copy("spec", {"nodeName", "restartPolicy", "schedulerName", "serviceAccountName", "hostNetwork",
                "unschedulable"});
  copy("status", {"phase", "podIP", "nominatedNodeName"});
  for (const char* k : {"involvedObject", "reason", "reportingComponent", "source", "type"}) {
    if (object.contains(k)) view[k] = object[k];
  }
  return view;
}

// ---------------------------------------------------------------------------------------------

void ChangeNotifier::bump() {
  {
    MutexLock lock(mu_);
    ++sequence_;
  }
  cv_.notify_all();
}

uint64_t ChangeNotifier::sequence() const {
  MutexLock lock(mu_);
  return sequence_;
}

void ChangeNotifier::wait_change(uint64_t seen,
                                 std::chrono::steady_clock::time_point deadline) const {
  MutexLock lock(mu_);
  cv_.wait_until(mu_, deadline, [&]() REQUIRES(mu_) { return sequence_ != seen; });
}

// ---------------------------------------------------------------------------------------------

Watcher::Watcher(const ResourceType& type, std::string ns, LabelSelector labels,
                 FieldSelector fields, size_t max_queue)
    : type_(type),
      ns_(std::move(ns)),
      labels_(std::move(labels)),
      fields_(std::move(fields)),
      max_queue_(max_queue),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (wake_fd_ < 0) throw_errno("fake API server: cannot create an eventfd for a watch", "", errno);
}

Watcher::~Watcher() { ::close(wake_fd_); }

bool Watcher::matches(const json& view) const {
  const json& meta = metadata_of(view);
  if (!ns_.empty() && string_field(meta, "namespace") != ns_) return false;
  static const json no_labels = json::object();
  return labels_.matches(meta.contains("labels") ? meta["labels"] : no_labels) &&
         fields_.matches(view);
}

void Watcher::push(std::string line) {
  {
    MutexLock lock(mu_);
    if (overflow_) return;
    if (lines_.size() >= max_queue_) {
      overflow_ = true;
      lines_.clear();
    } else {
      lines_.push_back(std::move(line));
    }
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void Watcher::request_drop(DropMode mode) {
  {
    MutexLock lock(mu_);
    drop_ = mode;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

Watcher::Batch Watcher::take() {
  uint64_t counter;
  [[maybe_unused]] ssize_t n = ::read(wake_fd_, &counter, sizeof(counter));
  Batch batch;
  MutexLock lock(mu_);
  batch.lines.assign(std::make_move_iterator(lines_.begin()),
                     std::make_move_iterator(lines_.end()));
  lines_.clear();
  batch.drop = drop_;
  batch.overflow = overflow_;
  return batch;
}

// ---------------------------------------------------------------------------------------------

Store::Store(const Options& options, ChangeNotifier& notifier)
    : options_(options), notifier_(notifier), random_(std::random_device{}()) {
  for (const ResourceType& type : options.resource_types) register_type(type);
}

void Store::register_type(const ResourceType& type) {
  MutexLock lock(mu_);
  types_[type.id()] = type;
}

ResourceType Store::resolve(std::string_view name) const {
  MutexLock lock(mu_);
  auto it = types_.find(std::string(name));
  if (it != types_.end()) return it->second;
  const ResourceType* found = nullptr;
  for (const auto& [id, type] : types_) {
    if (type.plural == name && (found == nullptr || type.group.empty())) found = &type;
  }
  if (found == nullptr) {
    throw StatusError(404, "NotFound",
                      "the server could not find the requested resource (" + std::string(name) +
                          "); register it with FakeApiServer::register_resource");
  }
  return *found;
}

std::optional<ResourceType> Store::find(std::string_view group, std::string_view version,
                                        std::string_view plural) const {
  MutexLock lock(mu_);
  for (const auto& [id, type] : types_) {
    if (type.group == group && type.version == version && type.plural == plural) return type;
  }
  return std::nullopt;
}

std::vector<ResourceType> Store::types() const {
  MutexLock lock(mu_);
  std::vector<ResourceType> out;
  for (const auto& [id, type] : types_) out.push_back(type);
  return out;
}

std::map<Store::Key, json>& Store::objects_of(const ResourceType& type) {
  return objects_[type.id()];
}

json* Store::find_locked(const ResourceType& type, const std::string& ns, const std::string& name) {
  auto& objects = objects_of(type);
  auto it = objects.find(Key(type.namespaced ? ns : "", name));
  return it == objects.end() ? nullptr : &it->second;
}

uint64_t Store::next_resource_version_locked() { return ++resource_version_; }

std::string Store::timestamp_locked(std::chrono::seconds offset) const {
  const auto now = options_.clock ? options_.clock() : std::chrono::system_clock::now();
  return format_rfc3339(now + offset);
}

std::string Store::new_uid_locked() {
  uint64_t a = random_(), b = random_();
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-4%03x-%04x-%012llx", uint32_t(a >> 32),
                uint32_t(a >> 16) & 0xffff, uint32_t(a) & 0xfff,
                (uint32_t(b >> 48) & 0x3fff) | 0x8000,
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

std::string Store::generate_name_locked(const std::string& prefix) {
  static const char alphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  std::string name = prefix;
  for (int i = 0; i < 5; ++i) name.push_back(alphabet[random_() % (sizeof(alphabet) - 1)]);
  return name;
}

json Store::get(const ResourceType& type, const std::string& ns, const std::string& name) const {
  MutexLock lock(mu_);
  auto types_it = objects_.find(type.id());
  if (types_it != objects_.end()) {
    auto it = types_it->second.find(Key(type.namespaced ? ns : "", name));
    if (it != types_it->second.end()) return it->second;
  }
  throw not_found(type, name);
}

ListResult Store::list(const ResourceType& type, const std::string& ns, const LabelSelector& labels,
                       const FieldSelector& fields, size_t limit, const std::string& continue_token,
                       const std::string& resource_version,
                       const std::string& resource_version_match) {
  MutexLock lock(mu_);
  ListResult result;
  result.resource_version = resource_version_;
  Key start;
  bool has_start = false;
  if (!continue_token.empty()) {
    json token = json::parse(base64_decode(continue_token), nullptr, false);
    if (!token.is_object() || !token.contains("rv") || !token.contains("start")) {
      throw StatusError(400, "BadRequest", "continue key is not valid: malformed token");
    }
    uint64_t rv = token["rv"].get<uint64_t>();
    if (rv < oldest_watchable_) {
      throw StatusError(410, "Expired",
                        "The provided continue parameter is too old to display a consistent list "
                        "result. You can start a new list without the continue parameter.");
    }
    result.resource_version = rv;
    start = Key(token["start"][0].get<std::string>(), token["start"][1].get<std::string>());
    has_start = true;
  } else if (!resource_version.empty() && resource_version != "0") {
    uint64_t rv = parse_resource_version(resource_version);
    if (rv > resource_version_) {
      json details = {{"causes", json::array({{{"reason", "ResourceVersionTooLarge"},
                                               {"message", "Too large resource version"}}})},
                      {"retryAfterSeconds", 1}};
      throw StatusError(504, "Timeout",
                        "Too large resource version: " + resource_version +
                            ", current: " + std::to_string(resource_version_),
                        details);
    }
    if (resource_version_match == "Exact" && rv < oldest_watchable_) {
      throw StatusError(410, "Expired",
                        "too old resource version: " + resource_version + " (" +
                            std::to_string(oldest_watchable_) + ")");
    }
  }
  auto& objects = objects_of(type);
  auto it = has_start ? objects.upper_bound(start) : objects.begin();
  for (; it != objects.end(); ++it) {
    const json& object = it->second;
    if (!ns.empty() && it->first.first != ns) continue;
    if (!labels.empty()) {
      const json& meta = metadata_of(object);
      auto labels_it = meta.find("labels");
      static const json no_labels = json::object();
      if (!labels.matches(labels_it != meta.end() ? *labels_it : no_labels)) continue;
    }
    if (!fields.empty() && !fields.matches(object)) continue;
    if (limit > 0 && result.items.size() == limit) {
      // There is more: hand out a continue token that starts after the last item returned.
      const json& last_meta = metadata_of(result.items.back());
      json token = {{"v", "meta.k8s.io/v1"},
                    {"rv", result.resource_version},
                    {"start",
                     {type.namespaced ? string_field(last_meta, "namespace") : "",
                      string_field(last_meta, "name")}}};
      result.continue_token = base64_encode(token.dump());
      if (labels.empty() && fields.empty()) {
        int64_t remaining = 0;
        for (; it != objects.end(); ++it) {
          if (ns.empty() || it->first.first == ns) ++remaining;
        }
        result.remaining_item_count = remaining;
      }
      break;
    }
    result.items.push_back(object);
  }
  return result;
}

void Store::commit_locked(const ResourceType& type, EventType event_type, const json& object,
                          const json* previous) {
  Event event;
  event.resource_version = resource_version_;
  event.type_id = type.id();
  event.type = event_type;
  event.view = selector_view(object);
  event.previous_view = previous != nullptr ? selector_view(*previous) : json();
  event.serialized = std::make_shared<const std::string>(object.dump());
  for (const auto& watcher : watchers_) {
    if (watcher->type().id() == event.type_id) deliver_locked(*watcher, event);
  }
  history_.push_back(std::move(event));
  while (history_.size() > std::max<size_t>(options_.event_history_size, 1)) {
    oldest_watchable_ = history_.front().resource_version;
    history_.pop_front();
  }
  notifier_.bump();
}

void Store::deliver_locked(Watcher& watcher, const Event& event) const {
  bool now = event.type != EventType::kDeleted && watcher.matches(event.view);
  bool before = !event.previous_view.is_null() && watcher.matches(event.previous_view);
  EventType sent;
  switch (event.type) {
    case EventType::kAdded:
      if (!now) return;
      sent = EventType::kAdded;
      break;
    case EventType::kModified:
      if (now && before)
        sent = EventType::kModified;
      else if (now)
        sent = EventType::kAdded;
      else if (before)
        sent = EventType::kDeleted;  // left the selection
      else
        return;
      break;
    case EventType::kDeleted:
      if (!watcher.matches(event.view)) return;
      sent = EventType::kDeleted;
      break;
    default:
      return;
  }
  std::string line = "{\"type\":\"" + event_type_name(static_cast<int>(sent)) + "\",\"object\":";
  line += *event.serialized;
  line += "}\n";
  watcher.push(std::move(line));
}

// Create, as the API server runs it: admission of the body (kind, apiVersion, namespace), the
// name (generateName, validity, uniqueness), the fields the server owns, the defaults of the
// built-in kinds, then the write itself (resourceVersion, ADDED event). Every check comes before
// anything changes, so a refused create leaves the store as it was.
json Store::create(const ResourceType& type, const std::string& ns, json object) {
  MutexLock lock(mu_);
  check_create_body(type, object);
  json& meta = object["metadata"];
  if (!meta.is_object()) meta = json::object();
  place_in_namespace(type, ns, meta);
  const Key key = claim_name_locked(type, type.namespaced ? ns : "", meta);
  set_server_fields_locked(type, object);
  apply_create_defaults_locked(type, object);
  return store_created_locked(type, key, std::move(object));
}

Store::Key Store::claim_name_locked(const ResourceType& type, const std::string& key_ns,
                                    json& meta) {
  const auto& objects = objects_of(type);
  std::string name = string_field(meta, "name");
  if (name.empty()) {
    const std::string generate = string_field(meta, "generateName");
    if (generate.empty()) {
      throw invalid(type, "", "metadata.name", "Required value: name or generateName is required");
    }
    do {
      name = generate_name_locked(generate);
    } while (objects.count(Key(key_ns, name)) != 0);
    meta["name"] = name;
  }
  if (!valid_dns_subdomain(name)) {
    throw invalid(type, name, "metadata.name",
                  "Invalid value: \"" + name +
                      "\": a lowercase RFC 1123 subdomain must consist of lower case "
                      "alphanumeric characters, '-' or '.', and must start and end with an "
                      "alphanumeric character");
  }
  if (objects.count(Key(key_ns, name)) != 0) {
    throw StatusError(409, "AlreadyExists", qualified(type, name) + " already exists",
                      details_for(type, name));
  }
  return Key(key_ns, name);
}

void Store::set_server_fields_locked(const ResourceType& type, json& object) {
  object["kind"] = type.kind;
  object["apiVersion"] = type.api_version();
  json& meta = object["metadata"];
  for (const char* k : {"deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"}) {
    meta.erase(k);
  }
  meta["uid"] = new_uid_locked();
  meta["creationTimestamp"] = timestamp_locked();
  meta["generation"] = 1;
  if (type.status_subresource && type.custom) object.erase("status");
}

void Store::apply_create_defaults_locked(const ResourceType& type, json& object) {
  if (is_pods(type)) {
    default_pod(object);
    if (!options_.default_node_name.empty() && string_field(object["spec"], "nodeName").empty()) {
      object["spec"]["nodeName"] = options_.default_node_name;
      set_condition(object, pod_condition("PodScheduled", "", "", timestamp_locked()));
    }
  }
  if (type.group.empty() && type.plural == "persistentvolumeclaims") {
    default_claim_status(object, options_.bind_persistent_volume_claims);
  }
  if (type.group.empty() && type.plural == "services") {
    default_service_spec(object, random_);
  }
}

json Store::store_created_locked(const ResourceType& type, const Key& key, json object) {
  json& meta = object["metadata"];
  meta["resourceVersion"] = std::to_string(next_resource_version_locked());
  by_uid_[meta["uid"].get<std::string>()] = {type.id(), key};
  json& stored = objects_of(type)[key];
  stored = std::move(object);
  commit_locked(type, EventType::kAdded, stored, nullptr);
  return stored;
}

json Store::put(const ResourceType& type, const std::string& ns, json object) {
  MutexLock lock(mu_);
  if (!object.is_object() || string_field(metadata_of(object), "name").empty()) {
    throw StatusError(400, "BadRequest", "put: the object needs metadata.name");
  }
  json& meta = object["metadata"];
  if (type.namespaced) meta["namespace"] = ns;
  if (string_field(meta, "uid").empty()) meta["uid"] = new_uid_locked();
  if (string_field(meta, "creationTimestamp").empty())
    meta["creationTimestamp"] = timestamp_locked();
  object["kind"] = type.kind;
  object["apiVersion"] = type.api_version();
  meta["resourceVersion"] = std::to_string(next_resource_version_locked());
  const Key key(type.namespaced ? ns : "", string_field(meta, "name"));
  auto& objects = objects_of(type);
  auto it = objects.find(key);
  const std::optional<json> previous =
      it == objects.end() ? std::nullopt : std::optional<json>(it->second);
  if (previous) by_uid_.erase(string_field(metadata_of(*previous), "uid"));
  by_uid_[string_field(meta, "uid")] = {type.id(), key};
  json& stored = objects[key];
  stored = std::move(object);
  commit_locked(type, previous ? EventType::kModified : EventType::kAdded, stored,
                previous ? &*previous : nullptr);
  return stored;
}

json Store::update(const ResourceType& type, const std::string& ns, const std::string& name,
                   json object, bool status_subresource) {
  MutexLock lock(mu_);
  if (!object.is_object()) {
    throw StatusError(400, "BadRequest", "the body of the request is not a JSON object");
  }
  json* existing = find_locked(type, ns, name);
  if (existing == nullptr) throw not_found(type, name);
  const json& meta = metadata_of(object);
  std::string body_name = string_field(meta, "name");
  if (body_name != name) {
    throw StatusError(400, "BadRequest",
                      "the name of the object (" + body_name +
                          ") does not match the name on the URL (" + name + ")");
  }
  std::string rv = string_field(meta, "resourceVersion");
  if (rv.empty() && type.custom) {
    throw invalid(type, name, "metadata.resourceVersion",
                  "Invalid value: 0x0: must be specified for an update");
  }
  if (!rv.empty() && rv != string_field(metadata_of(*existing), "resourceVersion")) {
    throw conflict(type, name,
                   "the object has been modified; please apply your changes to the latest "
                   "version and try again");
  }
  const std::string body_uid = string_field(meta, "uid");
  const std::string stored_uid = string_field(metadata_of(*existing), "uid");
  if (!body_uid.empty() && body_uid != stored_uid) {
    // An update's uid is a precondition (409), a patch's an immutable field (422).
    throw conflict(type, name,
                   "Precondition failed: UID in precondition: " + body_uid +
                       ", UID in object meta: " + stored_uid);
  }
  return update_locked(type, ns, name, *existing, std::move(object), status_subresource);
}

json Store::update_locked(const ResourceType& type, const std::string& ns, const std::string& name,
                          const json& existing_ref, json candidate, bool status_only) {
  const json existing = existing_ref;  // a copy: the stored slot is rewritten below
  json next;
  if (status_only) {
    next = existing;
    if (candidate.contains("status")) {
      next["status"] = candidate["status"];
    } else {
      next.erase("status");
    }
  } else {
    next = std::move(candidate);
    if (type.status_subresource) {
      if (existing.contains("status")) {
        next["status"] = existing["status"];
      } else {
        next.erase("status");
      }
    }
    json& meta = next["metadata"];
    if (!meta.is_object()) meta = json::object();
    const json& old_meta = metadata_of(existing);
    for (const char* k :
         {"uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
          "generation", "name", "namespace", "selfLink"}) {
      if (old_meta.contains(k)) {
        meta[k] = old_meta[k];
      } else {
        meta.erase(k);
      }
    }
    if (old_meta.contains("deletionTimestamp") && meta.contains("finalizers")) {
      // Finalizers can only be removed from an object that is being deleted.
      json kept = json::array();
      json old_finalizers = old_meta.value("finalizers", json::array());
      for (const json& f : meta["finalizers"]) {
        if (std::find(old_finalizers.begin(), old_finalizers.end(), f) != old_finalizers.end()) {
          kept.push_back(f);
        }
      }
      meta["finalizers"] = kept;
    }
    if (meta.contains("finalizers") && meta["finalizers"].empty()) meta.erase("finalizers");
  }
  next["kind"] = type.kind;
  next["apiVersion"] = type.api_version();
  next["metadata"]["resourceVersion"] = metadata_of(existing)["resourceVersion"];
  if (next == existing) return existing;  // a no-op write changes nothing, not even the version
  if (!status_only && type.group.empty()) {
    std::string forbidden;
    if (type.plural == "pods") forbidden = forbidden_pod_spec_change(existing, next);
    if (type.plural == "persistentvolumeclaims") {
      forbidden = forbidden_claim_spec_change(existing, next);
    }
    if (!forbidden.empty()) throw invalid(type, name, "spec", forbidden);
  }
  if (!status_only && spec_changed(type, existing, next)) {
    next["metadata"]["generation"] = metadata_of(existing).value("generation", 0) + 1;
  }
  next["metadata"]["resourceVersion"] = std::to_string(next_resource_version_locked());
  Key key(type.namespaced ? ns : "", name);
  if (deletion_complete(next)) return remove_now_locked(type, key, next, existing);
  json& stored = objects_of(type)[key];
  stored = std::move(next);
  commit_locked(type, EventType::kModified, stored, &existing);
  return stored;
}

json Store::patch(const ResourceType& type, const std::string& ns, const std::string& name,
                  const json& patch, PatchType patch_type, bool status_subresource) {
  MutexLock lock(mu_);
  json* existing = find_locked(type, ns, name);
  if (existing == nullptr) throw not_found(type, name);
  json candidate = *existing;
  switch (patch_type) {
    case PatchType::kStrategicMerge:
      if (type.custom) {
        throw StatusError(415, "UnsupportedMediaType",
                          "the body of the request was in an unknown format - accepted media "
                          "types include: application/json-patch+json, "
                          "application/merge-patch+json, application/apply-patch+yaml");
      }
      [[fallthrough]];
    case PatchType::kMerge:
      if (!patch.is_object()) {
        throw StatusError(400, "BadRequest", "a merge patch must be a JSON object");
      }
      candidate.merge_patch(patch);
      break;
    case PatchType::kJson:
      if (!patch.is_array()) {
        throw StatusError(400, "BadRequest", "a JSON patch must be a JSON array of operations");
      }
      try {
        candidate = candidate.patch(patch);
      } catch (const json::exception& e) {
        throw StatusError(422, "Invalid",
                          "the server rejected our request due to an error in our request: " +
                              std::string(e.what()));
      }
      break;
  }
  if (!candidate.is_object()) {
    throw StatusError(422, "Invalid", "the patched " + type.kind + " is not a JSON object");
  }
  std::string rv = string_field(metadata_of(candidate), "resourceVersion");
  if (!rv.empty() && rv != string_field(metadata_of(*existing), "resourceVersion")) {
    throw conflict(type, name,
                   "the object has been modified; please apply your changes to the latest "
                   "version and try again");
  }
  if (string_field(metadata_of(candidate), "name") != name) {
    throw invalid(type, name, "metadata.name", "Invalid value: field is immutable");
  }
  check_uid_unchanged(type, name, *existing, candidate);
  return update_locked(type, ns, name, *existing, std::move(candidate), status_subresource);
}

json Store::remove(const ResourceType& type, const std::string& ns, const std::string& name,
                   const DeleteOptions& options) {
  MutexLock lock(mu_);
  return remove_locked(type, ns, name, options);
}

json Store::remove_locked(const ResourceType& type, const std::string& ns, const std::string& name,
                          const DeleteOptions& options) {
  json* found = find_locked(type, ns, name);
  if (found == nullptr) throw not_found(type, name);
  const json existing = *found;
  const json& meta = metadata_of(existing);
  if (options.precondition_uid && *options.precondition_uid != string_field(meta, "uid")) {
    throw conflict(type, name,
                   "Precondition failed: UID in precondition: " + *options.precondition_uid +
                       ", UID in object meta: " + string_field(meta, "uid"));
  }
  if (options.precondition_resource_version &&
      *options.precondition_resource_version != string_field(meta, "resourceVersion")) {
    throw conflict(
        type, name,
        "Precondition failed: ResourceVersion in precondition: " +
            *options.precondition_resource_version +
            ", ResourceVersion in object meta: " + string_field(meta, "resourceVersion"));
  }
  const std::string& policy = options.propagation_policy;
  if (!policy.empty() && policy != "Background" && policy != "Foreground" && policy != "Orphan") {
    throw StatusError(422, "Invalid",
                      "DeleteOptions.propagationPolicy: Unsupported value: \"" + policy +
                          "\": supported values: \"Foreground\", \"Background\", \"Orphan\"");
  }
  if (options.grace_period_seconds && *options.grace_period_seconds < 0) {
    throw StatusError(422, "Invalid", "DeleteOptions.gracePeriodSeconds: must be >= 0");
  }

  // Pods get a grace period: the requested one, else spec.terminationGracePeriodSeconds; none
  // when the pod was never scheduled or has already terminated.
  int64_t grace = 0;
  if (is_pods(type)) {
    const json& spec = existing.contains("spec") ? existing["spec"] : json::object();
    grace = options.grace_period_seconds ? *options.grace_period_seconds
                                         : spec.value("terminationGracePeriodSeconds", 30);
    std::string phase = existing.contains("status") ? existing["status"].value("phase", "") : "";
    if (string_field(spec, "nodeName").empty() || phase == "Succeeded" || phase == "Failed") {
      grace = 0;
    }
  }

  Key key(type.namespaced ? ns : "", name);
  if (meta.contains("deletionTimestamp")) {
    // Already terminating: a shorter grace period (0 = the kubelet is done) moves it forward.
    // With no deletionGracePeriodSeconds recorded, any explicit grace period shortens it.
    const bool shortens = meta.contains("deletionGracePeriodSeconds")
                              ? grace < meta.value("deletionGracePeriodSeconds", int64_t{0})
                              : options.grace_period_seconds.has_value();
    if (!is_pods(type) || !shortens) return existing;
    json next = existing;
    next["metadata"]["deletionGracePeriodSeconds"] = grace;
    next["metadata"]["deletionTimestamp"] = timestamp_locked(std::chrono::seconds(grace));
    next["metadata"]["resourceVersion"] = std::to_string(next_resource_version_locked());
    if (deletion_complete(next)) return remove_now_locked(type, key, next, existing);
    json& stored = objects_of(type)[key];
    stored = next;
    commit_locked(type, EventType::kModified, stored, &existing);
    return stored;
  }

  const std::string uid = string_field(meta, "uid");
  if (policy == "Orphan") orphan_dependents_locked(uid);
  bool foreground = policy == "Foreground" && !dependents_locked(uid).empty();
  if (grace > 0 || has_finalizers(existing) || foreground) {
    json next = existing;
    json& m = next["metadata"];
    if (foreground) {
      if (!m.contains("finalizers")) m["finalizers"] = json::array();
      m["finalizers"].push_back("foregroundDeletion");
    }
    m["deletionTimestamp"] = timestamp_locked(std::chrono::seconds(grace));
    m["deletionGracePeriodSeconds"] = grace;
    m["resourceVersion"] = std::to_string(next_resource_version_locked());
    json& stored = objects_of(type)[key];
    stored = next;
    commit_locked(type, EventType::kModified, stored, &existing);
    json result = stored;
    if (foreground) {
      for (const auto& [dep_type, dep_key] : dependents_locked(uid)) {
        if (find_locked(dep_type, dep_key.first, dep_key.second) != nullptr) {
          remove_locked(dep_type, dep_key.first, dep_key.second, DeleteOptions{});
        }
      }
      if (json* again = find_locked(type, ns, name)) result = *again;
    }
    return result;
  }
  json next = existing;
  next["metadata"]["resourceVersion"] = std::to_string(next_resource_version_locked());
  return remove_now_locked(type, key, next, existing);
}

json Store::remove_now_locked(const ResourceType& type, const Key& key, json object,
                              const json& previous) {
  objects_of(type).erase(key);
  by_uid_.erase(string_field(metadata_of(object), "uid"));
  commit_locked(type, EventType::kDeleted, object, &previous);
  collect_garbage_locked(object);
  return object;
}

std::vector<std::tuple<ResourceType, Store::Key>> Store::dependents_locked(
    const std::string& owner_uid) {
  std::vector<std::tuple<ResourceType, Key>> out;
  if (owner_uid.empty()) return out;
  for (auto& [type_id, objects] : objects_) {
    for (auto& [key, object] : objects) {
      const json& meta = metadata_of(object);
      auto refs = meta.find("ownerReferences");
      if (refs == meta.end() || !refs->is_array()) continue;
      for (const json& ref : *refs) {
        if (!ref.is_object()) continue;
        auto uid = ref.find("uid");
        if (uid != ref.end() && uid->is_string() &&
            uid->get_ref<const std::string&>() == owner_uid) {
          out.emplace_back(types_.at(type_id), key);
          break;
        }
      }
    }
  }
  return out;
}

void Store::strip_owner_locked(const ResourceType& type, const Key& key,
                               const std::string& owner_uid) {
  json* dependent = find_locked(type, key.first, key.second);
  if (dependent == nullptr) return;
  json next = *dependent;
  json refs = json::array();
  for (const json& ref : next["metadata"]["ownerReferences"]) {
    if (ref.value("uid", "") != owner_uid) refs.push_back(ref);
  }
  if (refs.empty()) {
    next["metadata"].erase("ownerReferences");
  } else {
    next["metadata"]["ownerReferences"] = refs;
  }
  update_locked(type, key.first, key.second, *dependent, next, false);
}

void Store::orphan_dependents_locked(const std::string& owner_uid) {
  for (const auto& [type, key] : dependents_locked(owner_uid)) {
    strip_owner_locked(type, key, owner_uid);
  }
}

void Store::collect_garbage_locked(const json& removed) {
  const json& meta = metadata_of(removed);
  const std::string uid = string_field(meta, "uid");
  // Dependents of the removed object: deleted in the background, unless another owner that
  // still exists holds them (then only the dangling reference goes).
  for (const auto& [type, key] : dependents_locked(uid)) {
    json* dependent = find_locked(type, key.first, key.second);
    if (dependent == nullptr) continue;
    bool other_owner = false;
    for (const json& ref : metadata_of(*dependent)["ownerReferences"]) {
      std::string ref_uid = ref.value("uid", "");
      if (ref_uid != uid && by_uid_.count(ref_uid) != 0) other_owner = true;
    }
    if (other_owner) {
      strip_owner_locked(type, key, uid);
      continue;
    }
    remove_locked(type, key.first, key.second, DeleteOptions{});
  }
  // Owners waiting in foreground deletion for this object: done when no dependents remain.
  auto refs = meta.find("ownerReferences");
  if (refs == meta.end() || !refs->is_array()) return;
  for (const json& ref : *refs) {
    auto owner_it = by_uid_.find(ref.value("uid", ""));
    if (owner_it == by_uid_.end()) continue;
    auto [owner_type_id, owner_key] = owner_it->second;
    const ResourceType owner_type = types_.at(owner_type_id);
    json* owner = find_locked(owner_type, owner_key.first, owner_key.second);
    if (owner == nullptr || !metadata_of(*owner).contains("finalizers")) continue;
    json finalizers = metadata_of(*owner)["finalizers"];
    auto f = std::find(finalizers.begin(), finalizers.end(), "foregroundDeletion");
    if (f == finalizers.end() || !dependents_locked(ref.value("uid", "")).empty()) continue;
    finalizers.erase(f);
    json next = *owner;
    next["metadata"]["finalizers"] = finalizers;
    update_locked(owner_type, owner_key.first, owner_key.second, *owner, next, false);
  }
}

void Store::bind_pod(const std::string& ns, const std::string& name, const std::string& node) {
  MutexLock lock(mu_);
  ResourceType pods = types_.at("pods");
  json* pod = find_locked(pods, ns, name);
  if (pod == nullptr) throw not_found(pods, name);
  std::string current = string_field((*pod)["spec"], "nodeName");
  if (!current.empty()) {
    throw conflict(pods, name, "pod " + name + " is already assigned to node \"" + current + "\"");
  }
  json next = *pod;
  next["spec"]["nodeName"] = node;
  set_condition(next, pod_condition("PodScheduled", "", "", timestamp_locked()));
  const json existing = *pod;
  if (spec_changed(pods, existing, next)) {
    next["metadata"]["generation"] = metadata_of(existing).value("generation", 0) + 1;
  }
  next["metadata"]["resourceVersion"] = std::to_string(next_resource_version_locked());
  json& stored = objects_of(pods)[Key(ns, name)];
  stored = next;
  commit_locked(pods, EventType::kModified, stored, &existing);
}

void Store::evict_pod(const std::string& ns, const std::string& name,
                      const DeleteOptions& options) {
  MutexLock lock(mu_);
  ResourceType pods = types_.at("pods");
  json* pod = find_locked(pods, ns, name);
  if (pod == nullptr) throw not_found(pods, name);
  if (!metadata_of(*pod).contains("deletionTimestamp")) {
    json next = *pod;
    set_condition(next, pod_condition("DisruptionTarget", "EvictionByEvictionAPI",
                                      "Eviction API: evicting", timestamp_locked()));
    update_locked(pods, ns, name, *pod, next, true);
  }
  remove_locked(pods, ns, name, options);
}

uint64_t Store::resource_version() const {
  MutexLock lock(mu_);
  return resource_version_;
}

void Store::expire_history() {
  MutexLock lock(mu_);
  // A version nothing has seen yet becomes the oldest one can watch from, so that a relist
  // (which returns it) can watch again.
  oldest_watchable_ = next_resource_version_locked();
  history_.clear();
  notifier_.bump();
}

std::shared_ptr<Watcher> Store::watch(const ResourceType& type, const std::string& ns,
                                      LabelSelector labels, FieldSelector fields,
                                      const std::string& resource_version,
                                      bool send_initial_events) {
  MutexLock lock(mu_);
  auto watcher = std::make_shared<Watcher>(type, ns, std::move(labels), std::move(fields),
                                           options_.max_watch_queue);
  if (resource_version.empty() || resource_version == "0" || send_initial_events) {
    for (const auto& [key, object] : objects_of(type)) {
      Event event{
          resource_version_,     type.id(), EventType::kAdded,
          selector_view(object), json(),    std::make_shared<const std::string>(object.dump())};
      deliver_locked(*watcher, event);
    }
    if (send_initial_events) bookmark_locked(*watcher, true);
  } else {
    uint64_t rv = parse_resource_version(resource_version);
    if (rv < oldest_watchable_) {
      throw StatusError(410, "Expired",
                        "too old resource version: " + resource_version + " (" +
                            std::to_string(oldest_watchable_) + ")");
    }
    for (const Event& event : history_) {
      if (event.resource_version > rv && event.type_id == type.id()) {
        deliver_locked(*watcher, event);
      }
    }
  }
  watchers_.push_back(watcher);
  notifier_.bump();
  return watcher;
}

void Store::unwatch(const std::shared_ptr<Watcher>& watcher) {
  MutexLock lock(mu_);
  watchers_.erase(std::remove(watchers_.begin(), watchers_.end(), watcher), watchers_.end());
  notifier_.bump();
}

void Store::bookmark(Watcher& watcher) {
  MutexLock lock(mu_);
  bookmark_locked(watcher, false);
}

void Store::bookmark_locked(Watcher& watcher, bool initial_events_end) {
  json object = {{"kind", watcher.type().kind},
                 {"apiVersion", watcher.type().api_version()},
                 {"metadata", {{"resourceVersion", std::to_string(resource_version_)}}}};
  if (initial_events_end) {
    object["metadata"]["annotations"] = {{"k8s.io/initial-events-end", "true"}};
  }
  watcher.push("{\"type\":\"BOOKMARK\",\"object\":" + object.dump() + "}\n");
}

void Store::drop_watches(DropMode mode) {
  MutexLock lock(mu_);
  for (const auto& watcher : watchers_) watcher->request_drop(mode);
}

size_t Store::watch_count() const {
  MutexLock lock(mu_);
  return watchers_.size();
}

}  // namespace longhaul::fakeapi
