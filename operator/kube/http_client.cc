// HttpClient: Kubernetes REST semantics over HttpTransport (see http_client.h).
#include "longhaul/kube/http_client.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "longhaul/base/log.h"
#include "longhaul/base/mutex.h"
#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/kube/stop.h"

#ifndef LONGHAUL_VERSION
#define LONGHAUL_VERSION "0.0.0"
#endif

namespace longhaul::kube {

namespace {

using Clock = std::chrono::steady_clock;

std::string describe(std::string_view verb, const Resource& r, std::string_view ns,
                     std::string_view name) {
  std::string out(verb);
  out += " ";
  out += r.kind.empty() ? r.plural : r.kind;
  out += " ";
  if (!ns.empty() && r.namespaced) {
    out += std::string(ns);
    if (!name.empty()) out += "/";
  }
  out += std::string(name);
  if (ns.empty() && name.empty()) out += "(all namespaces)";
  return out;
}

std::string content_type_of(PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
  }
  return "application/merge-patch+json";
}

json parse_body(const std::string& body, const std::string& what) {
  if (body.empty()) return json::object();
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    throw Internal(what + ": the API server answered a body that is not JSON: " + e.what());
  }
}

std::chrono::milliseconds jittered_backoff(const HttpClientOptions& options, int attempt) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  double base =
      static_cast<double>(options.initial_backoff.count()) * std::pow(2.0, std::min(attempt, 30));
  base = std::min(base, static_cast<double>(options.max_backoff.count()));
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(base * jitter(rng)));
}

std::optional<std::chrono::milliseconds> retry_after(const HttpHeaders& headers) {
  auto value = find_header(headers, "Retry-After");
  if (!value) return std::nullopt;
  try {
    size_t used = 0;
    long seconds = std::stol(*value, &used);
    if (seconds < 0) return std::nullopt;
    return std::chrono::milliseconds(seconds * 1000);
  } catch (const std::exception&) {
    return std::nullopt;  // an HTTP-date: fall back to our own backoff
  }
}

}  // namespace

std::string default_user_agent() { return std::string("longhaul-operator/") + LONGHAUL_VERSION; }

std::string url_encode(std::string_view value) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string list_query(const ListOptions& opts, bool watch, const std::string& continue_token) {
  std::vector<std::pair<std::string, std::string>> params;
  if (!opts.label_selector.empty()) params.emplace_back("labelSelector", opts.label_selector);
  if (!opts.field_selector.empty()) params.emplace_back("fieldSelector", opts.field_selector);
  // The continue token carries the snapshot; the server rejects resourceVersion beside it.
  if (!opts.resource_version.empty() && continue_token.empty()) {
    params.emplace_back("resourceVersion", opts.resource_version);
  }
  if (watch) {
    params.emplace_back("watch", "true");
    if (opts.allow_watch_bookmarks) params.emplace_back("allowWatchBookmarks", "true");
    if (opts.timeout_seconds) {
      params.emplace_back("timeoutSeconds", std::to_string(*opts.timeout_seconds));
    }
  } else {
    if (opts.limit) params.emplace_back("limit", std::to_string(*opts.limit));
    if (!continue_token.empty()) params.emplace_back("continue", continue_token);
  }
  std::string out;
  for (const auto& [key, value] : params) {
    out += out.empty() ? "?" : "&";
    out += key + "=" + url_encode(value);
  }
  return out;
}

namespace {
template <typename E>
[[noreturn]] void throw_with_status(E error, const std::string& message, const json& causes) {
  error.set_status(message, causes);
  throw error;
}
}  // namespace

