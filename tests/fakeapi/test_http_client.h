// A tiny blocking HTTP/1.1 client for the fake API server's tests (deliberately independent of
// the operator's client): keep-alive requests with Content-Length bodies, chunked and
// Content-Length responses, and watch streams read line by line with a deadline. Optional TLS
// verifying the server against a CA file.
//
// Thread-safety: one object per thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace longhaul::fakeapi::testing {

using json = nlohmann::json;

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  json json_body() const { return json::parse(body); }
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

class TestHttpClient {
 public:
  // `ca_file` non-empty: connect with TLS and verify the server certificate against it.
  explicit TestHttpClient(int port, std::string token = "", std::filesystem::path ca_file = {});
  ~TestHttpClient();
  TestHttpClient(const TestHttpClient&) = delete;
  TestHttpClient& operator=(const TestHttpClient&) = delete;

  Response request(const std::string& method, const std::string& target,
                   const std::string& body = "",
                   const std::string& content_type = "application/json");
  Response get(const std::string& target) { return request("GET", target); }
  Response post(const std::string& target, const json& body) {
    return request("POST", target, body.dump());
  }
  Response put(const std::string& target, const json& body) {
    return request("PUT", target, body.dump());
  }
  Response patch(const std::string& target, const json& body,
                 const std::string& content_type = "application/merge-patch+json") {
    return request("PATCH", target, body.dump(), content_type);
  }
  Response del(const std::string& target, const json& body = nullptr) {
    return request("DELETE", target, body.is_null() ? "" : body.dump());
  }

  // Starts a watch (GET target); headers are read before it returns. Then next_event() yields
  // each JSON line, or nullopt when the stream ended (ended() tells whether cleanly: final
  // chunk) or the timeout passed (timed_out() is then true).
  Response start_watch(const std::string& target);
  std::optional<json> next_event(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  bool ended_cleanly() const { return ended_cleanly_; }
  bool closed() const { return closed_; }
  bool timed_out() const { return timed_out_; }

  // Whether the TLS handshake verified the server (TLS mode).
  bool connected() const { return fd_ >= 0; }

 private:
  void connect();
  void disconnect();
  bool send_all(const std::string& data);
  // Reads more bytes into in_, waiting until `deadline`; false on EOF/error or timeout.
  bool fill(std::chrono::steady_clock::time_point deadline);
  bool read_line(std::string& line, std::chrono::steady_clock::time_point deadline);
  Response read_head(std::chrono::steady_clock::time_point deadline);

  int port_;
  std::string token_;
  std::filesystem::path ca_file_;
  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  std::string in_;
  // watch state
  bool chunked_ = false;
  std::string stream_;  // de-chunked bytes not yet returned as lines
  bool ended_cleanly_ = false;
  bool closed_ = false;
  bool timed_out_ = false;
};

}  // namespace longhaul::fakeapi::testing
