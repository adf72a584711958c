// The project's HTTP/1.1 server for whoever needs more than a probe answer: one thread per
// connection, keep-alive, Content-Length and chunked request bodies, Expect: 100-continue,
// responses with Content-Length, chunked streaming responses (a watch), waiting for a wake-up fd
// or the client hanging up while a stream is idle, and aborting a connection mid-stream. The
// bytes go through a Transport: the socket itself, or a cipher over it (the fake API server's
// TLS, tests/fakeapi/tls.h). The fake Kubernetes API server and the Kubernetes client's test
// server (operator/kube/testing) are built on it. Probes and scrapes use http_server.h, an event
// loop with a deadline per connection, which shares this file's request parsing.
//
// stop() shuts every socket down (blocked reads, writes and waits return at once) and joins
// every thread.
//
// Thread-safety: start()/stop() from one controlling thread; a Connection is used only by its
// own thread (except the shutdown done by stop()); stopping() may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace longhaul::http {

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
std::string reason_phrase(int status);  // "Not Found"; "Status 599" for one it does not know

// Sends all of `data` on `fd` (MSG_NOSIGNAL, EINTR retried). False when the peer is gone.
bool send_all(int fd, std::string_view data);

// What a Connection reads and writes through. The default is the socket itself.
class Transport {
 public:
  enum class ReadStatus { kData, kNoData, kEof };
  virtual ~Transport() = default;
  // Runs once before the first request (a TLS handshake); false drops the connection.
  virtual bool handshake(int fd);
  // Blocks for the next bytes from `fd` and appends what they carry to `in`. kNoData: bytes
  // arrived that carry nothing yet (part of a TLS record).
  virtual ReadStatus read(int fd, std::string& in);
  // Sends `data`; false when the client is gone.
  virtual bool write(int fd, std::string_view data);
};

class Connection {
 public:
  // `transport` null: plain HTTP on `fd`.
  Connection(int fd, std::unique_ptr<Transport> transport);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs the transport's handshake. False on failure.
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
  // While streaming: waits until `wake_fd` is readable (-1: none), the deadline passes, or the
  // client closes the connection (or stop() shuts it down). Bytes the client sends meanwhile are
  // kept.
  WaitResult wait(int wake_fd, std::chrono::steady_clock::time_point deadline);
  // Whether the client has hung up, without blocking.
  bool client_gone() const;
  // Closes the TCP connection now (RST-free shutdown, no final chunk).
  void abort();

  bool keep_alive() const { return keep_alive_ && !broken_; }
  void set_close_after_response() { keep_alive_ = false; }
  bool broken() const { return broken_; }

 private:
  bool fill();  // blocks until more bytes arrive; false on EOF
  bool send_bytes(std::string_view data);
  bool read_chunked_body(std::string& body);

  int fd_;
  std::unique_ptr<Transport> transport_;
  std::string in_;
  bool keep_alive_ = true;
  bool broken_ = false;
};

class ConnectionServer {
 public:
  using Handler = std::function<void(const Request&, Connection&)>;
  // Makes the transport of each accepted connection; empty: plain HTTP.
  using TransportFactory = std::function<std::unique_ptr<Transport>()>;
  // `what` names the server in errors and logs ("fake API server"); `port_hint` is appended to
  // a failed bind's error (what to do instead, e.g. "choose another --port").
  ConnectionServer(std::string what, Handler handler, TransportFactory transport = {},
                   std::string port_hint = "choose a free port");
  ~ConnectionServer();  // stop()
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  // Binds address:port ("localhost" is 127.0.0.1; port 0 picks one) and starts accepting.
  // Throws InvalidArgument for an address that is not IPv4, Unavailable when it cannot bind.
  void start(const std::string& address, int port);
  void stop();  // idempotent
  int port() const { return port_; }
  bool running() const { return running_; }
  bool stopping() const { return stopping_; }

 private:
  void accept_loop();
  void serve(uint64_t id, int fd);
  void reap_finished();

  std::string what_;
  Handler handler_;
  TransportFactory transport_;
  std::string port_hint_;
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

}  // namespace longhaul::http