void throw_api_error(int status, const std::string& body, const std::string& what) {
  std::string reason;
  std::string message;
  json causes = json::array();
  try {
    json parsed = json::parse(body);
    if (parsed.is_object()) {
      reason = parsed.value("reason", "");
      message = parsed.value("message", "");
      if (parsed.contains("details") && parsed["details"].is_object() &&
          parsed["details"].contains("causes") && parsed["details"]["causes"].is_array()) {
        causes = parsed["details"]["causes"];
      }
    }
  } catch (const json::exception&) {
  }
  const std::string server_message = message;
  if (message.empty()) message = body.substr(0, 300);
  if (message.empty()) message = "(no message)";
  std::string text = what + ": " + message + " (HTTP " + std::to_string(status) +
                     (reason.empty() ? "" : " " + reason) + ")";
  switch (status) {
    case 400:
    case 422:
      throw_with_status(InvalidError(status, text), server_message, causes);
    case 401:
      throw_with_status(
          ApiError(Code::kPermissionDenied, status, reason.empty() ? "Unauthorized" : reason,
                   text + ": the credentials were rejected; check the token or client "
                          "certificate"),
          server_message, causes);
    case 403:
      // RBAC denials say "User ... cannot <verb> resource ..."; other 403s (a ResourceQuota
      // "exceeded quota", a namespace being terminated, an admission webhook) are not RBAC's.
      throw_with_status(
          ApiError(Code::kPermissionDenied, status, reason.empty() ? "Forbidden" : reason,
                   message.find(" cannot ") != std::string::npos
                       ? text + ": check the operator's RBAC rules"
                       : text),
          server_message, causes);
    case 404:
      throw_with_status(NotFoundError(text), server_message, causes);
    case 409:
      if (reason == "AlreadyExists")
        throw_with_status(AlreadyExistsError(text), server_message, causes);
      throw_with_status(ConflictError(text), server_message, causes);
    case 410:
      throw_with_status(GoneError(text), server_message, causes);
    default:
      break;
  }
  if (status == 429 || status >= 500) throw Unavailable(text);
  throw_with_status(ApiError(Code::kInternal, status, reason, text), server_message, causes);
}

struct HttpClient::Call {
  std::string verb;  // for the observer
  std::string what;  // for messages
  bool idempotent;   // network failures may be retried
};

HttpClient::HttpClient(const ClusterConfig& config, HttpClientOptions options)
    : HttpClient(std::make_shared<CpprestTransport>(transport_options(config)),
                 std::make_shared<TokenSource>(config.token, config.token_file),
                 std::move(options)) {}

HttpClient::HttpClient(std::shared_ptr<HttpTransport> transport,
                       std::shared_ptr<TokenSource> tokens, HttpClientOptions options)
    : transport_(std::move(transport)),
      tokens_(std::move(tokens)),
      options_(std::move(options)),
      limiter_(options_.qps, options_.burst) {}

HttpClient::~HttpClient() { close(); }

void HttpClient::close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  limiter_.close();
}

bool HttpClient::wait(Clock::duration delay) {
  const std::stop_token& stop = current_stop_token();
  std::stop_callback wake(stop, [this] {
    MutexLock lock(mu_);
    cv_.notify_all();
  });
  MutexLock lock(mu_);
  cv_.wait_for(mu_, delay, [&]() REQUIRES(mu_) { return closed_ || stop.stop_requested(); });
  return !closed_ && !stop.stop_requested();
}

void HttpClient::observe(const std::string& verb, const std::string& code,
                         Clock::time_point start) {
  if (!options_.observer) return;
  try {
    options_.observer(RequestObservation{verb, code, Clock::now() - start});
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "API request observer threw" << kv("error", e.what());
  }
}

void HttpClient::add_common_headers(HttpRequest& request) {
  request.headers.emplace_back("Accept", "application/json");
  request.headers.emplace_back("User-Agent", options_.user_agent);
  if (tokens_) {
    std::string token = tokens_->token();
    if (!token.empty()) request.headers.emplace_back("Authorization", "Bearer " + token);
  }
}

namespace {
// One attempt's answer: a plain response, or an open stream when streaming succeeded.
struct Attempt {
  int status = 0;
  HttpHeaders headers;
  std::string body;
  std::unique_ptr<HttpStream> stream;
};
}  // namespace

