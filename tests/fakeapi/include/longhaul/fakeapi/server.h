// A fake Kubernetes API server for tests and local demos: a real HTTP/1.1 server (plain HTTP on
// 127.0.0.1 by default, optional TLS with a self-signed CA) backed by an in-memory object store
// with the API conventions the operator and the local kubelet rely on:
//   - resourceVersion (one global counter), generation (bumped on spec changes only), uid,
//     creationTimestamp, generateName, status subresource isolation, 409 on stale writes;
//   - get / list (label and field selectors, limit + continue) / create / update / patch
//     (merge, JSON patch, strategic merge for built-in types) / delete (preconditions,
//     gracePeriodSeconds, propagationPolicy) / deletecollection, pods/binding, pods/eviction;
//   - pod graceful deletion (deletionTimestamp kept until a kubelet finalizes it), finalizers,
//     ownerReference garbage collection (Background, Foreground, Orphan);
//   - watch streams (chunked JSON lines) with replay from a bounded event history, 410 Expired,
//     bookmarks, timeoutSeconds, selector transitions (an object leaving a selector is DELETED);
//   - errors as metav1.Status objects; optional bearer-token check;
//   - fault injection settable at run time (5xx/429 + Retry-After, latency, dropped watches,
//     expired history), with a seed for the probabilistic ones.
// Tests also use the store directly (no HTTP) through the same code path, so direct writes bump
// resourceVersion and reach watchers exactly as HTTP writes do.
//
// Usage:
//   longhaul::fakeapi::FakeApiServer server;           // port 0: an ephemeral port
//   server.start();
//   server.write_kubeconfig("/tmp/x/kubeconfig");        // for the client under test
//   server.create("pods", "default", pod_json);
//   server.wait_for([&] { return server.count_requests({.verb = "create"}) == 2; }, 5s);
//   server.stop();                                       // also done by the destructor
//
// Resources are named by plural ("pods") or plural.group ("trainingjobs.longhaul.dev",
// "leases.coordination.k8s.io"); register_resource() adds more types.
//
// Errors: direct store calls throw StatusError (a longhaul::Error) carrying the HTTP status and
// the Status reason an HTTP client would have received.
//
// Thread-safety: every public member is safe to call from any thread while the server runs
// (one store mutex; fault settings under their own mutex). start()/stop() must not race each
// other. A write made over HTTP is in requests() by the time get()/try_get()/list() show its
// effect, so "no write since I saw X" can be checked with count_requests().
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"

namespace longhaul::fakeapi {

using json = nlohmann::json;

// One kind of object the server serves.
struct ResourceType {
  std::string group;  // "" for the core API
  std::string version;
  std::string plural;
  std::string singular;
  std::string kind;
  bool namespaced = true;
  // Has a /status subresource: the main PUT/PATCH ignores status, /status ignores everything else,
  // and status/metadata writes do not bump generation.
  bool status_subresource = false;
  // A custom resource (CRD): strategic merge patch is refused (415), PUT requires
  // metadata.resourceVersion, list items carry kind/apiVersion.
  bool custom = false;

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
  // "pods", "trainingjobs.longhaul.dev"
  std::string id() const { return group.empty() ? plural : plural + "." + group; }
};

// The types served by default: core/v1 pods, services, persistentvolumeclaims, events,
// configmaps, secrets, serviceaccounts, endpoints, nodes, namespaces; events.k8s.io/v1 events;
// coordination.k8s.io/v1 leases; longhaul.dev/v1alpha1 trainingjobs.
std::vector<ResourceType> default_resource_types();

// An error answer: the HTTP status, the Status reason ("NotFound", "Conflict", ...) and message.
class StatusError : public Error {
 public:
  StatusError(int http_status, std::string reason, const std::string& message,
              json details = json::object());
  int http_status() const { return http_status_; }
  const std::string& reason() const { return reason_; }
  const json& details() const { return details_; }
  // The metav1.Status object an HTTP client receives.
  json to_status() const;

