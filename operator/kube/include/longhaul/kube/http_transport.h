// The project's own small HTTP interface. HttpClient speaks Kubernetes over it; the production
// implementation is CpprestTransport (cpprest_transport.h), and tests may plug in anything that
// speaks HTTP. Keeping cpprestsdk behind this seam lets it be swapped without touching callers.
//
// Thread-safety: HttpTransport::request/stream are safe to call concurrently. An HttpStream is
// read by one thread; cancel() may be called from any thread at any time.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace longhaul::kube {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// Case-insensitive header lookup; nullopt when absent.
std::optional<std::string> find_header(const HttpHeaders& headers, std::string_view name);

struct HttpRequest {
  std::string method;  // "GET", "POST", "PUT", "PATCH", "DELETE"
  std::string target;  // path plus already-encoded query: "/api/v1/pods?labelSelector=a%3Db"
  HttpHeaders headers;
  std::string body;  // sent only when non-empty
  // request(): a stop requested on this token aborts the request in flight (Cancelled).
  std::stop_token stop;
};

struct HttpResponse {
  int status = 0;
  HttpHeaders headers;
  std::string body;
};

// A response whose body is read as it arrives (watch streams). The request may still be in
// flight when the stream is handed out: status() and headers() wait for the response headers.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // Wait for the headers. Throw Unavailable on network failure, Cancelled after cancel().
  virtual int status() const = 0;
  virtual const HttpHeaders& headers() const = 0;
  // The next line of the body without its line terminator. nullopt when the body ended or after
  // cancel(). Throws Unavailable when the connection fails or stays idle past the idle timeout.
  virtual std::optional<std::string> read_line() = 0;
  // Aborts the request and the stream, whether or not the headers have arrived: a status() or
  // read_line() blocked in another thread returns (Cancelled / nullopt) promptly.
  virtual void cancel() = 0;
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // Sends one request and returns whatever status the server answered. Throws Unavailable on
  // network failures (refused, reset, TLS failure, no answer within the transport's timeout),
  // Cancelled when request.stop is requested before the answer arrived.
  virtual HttpResponse request(const HttpRequest& request) = 0;
  // Starts a request and returns without waiting for the answer (see HttpStream::status()).
  // `idle_timeout` bounds the silence between two pieces of the answer.
  virtual std::unique_ptr<HttpStream> stream(const HttpRequest& request,
                                             std::chrono::seconds idle_timeout) = 0;
};

}  // namespace longhaul::kube