// The retry loop shared by plain requests and streams. `attempt` performs one HTTP exchange.
template <typename AttemptFn>
static Attempt run_with_retries(
    const HttpClientOptions& options, const std::string& what, bool idempotent,
    TokenBucket& limiter, TokenSource* tokens, AttemptFn&& attempt,
    const std::function<bool(Clock::duration)>& wait,
    const std::function<void(const std::string&, Clock::time_point)>& observe) {
  std::chrono::milliseconds waited{0};
  bool reauthenticated = false;
  std::string last_failure;
  const std::stop_token& stop = current_stop_token();
  for (int retry = 0;; ++retry) {
    throw_if_stop_requested(what);
    if (!limiter.acquire(stop)) {
      throw_if_stop_requested(what);
      throw Cancelled(what + ": the API client is closing");
    }
    std::optional<std::chrono::milliseconds> server_delay;
    const auto start = Clock::now();
    try {
      Attempt answer = attempt();
      observe(std::to_string(answer.status), start);
      if (answer.status == 401 && tokens != nullptr && !reauthenticated) {
        reauthenticated = true;  // a rotated token: re-read it and try once more
        tokens->invalidate();
        --retry;
        continue;
      }
      if (answer.status != 429 && answer.status < 500) return answer;
      server_delay = retry_after(answer.headers);
      std::string reason;
      std::string message = answer.body.substr(0, 300);
      try {
        json status = json::parse(answer.body);
        reason = status.value("reason", "");
        message = status.value("message", message);
      } catch (const json::exception&) {
      }
      last_failure = "HTTP " + std::to_string(answer.status) +
                     (reason.empty() ? "" : " " + reason) + (message.empty() ? "" : ": " + message);
    } catch (const Unavailable& e) {
      observe("<error>", start);
      if (!idempotent) throw Unavailable(what + ": " + e.what());
      last_failure = e.what();
    }
    const std::chrono::milliseconds delay =
        server_delay ? *server_delay : jittered_backoff(options, retry);
    if (retry >= options.max_retries || waited + delay > options.retry_budget) {
      throw Unavailable(what + ": gave up after " + std::to_string(retry + 1) +
                        " attempts (retry budget " + std::to_string(options.retry_budget.count()) +
                        " ms); last answer: " + last_failure +
                        "; the API server is overloaded "
                        "or unreachable, retry later");
    }
    LH_LOG(DEBUG) << "retrying API request" << kv("call", what) << kv("failure", last_failure)
                  << kv("delay_ms", delay.count());
    if (!wait(delay)) {
      throw_if_stop_requested(what);
      throw Cancelled(what + ": the API client is closing");
    }
    waited += delay;
  }
}

HttpResponse HttpClient::send(const Call& call, const HttpRequest& request) {
  Attempt answer = run_with_retries(
      options_, call.what, call.idempotent, limiter_, tokens_.get(),
      [&] {
        HttpRequest req = request;
        add_common_headers(req);
        req.stop = current_stop_token();
        HttpResponse response = transport_->request(req);
        Attempt out;
        out.status = response.status;
        out.headers = std::move(response.headers);
        out.body = std::move(response.body);
        return out;
      },
      [this](Clock::duration d) { return wait(d); },
      [&](const std::string& code, Clock::time_point start) { observe(call.verb, code, start); });
  if (answer.status < 200 || answer.status >= 300) {
    throw_api_error(answer.status, answer.body, call.what);
  }
  return HttpResponse{answer.status, std::move(answer.headers), std::move(answer.body)};
}

json HttpClient::get(const Resource& r, std::string_view ns, std::string_view name) {
  Call call{"get", describe("get", r, ns, name), true};
  HttpResponse response = send(call, HttpRequest{"GET", r.object_path(ns, name), {}, ""});
  return parse_body(response.body, call.what);
}

