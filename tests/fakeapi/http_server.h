// A small threaded HTTP/1.1 server on POSIX sockets, with byte-level control for the fake API
// server: keep-alive, Content-Length and chunked request bodies, Expect: 100-continue, plain
// responses with Content-Length, chunked streaming responses (watch), waiting for a wake-up fd
// or the client hanging up while a stream is idle, and aborting a connection mid-stream.
// TLS (optional) runs over memory BIOs so every socket write uses send(MSG_NOSIGNAL).
//
// One thread per connection; the handler runs on it. stop() shuts every socket down (blocked
// reads, writes and waits return at once) and joins every thread.
//
// Thread-safety: start()/stop() from one controlling thread; a Connection is used only by its
// own thread (except the shutdown done by stop()).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace longhaul::fakeapi::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;
  std::string target;                          // as sent: path?query
  std::string path;                            // percent-decoded
  std::string query;                           // raw
  std::map<std::string, std::string> params;   // decoded query parameters (last one wins)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string header(const std::string& lower_name) const;
  bool has_param(const std::string& name) const { return params.count(name) != 0; }
  std::string param(const std::string& name) const;
};

std::string url_decode(std::string_view s, bool plus_is_space);
std::string reason_phrase(int status);

class Connection {
 public:
  Connection(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Completes the TLS handshake (no-op for plain HTTP). False on failure.
  bool handshake();
  // Reads the next request. False when the client closed the connection or sent garbage (a 400
  // is answered then).
  bool read_request(Request& request);

  // Sends a whole response with Content-Length. False when the client is gone.
  bool send_response(int status, const Headers& headers, std::string_view body);
  // Starts a chunked streaming response; write_chunk sends one chunk; end_chunked the final one.
  bool begin_chunked(int status, const Headers& headers);
  bool write_chunk(std::string_view data);
  bool end_chunked();

  enum class WaitResult { kWoken, kTimeout, kClientClosed };
  // While streaming: waits until `wake_fd` is readable, the deadline passes, or the client
  // closes the connection (or stop() shuts it down). Bytes the client sends meanwhile are kept.
  WaitResult wait(int wake_fd, std::chrono::steady_clock::time_point deadline);
  // Closes the TCP connection now (RST-free shutdown, no final chunk).
  void abort();

  bool keep_alive() const { return keep_alive_ && !broken_; }
  void set_close_after_response() { keep_alive_ = false; }
  bool broken() const { return broken_; }

 private:
  enum class ReadStatus { kData, kNoData, kEof };
  ReadStatus read_once();  // one recv (blocking), appended (decrypted) to in_
  ReadStatus drain_tls();  // decrypts what the read BIO holds into in_
  bool fill();             // blocks until more bytes arrive; false on EOF
  bool send_raw(std::string_view data);
  bool send_bytes(std::string_view data);
  bool flush_tls();
  bool read_chunked_body(std::string& body);

  int fd_;
  SSL* ssl_;
  std::string in_;
  bool keep_alive_ = true;
  bool broken_ = false;
};

class Server {
 public:
  using Handler = std::function<void(const Request&, Connection&)>;
  // `tls` may be null (plain HTTP); it must outlive the server.
  Server(Handler handler, SSL_CTX* tls);
  ~Server();
  // Binds address:port (port 0 picks one) and starts accepting. Throws Unavailable.
  void start(const std::string& address, int port);
  void stop();
  int port() const { return port_; }
  bool running() const { return running_; }

 private:
  void accept_loop();
  void serve(uint64_t id, int fd);
  void reap_finished();

  Handler handler_;
  SSL_CTX* tls_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  std::mutex mu_;  // guards the three fields below
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::pair<int, std::thread>> connections_;  // id -> (fd or -1, thread)
  std::vector<uint64_t> finished_;
};

}  // namespace longhaul::fakeapi::http
