// HttpClient: the real kube::Client, speaking the Kubernetes REST API over an HttpTransport
// (CpprestTransport in production).
//
// Every request: waits for the client-side token bucket (QPS/burst), sends Accept:
// application/json, the bearer token (re-read when its file rotates; re-read and retried once
// after a 401), and User-Agent longhaul-operator/<version>. 429 and 5xx answers, and network
// failures of idempotent requests, are retried with exponential backoff and full jitter,
// honouring Retry-After (seconds), until max_retries or retry_budget is spent; then Unavailable
// is thrown. Other non-2xx answers become the ApiError subclasses of client.h with the Status
// reason and message. The observer sees every HTTP attempt (verb, code, duration).
//
// Stopping: a stop token bound to the calling thread (stop.h) is checked before each attempt,
// interrupts the waits for the limiter and for retries, and aborts the request in flight; the
// call then throws Cancelled.
//
// Thread-safety: safe for concurrent use from many threads. close() makes waiting calls return
// promptly (with Cancelled) and later calls fail with Cancelled; it does not abort open watches.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/client.h"
#include "longhaul/kube/config.h"
#include "longhaul/kube/http_transport.h"
#include "longhaul/kube/rate_limiter.h"

namespace longhaul::kube {

// "longhaul-operator/<project version>"
std::string default_user_agent();

// One HTTP attempt, for the operator's longhaul_operator_api_requests_total{verb,code}.
struct RequestObservation {
  std::string verb;                        // get, list, watch, create, update, patch, delete
  std::string code;                        // "200", "409", ... or "<error>" for a network failure
  std::chrono::duration<double> duration;  // until the answer's headers (watch) or body
};

struct HttpClientOptions {
  double qps = 20;  // <= 0 disables the limiter
  int burst = 30;
  int max_retries = 8;                             // retries after the first attempt
  std::chrono::milliseconds retry_budget{30000};   // total time spent waiting to retry
  std::chrono::milliseconds initial_backoff{200};  // doubled per retry, full jitter
  std::chrono::milliseconds max_backoff{10000};
  std::chrono::seconds watch_idle_margin{30};    // watch idle timeout = timeoutSeconds + margin
  std::chrono::seconds default_watch_idle{330};  // idle timeout when timeoutSeconds is unset
  std::string user_agent = default_user_agent();
  std::function<void(const RequestObservation&)> observer;  // called on the requesting thread
};

class HttpWatchStream;

class HttpClient : public Client {
 public:
  // Connects with CpprestTransport to `config.server` with its TLS settings and credentials.
  explicit HttpClient(const ClusterConfig& config, HttpClientOptions options = {});
  // Over any transport; `tokens` may be null (no Authorization header).
  HttpClient(std::shared_ptr<HttpTransport> transport, std::shared_ptr<TokenSource> tokens,
             HttpClientOptions options = {});
  ~HttpClient() override;

  json get(const Resource& r, std::string_view ns, std::string_view name) override;
  json list(const Resource& r, std::string_view ns, const ListOptions& opts) override;
  json create(const Resource& r, std::string_view ns, const json& object) override;
  json update(const Resource& r, std::string_view ns, const json& object) override;
  json update_status(const Resource& r, std::string_view ns, const json& object) override;
  json patch(const Resource& r, std::string_view ns, std::string_view name, const json& patch,
             PatchType type, bool status_subresource = false) override;
  void remove(const Resource& r, std::string_view ns, std::string_view name,
              const DeleteOptions& opts = {}) override;
  // Returns at once; the stream is opened by the first next() (with the same retries), so that
  // stop() from another thread also aborts an open in progress. Errors opening it (GoneError
  // for an expired resourceVersion, other ApiErrors, Unavailable) are thrown by that next().
  // The stream must not outlive the client.
  std::unique_ptr<WatchStream> watch(const Resource& r, std::string_view ns,
                                     const ListOptions& opts) override;

  // Wakes calls waiting for the rate limiter or a retry; they throw Cancelled.
  void close();

 private:
  friend class HttpWatchStream;
  struct Call;
  HttpResponse send(const Call& call, const HttpRequest& request);
  void add_common_headers(HttpRequest& request);
  // Sleeps for `delay` unless close() is called; returns false when closed.
  bool wait(std::chrono::steady_clock::duration delay);
  void observe(const std::string& verb, const std::string& code,
               std::chrono::steady_clock::time_point start);
  json write(const Call& call, const std::string& method, const std::string& path, const json& body,
             const std::string& content_type);

  std::shared_ptr<HttpTransport> transport_;
  std::shared_ptr<TokenSource> tokens_;
  HttpClientOptions options_;
  TokenBucket limiter_;
  Mutex mu_;
  CondVar cv_;
  bool closed_ GUARDED_BY(mu_) = false;
};

// Percent-encodes a query parameter value (RFC 3986 unreserved characters kept).
std::string url_encode(std::string_view value);

// Builds the "?a=b&c=d" query of a list or watch.
std::string list_query(const ListOptions& opts, bool watch, const std::string& continue_token);

// Translates a non-2xx answer into the matching ApiError subclass (or Unavailable for 429/5xx)
// and throws it. `what` describes the call ("get Pod default/p-0").
[[noreturn]] void throw_api_error(int status, const std::string& body, const std::string& what);

}  // namespace longhaul::kube