 private:
  int http_status_;
  std::string reason_;
  json details_;
};

struct TlsOptions {
  bool enabled = false;
  // Where the generated CA and server certificate/key are written (a fresh temp dir when empty).
  std::filesystem::path cert_dir;
};

struct Options {
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: pick a free port; port() tells which
  // When set, every request except /healthz, /livez, /readyz and /version must carry
  // "Authorization: Bearer <token>", else 401 Unauthorized.
  std::string bearer_token;
  TlsOptions tls;
  // Watch events kept for resume; a watch from an older resourceVersion gets 410 Expired.
  size_t event_history_size = 10000;
  // Interval of BOOKMARK events on watches that asked for allowWatchBookmarks.
  std::chrono::milliseconds bookmark_interval{std::chrono::seconds(60)};
  // Watches with no timeoutSeconds close after this long (the real server's request timeout).
  std::chrono::milliseconds default_watch_timeout{std::chrono::minutes(30)};
  // A watch whose client reads too slowly is closed once this many events are queued.
  size_t max_watch_queue = 100000;
  // Acts as the scheduler: pods created without spec.nodeName get this node and a PodScheduled
  // condition. Empty: pods stay unscheduled until a pods/binding POST (or a direct update).
  std::string default_node_name;
  // Acts as the volume binder: new PersistentVolumeClaims get status.phase Bound immediately.
  bool bind_persistent_volume_claims = true;
  // The request log keeps at most this many records (the oldest half is dropped beyond it), so
  // long benchmarks stay bounded; count_requests() counts what is kept.
  size_t request_log_limit = 200000;
  // Test control: the time the server stamps on objects (creationTimestamp, deletionTimestamp,
  // condition transitions). Unset: the system clock. Called under the store lock.
  std::function<std::chrono::system_clock::time_point()> clock;
  uint64_t fault_seed = 1;
  std::vector<ResourceType> resource_types = default_resource_types();
};

// One injected fault. A request matches when its Kubernetes verb (get, list, watch, create,
// update, patch, delete, deletecollection; "" = any) matches and path_regex (ECMAScript,
// searched in the URL path; "" = any) finds a match. A matching request is then faulted with
// `probability` (drawn from the seeded generator) while `times` lasts (-1 = unlimited).
struct FaultRule {
  std::string verb;
  std::string path_regex;
  // The answer: 500 InternalError, 503 ServiceUnavailable, 429 TooManyRequests, 504 Timeout, or
  // any other code. 0: no error, only `latency`.
  int status = 500;
  // Sent as the Retry-After header and Status details.retryAfterSeconds (429/503 usually).
  std::optional<int> retry_after_seconds;
  double probability = 1.0;
  int times = -1;
  // Delay before answering (also before an error answer).
  std::chrono::milliseconds latency{0};
  // The Status reason and message of the answer ("" = a generic one for the status), e.g.
  // 403 "Forbidden" / "pods \"x\" is forbidden: exceeded quota: ..." as a ResourceQuota says.
  std::string reason;
  std::string message;
};

// How drop_watches() ends open streams.
enum class DropMode {
  kAbort,     // close the TCP connection mid-stream (no final chunk): a broken connection
  kGraceful,  // send the final empty chunk: the server ended the watch
};

// One answered HTTP request.
struct RequestRecord {
  std::string method;       // GET, POST, ...
  std::string verb;         // Kubernetes verb: get, list, watch, create, update, patch, delete,
                            // deletecollection; "" for non-resource paths (/version, /healthz)
  std::string path;         // URL path without the query
  std::string query;        // raw query string
  std::string resource;     // type id ("pods", "trainingjobs.longhaul.dev"), "" if none
  std::string subresource;  // "status", "binding", "eviction" or ""
  std::string ns;
  std::string name;
  std::string content_type;
  int status = 0;         // HTTP status sent (200 for a watch that streamed)
  bool injected = false;  // the answer came from a FaultRule
  bool write = false;     // create, update, patch, delete or deletecollection
};

// Which requests count_requests() counts; empty fields and unset optionals match anything.
struct RequestMatch {
  std::string verb;
  std::string resource;  // plural or type id
  std::string subresource;
  std::string ns;
  std::string name;
  std::optional<int> status;
  std::optional<bool> write;
  std::optional<bool> injected;
  std::string method;      // "GET", "POST", ...
  std::string path_regex;  // ECMAScript, searched in the URL path
};

struct DeleteOptions {
  std::optional<int64_t> grace_period_seconds;
  std::optional<std::string> precondition_uid;
  std::optional<std::string> precondition_resource_version;
  std::string propagation_policy;  // "", "Background", "Foreground", "Orphan"
};

enum class PatchType { kMerge, kStrategicMerge, kJson };

class FakeApiServer {
 public:
  explicit FakeApiServer(Options options = {});
  ~FakeApiServer();  // stop()
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // Binds and starts serving. Throws Unavailable when the port cannot be bound (name the
  // address), Internal when TLS material cannot be generated.
  void start();
  // Closes every connection (open watches end at once), joins every thread. Idempotent; the store
  // keeps its contents and start() may be called again (on a new ephemeral port when port 0).
  void stop();
  bool running() const;

