// The operator's Kubernetes API client interface. The reconciler, informers and leader election
// talk to the cluster only through this interface; HttpClient (over cpprestsdk, see
// http_client.h) is the real implementation, and nothing outside operator/kube sees cpprestsdk.
//
// Objects are nlohmann::json documents exactly as the API server sends them; typed views (the
// TrainingJob API types) live in operator/api.
//
// Errors: every non-2xx answer becomes an ApiError subclass carrying the HTTP status code,
// the Status reason and message. 429 and 5xx are retried inside the client (honouring
// Retry-After) up to the configured budget before Unavailable is thrown.
//
// Thread-safety: Client implementations are safe for concurrent use from many threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"

namespace longhaul::kube {

using json = nlohmann::json;

// Which collection: core pods are {"", "v1", "pods", true}; TrainingJobs are
// {"longhaul.dev", "v1alpha1", "trainingjobs", true}.
struct Resource {
  std::string group;    // "" for the core API
  std::string version;  // "v1"
  std::string plural;   // "pods"
  bool namespaced = true;
  std::string kind;  // "Pod": used for Events and error messages

  // "/api/v1" or "/apis/<group>/<version>"
  std::string api_prefix() const;
  // Collection path: <prefix>/namespaces/<ns>/<plural> (or <prefix>/<plural> across namespaces
  // when ns is empty or the resource is cluster-scoped).
  std::string collection_path(std::string_view ns) const;
  std::string object_path(std::string_view ns, std::string_view name) const;
};

namespace resources {
extern const Resource kPods;
extern const Resource kServices;
extern const Resource kPersistentVolumeClaims;
extern const Resource kEvents;
extern const Resource kNodes;         // cluster-scoped
extern const Resource kLeases;        // coordination.k8s.io/v1
extern const Resource kTrainingJobs;  // longhaul.dev/v1alpha1
}  // namespace resources

// An HTTP-level failure from the API server, translated to the project's error kinds:
// 404 -> NotFoundError (code kNotFound, but not a longhaul::NotFound: catch ApiError or test
// code()), 409 -> ConflictError / AlreadyExistsError,
// 410 -> GoneError, 422/400 -> InvalidError, 429/5xx after retries -> Unavailable.
//
// what() is "<call>: <server message> (HTTP <code> <reason>)[: <hint>]"; status_message() is the
// API server's own Status.message, and causes() its Status.details.causes (field errors of a
// 422: {"field": "spec.containers[0].name", "reason": "FieldValueInvalid", "message": ...}).
class ApiError : public Error {
 public:
  ApiError(Code code, int http_status, std::string reason, const std::string& message)
      : Error(code, message), http_status_(http_status), reason_(std::move(reason)) {}
  int http_status() const { return http_status_; }
  const std::string& reason() const { return reason_; }  // Status.reason, e.g. "Conflict"
  const std::string& status_message() const { return status_message_; }
  const json& causes() const { return causes_; }  // an array (empty when the server gave none)
  void set_status(std::string message, json causes) {
    status_message_ = std::move(message);
    causes_ = std::move(causes);
  }

 private:
  int http_status_;
  std::string reason_;
  std::string status_message_;
  json causes_ = json::array();
};
struct NotFoundError : ApiError {
  NotFoundError(const std::string& m) : ApiError(Code::kNotFound, 404, "NotFound", m) {}
};
struct AlreadyExistsError : ApiError {
  AlreadyExistsError(const std::string& m)
      : ApiError(Code::kAlreadyExists, 409, "AlreadyExists", m) {}
};
struct ConflictError : ApiError {  // stale resourceVersion or failed precondition
  ConflictError(const std::string& m) : ApiError(Code::kAborted, 409, "Conflict", m) {}
};
struct GoneError : ApiError {  // watch/list resourceVersion too old: relist
  GoneError(const std::string& m) : ApiError(Code::kOutOfRange, 410, "Expired", m) {}
};
struct InvalidError : ApiError {
  InvalidError(int status, const std::string& m)
      : ApiError(Code::kInvalidArgument, status, "Invalid", m) {}
};

struct ListOptions {
  std::string label_selector;  // "a=b,c!=d,e in (f,g)"
  std::string field_selector;
  std::string resource_version;        // list/watch from this version ("" = most recent)
  std::optional<int> timeout_seconds;  // watch: server closes the stream after this long
  bool allow_watch_bookmarks = true;
  std::optional<int> limit;  // list page size; the client follows "continue" itself
};

enum class PatchType {
  kMerge,           // application/merge-patch+json
  kStrategicMerge,  // application/strategic-merge-patch+json (core types only)
  kJson,            // application/json-patch+json
};

struct DeleteOptions {
  std::optional<int64_t> grace_period_seconds;  // 0 with force: remove immediately
  std::optional<std::string> precondition_uid;
  std::optional<std::string> precondition_resource_version;
  std::string propagation_policy;  // "", "Background", "Foreground", "Orphan"
};

// One event of a watch stream.
struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark, kError };
  Type type;
  json object;  // for kError: the Status object (code 410 means the version is gone)
};

// An open watch. next() blocks until an event arrives, the stream ends (returns nullopt: the
// server closed it or timeoutSeconds elapsed; the caller re-watches from the last
// resourceVersion), or stop() is called from another thread (returns nullopt promptly).
// Implementations may open the stream lazily, so errors opening it (GoneError for an expired
// resourceVersion, other ApiErrors, Unavailable) may come from watch() or from the first next();
// next() also throws Unavailable when an open stream breaks. Callers handle both places.
class WatchStream {
 public:
  virtual ~WatchStream() = default;
  virtual std::optional<WatchEvent> next() = 0;
  virtual void stop() = 0;
};

class Client {
 public:
  virtual ~Client() = default;

  virtual json get(const Resource& r, std::string_view ns, std::string_view name) = 0;
  // Returns the List object ("items", "metadata.resourceVersion"), all pages joined.
  virtual json list(const Resource& r, std::string_view ns, const ListOptions& opts) = 0;
  virtual json create(const Resource& r, std::string_view ns, const json& object) = 0;
  // PUT; metadata.resourceVersion in `object` is the optimistic-concurrency precondition.
  virtual json update(const Resource& r, std::string_view ns, const json& object) = 0;
  // PUT to the status subresource.
  virtual json update_status(const Resource& r, std::string_view ns, const json& object) = 0;
  virtual json patch(const Resource& r, std::string_view ns, std::string_view name,
                     const json& patch, PatchType type, bool status_subresource = false) = 0;
  virtual void remove(const Resource& r, std::string_view ns, std::string_view name,
                      const DeleteOptions& opts = {}) = 0;
  virtual std::unique_ptr<WatchStream> watch(const Resource& r, std::string_view ns,
                                             const ListOptions& opts) = 0;
};

}  // namespace longhaul::kube
