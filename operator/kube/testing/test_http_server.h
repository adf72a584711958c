// A scriptable HTTP/1.1 server for the Kubernetes client's tests (test-only), over the project's
// server (base/http_connection.h). It listens on 127.0.0.1:<ephemeral>, runs `handler` for each
// request on the connection's own thread, keeps connections alive, and records every request.
// Handlers may answer at once (send), stream a chunked body line by line
// (start_stream/write_chunk/end_stream) or drop the connection.
//
// Thread-safety: the server's methods are safe from any thread; a ResponseWriter belongs to the
// handler call it was given to. stop() (also run by the destructor) closes every connection and
// joins every thread; streaming handlers must return once server_stopping() or client_gone().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "longhaul/base/http_connection.h"
#include "longhaul/base/mutex.h"

namespace longhaul::kube::testing {

struct Request {
  std::string method;
  std::string target;  // raw, e.g. "/api/v1/pods?labelSelector=a%3Db"
  std::string path;    // target before '?'
  std::string query;   // raw query after '?'
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  std::string header(const std::string& name) const;  // "" when absent (case-insensitive)
  std::map<std::string, std::string> params() const;  // decoded query parameters
};

class TestHttpServer;

class ResponseWriter {
 public:
  void send(int status, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers = {},
            const std::string& content_type = "application/json");
  // Chunked streaming. Each write_chunk is flushed at once; returns false when the client left.
  bool start_stream(int status, const std::string& content_type = "application/json");
  bool write_chunk(const std::string& data);
  void end_stream();
  // Closes the connection without finishing the response (a dropped watch).
  void drop();
  bool client_gone() const;
  bool server_stopping() const;

 private:
  friend class TestHttpServer;
  ResponseWriter(http::Connection& connection, const TestHttpServer* server)
      : connection_(connection), server_(server) {}
  http::Connection& connection_;
  const TestHttpServer* server_;
  bool answered_ = false;
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;

class TestHttpServer {
 public:
  explicit TestHttpServer(Handler handler);
  ~TestHttpServer();
  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  int port() const;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  void stop();
  bool stopping() const { return stopping_.load(); }

  std::vector<Request> requests() const;
  // Waits until at least `n` requests arrived; false on timeout.
  bool wait_for_requests(size_t n, std::chrono::milliseconds timeout) const;

 private:
  void serve(const http::Request& raw, http::Connection& connection);

  Handler handler_;
  std::atomic<bool> stopping_{false};
  mutable longhaul::Mutex mu_;
  mutable longhaul::CondVar cv_;
  std::vector<Request> requests_ GUARDED_BY(mu_);
  http::ConnectionServer server_;  // last: destroyed first (stop() has joined it by then)
};

// Lines for a streaming handler, pushed by the test: pop() waits for the next line and returns
// nullopt when the channel is closed, the client left or the server stops.
class LineChannel {
 public:
  void push(std::string line);
  void close();
  std::optional<std::string> pop(const ResponseWriter& writer);

 private:
  longhaul::Mutex mu_;
  longhaul::CondVar cv_;
  std::deque<std::string> lines_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

// Waits (polling every millisecond) until `condition` holds; false after `timeout`.
bool wait_until(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

}  // namespace longhaul::kube::testing
