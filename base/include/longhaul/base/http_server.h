// A minimal HTTP/1.1 server for probes and Prometheus scrapes: one thread running a poll() event
// loop over non-blocking sockets, requests answered by a handler, Connection: close. It exists
// because a library that pins its threads' stack size (civetweb, under prometheus-cpp's Exposer)
// cannot start threads in a process that loads cuBLASLt, whose static TLS alone is ~94 KB; this
// server's thread gets the default stack.
//
// It cannot be starved by clients that connect and then say nothing (anything in a pod network
// can hold such connections open, and Prometheus gives up on a scrape after 10 s):
//   * it accepts every pending connection at once (the listen backlog never fills), up to a
//     bound derived from the process's file-descriptor limit;
//   * a connection must deliver its whole request header within `header_timeout` of its accept
//     (a client trickling bytes cannot extend that), and the whole exchange must end within
//     `request_timeout`; past its deadline a connection is closed;
//   * at the bound, a new connection evicts the oldest connection that has not yet sent a whole
//     request, so held-open connections never take the place of a scrape;
//   * stop() closes every connection at once, whatever the clients are doing.
//
// Thread-safety: start()/stop() from the owning thread; the handler runs on the server thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace longhaul::http {

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Called with the request method and path (query string stripped) of each request.
using Handler = std::function<Response(std::string_view method, std::string_view path)>;

struct ServerOptions {
  // Accept -> whole request header received. A scraper or prober sends it at once.
  std::chrono::milliseconds header_timeout{2000};
  // Accept -> last byte of the response sent.
  std::chrono::milliseconds request_timeout{5000};
  // Connections open at once; 0: a quarter of the soft RLIMIT_NOFILE, between 16 and 1024.
  size_t max_connections = 0;
};

class Server {
 public:
  // `what` names the server in errors ("Prometheus metrics", "/healthz").
  Server(std::string what, std::string bind_address, int port, Handler handler,
         ServerOptions options = {});
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (port 0: an ephemeral port) and starts the server thread. Throws Unavailable naming
  // the address and port when it cannot bind, InvalidArgument for an address that is not IPv4.
  void start();
  void stop();  // idempotent; closes every connection and joins the thread
  int port() const { return port_; }
  // The bound on connections open at once (options.max_connections, or the derived default).
  size_t max_connections() const { return max_connections_; }

 private:
  void serve();
  std::string respond(const std::string& request);  // the whole HTTP response to `request`
  std::string what_;
  std::string address_;
  int port_;
  Handler handler_;
  ServerOptions options_;
  size_t max_connections_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace longhaul::http