json HttpClient::list(const Resource& r, std::string_view ns, const ListOptions& opts) {
  Call call{"list", describe("list", r, ns, ""), true};
  json result;
  std::string continue_token;
  ListOptions page_opts = opts;
  for (;;) {
    json page;
    try {
      HttpResponse response = send(
          call,
          HttpRequest{
              "GET", r.collection_path(ns) + list_query(page_opts, false, continue_token), {}, ""});
      page = parse_body(response.body, call.what);
    } catch (const GoneError&) {
      if (continue_token.empty()) throw;
      // The continue token expired between pages: start over with one unpaginated list.
      LH_LOG(INFO) << "list continuation expired; listing again without paging"
                   << kv("call", call.what);
      result = json();
      continue_token.clear();
      page_opts.limit.reset();
      continue;
    }
    if (!page.contains("items") || page["items"].is_null()) page["items"] = json::array();
    // The continue token of this page says whether another page follows.
    continue_token.clear();
    if (page.contains("metadata") && page["metadata"].is_object()) {
      auto& metadata = page["metadata"];
      if (metadata.contains("continue") && metadata["continue"].is_string()) {
        continue_token = metadata["continue"].get<std::string>();
      }
      metadata.erase("continue");
      metadata.erase("remainingItemCount");
    }
    if (result.is_null()) {
      result = std::move(page);
    } else {
      for (auto& item : page["items"]) result["items"].push_back(std::move(item));
      if (page.contains("metadata") && page["metadata"].contains("resourceVersion")) {
        result["metadata"]["resourceVersion"] = page["metadata"]["resourceVersion"];
      }
    }
    if (continue_token.empty()) return result;
  }
}

json HttpClient::write(const Call& call, const std::string& method, const std::string& path,
                       const json& body, const std::string& content_type) {
  HttpRequest request{method, path, {{"Content-Type", content_type}}, body.dump()};
  HttpResponse response = send(call, request);
  return parse_body(response.body, call.what);
}

namespace {
std::string object_name(const json& object, const std::string& what) {
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].contains("name") ||
      !object["metadata"]["name"].is_string()) {
    throw InvalidArgument(what + ": the object has no metadata.name");
  }
  return object["metadata"]["name"].get<std::string>();
}
}  // namespace

json HttpClient::create(const Resource& r, std::string_view ns, const json& object) {
  std::string name = object.contains("metadata") ? object["metadata"].value("name", "") : "";
  Call call{"create", describe("create", r, ns, name), false};
  return write(call, "POST", r.collection_path(ns), object, "application/json");
}

json HttpClient::update(const Resource& r, std::string_view ns, const json& object) {
  std::string name = object_name(object, describe("update", r, ns, ""));
  Call call{"update", describe("update", r, ns, name), true};
  return write(call, "PUT", r.object_path(ns, name), object, "application/json");
}

json HttpClient::update_status(const Resource& r, std::string_view ns, const json& object) {
  std::string name = object_name(object, describe("update status of", r, ns, ""));
  Call call{"update", describe("update status of", r, ns, name), true};
  return write(call, "PUT", r.object_path(ns, name) + "/status", object, "application/json");
}

json HttpClient::patch(const Resource& r, std::string_view ns, std::string_view name,
                       const json& patch, PatchType type, bool status_subresource) {
  Call call{"patch", describe(status_subresource ? "patch status of" : "patch", r, ns, name),
            false};
  std::string path = r.object_path(ns, name) + (status_subresource ? "/status" : "");
  return write(call, "PATCH", path, patch, content_type_of(type));
}

void HttpClient::remove(const Resource& r, std::string_view ns, std::string_view name,
                        const DeleteOptions& opts) {
  Call call{"delete", describe("delete", r, ns, name), true};
  json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (opts.grace_period_seconds) body["gracePeriodSeconds"] = *opts.grace_period_seconds;
  if (opts.precondition_uid || opts.precondition_resource_version) {
    json preconditions = json::object();
    if (opts.precondition_uid) preconditions["uid"] = *opts.precondition_uid;
    if (opts.precondition_resource_version) {
      preconditions["resourceVersion"] = *opts.precondition_resource_version;
    }
    body["preconditions"] = preconditions;
  }
  if (!opts.propagation_policy.empty()) body["propagationPolicy"] = opts.propagation_policy;
  write(call, "DELETE", r.object_path(ns, name), body, "application/json");
}

// A watch whose stream is opened by the first next(), so stop() can abort the open too.
class HttpWatchStream : public WatchStream {
 public:
  HttpWatchStream(HttpClient* client, HttpClient::Call call, HttpRequest request,
                  std::chrono::seconds idle)
      : client_(client), call_(std::move(call)), request_(std::move(request)), idle_(idle) {}

  ~HttpWatchStream() override { stop(); }