  int port() const;
  // "http://127.0.0.1:<port>" or "https://...".
  std::string url() const;
  // PEM file of the CA that signed the server certificate (TLS only, else empty).
  std::filesystem::path ca_file() const;
  // Writes a kubeconfig (cluster, user with the bearer token, context "longhaul-fake" with
  // namespace `ns`) that points clients at this server, with the CA embedded under TLS.
  void write_kubeconfig(const std::filesystem::path& path, std::string_view ns = "default") const;

  // ---- direct store access (no HTTP; same semantics, resourceVersions and watch events) ----
  // `resource` is a plural ("pods") or a type id ("trainingjobs.longhaul.dev").
  json get(std::string_view resource, std::string_view ns, std::string_view name) const;
  std::optional<json> try_get(std::string_view resource, std::string_view ns,
                              std::string_view name) const;
  // Items (each with kind/apiVersion) sorted by namespace/name; ns "" = all namespaces.
  std::vector<json> list(std::string_view resource, std::string_view ns = "",
                         std::string_view label_selector = "",
                         std::string_view field_selector = "") const;
  json create(std::string_view resource, std::string_view ns, const json& object);
  // PUT semantics (status ignored for status-subresource types).
  json update(std::string_view resource, std::string_view ns, const json& object);
  // PUT to /status semantics: only `object["status"]` is taken.
  json update_status(std::string_view resource, std::string_view ns, const json& object);
  json patch(std::string_view resource, std::string_view ns, std::string_view name,
             const json& patch, PatchType type = PatchType::kMerge,
             bool status_subresource = false);
  // Merge-patches `status_patch` into the object's status (what a kubelet does).
  json patch_status(std::string_view resource, std::string_view ns, std::string_view name,
                    const json& status_patch);
  // DELETE semantics; returns the object as the HTTP DELETE would (the removed object, or the
  // object with deletionTimestamp when deletion is pending).
  json remove(std::string_view resource, std::string_view ns, std::string_view name,
              const DeleteOptions& options = {});
  // What a kubelet does once a terminating pod's containers are gone: a delete with grace 0.
  // The pod is removed (unless finalizers remain). Throws StatusError 404 when it is gone.
  void finalize_pod_deletion(std::string_view ns, std::string_view name);
  // The current global resourceVersion.
  uint64_t resource_version() const;
  void register_resource(const ResourceType& type);

  // Blocks until predicate() is true, re-evaluating it after every store change and every
  // answered request (never under the store lock, so it may call get/list/count_requests).
  // Returns false on timeout.
  bool wait_for(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) const;

  // ---- request log ----
  std::vector<RequestRecord> requests() const;
  size_t count_requests(const RequestMatch& match = {}) const;
  void clear_requests();
  // requests() and clear_requests() in one step: no request answered in between is lost.
  std::vector<RequestRecord> take_requests();
  // Requests received and not yet answered (open watch streams included).
  size_t requests_in_flight() const;

  // ---- fault injection ----
  int add_fault(const FaultRule& rule);  // returns an id for remove_fault
  void remove_fault(int id);
  void clear_faults();
  void set_fault_seed(uint64_t seed);
  size_t injected_fault_count() const;
  // Ends every open watch stream now.
  void drop_watches(DropMode mode = DropMode::kAbort);
  // Every watch opened from now on is dropped (kAbort) after `interval`; 0 disables.
  void set_watch_drop_interval(std::chrono::milliseconds interval);
  // Forgets the event history: a watch from any resourceVersion seen so far gets 410 Expired;
  // a fresh list returns a resourceVersion that can be watched from.
  void expire_history();
  size_t open_watch_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longhaul::fakeapi