  std::optional<WatchEvent> next() override {
    if (!opened_) {
      opened_ = true;
      open();
    }
    if (!stream_) return std::nullopt;  // stopped while opening
    for (;;) {
      std::optional<std::string> line = stream_->read_line();
      if (!line) return std::nullopt;
      if (line->find_first_not_of(" \t\r") == std::string::npos) continue;
      json event;
      try {
        event = json::parse(*line);
      } catch (const json::exception& e) {
        throw Unavailable(call_.what + ": malformed watch event '" + line->substr(0, 200) +
                          "': " + e.what() + " (re-watching)");
      }
      const std::string type = event.value("type", "");
      WatchEvent out;
      if (type == "ADDED") {
        out.type = WatchEvent::Type::kAdded;
      } else if (type == "MODIFIED") {
        out.type = WatchEvent::Type::kModified;
      } else if (type == "DELETED") {
        out.type = WatchEvent::Type::kDeleted;
      } else if (type == "BOOKMARK") {
        out.type = WatchEvent::Type::kBookmark;
      } else if (type == "ERROR") {
        out.type = WatchEvent::Type::kError;
      } else {
        LH_LOG(WARNING) << "skipping watch event of unknown type" << kv("watch", call_.what)
                        << kv("type", type);
        continue;
      }
      if (event.contains("object")) out.object = std::move(event["object"]);
      return out;
    }
  }

  void stop() override {
    {
      MutexLock lock(mu_);
      stopped_ = true;
      if (current_ != nullptr) current_->cancel();
    }
    cv_.notify_all();
  }

 private:
  void publish(HttpStream* stream) {
    MutexLock lock(mu_);
    current_ = stream;
    if (stopped_ && stream != nullptr) stream->cancel();
  }

  // Opens the stream with the client's retries; leaves stream_ null when stopped meanwhile.
  void open() {
    HttpClient& c = *client_;
    try {
      Attempt answer = run_with_retries(
          c.options_, call_.what, call_.idempotent, c.limiter_, c.tokens_.get(),
          [&] {
            HttpRequest req = request_;
            c.add_common_headers(req);
            Attempt out;
            out.stream = c.transport_->stream(req, idle_);
            publish(out.stream.get());
            try {
              out.status = out.stream->status();
              if (out.status < 200 || out.status >= 300) {
                out.headers = out.stream->headers();
                while (auto line = out.stream->read_line()) out.body += *line + "\n";
                publish(nullptr);
                out.stream.reset();
              }
            } catch (...) {
              publish(nullptr);
              throw;
            }
            return out;
          },
          [this](Clock::duration d) {
            MutexLock lock(mu_);
            cv_.wait_for(mu_, d, [this]() REQUIRES(mu_) { return stopped_; });
            return !stopped_;
          },
          [&](const std::string& code, Clock::time_point start) {
            c.observe(call_.verb, code, start);
          });
      if (!answer.stream) throw_api_error(answer.status, answer.body, call_.what);
      stream_ = std::move(answer.stream);
    } catch (const Cancelled&) {
      MutexLock lock(mu_);
      if (!stopped_) throw;  // the client was closed
    }
  }

  HttpClient* const client_;
  const HttpClient::Call call_;
  const HttpRequest request_;
  const std::chrono::seconds idle_;
  bool opened_ = false;                 // reader thread only
  std::unique_ptr<HttpStream> stream_;  // reader thread only; also published as current_
  Mutex mu_;
  CondVar cv_;
  bool stopped_ GUARDED_BY(mu_) = false;
  HttpStream* current_ GUARDED_BY(mu_) = nullptr;  // the request to cancel on stop()
};

std::unique_ptr<WatchStream> HttpClient::watch(const Resource& r, std::string_view ns,
                                               const ListOptions& opts) {
  Call call{"watch", describe("watch", r, ns, ""), true};
  std::chrono::seconds idle = opts.timeout_seconds ? std::chrono::seconds(*opts.timeout_seconds) +
                                                         options_.watch_idle_margin
                                                   : options_.default_watch_idle;
  HttpRequest request{"GET", r.collection_path(ns) + list_query(opts, true, ""), {}, ""};
  return std::make_unique<HttpWatchStream>(this, std::move(call), std::move(request), idle);
}

}  // namespace longhaul::kube
