// A minimal HTTP/1.1 server for probes and Prometheus scrapes: one thread running an event loop
// over non-blocking sockets, up to 64 connections at once (more wait in the listen backlog),
// each with a 5 s deadline from accept to the last byte of the response, requests answered by a
// handler, Connection: close. An idle or slow client delays neither other clients nor stop(). It
// exists because a library that pins its threads' stack size (civetweb, under prometheus-cpp's
// Exposer) cannot start threads in a process that loads cuBLASLt, whose static TLS alone is ~94 KB;
// this server's thread gets the default stack.
//
// Thread-safety: start()/stop() from the owning thread; the handler runs on the server thread.
#pragma once

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

class Server {
 public:
  // `what` names the server in errors ("Prometheus metrics", "/healthz").
  Server(std::string what, std::string bind_address, int port, Handler handler);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (port 0: an ephemeral port) and starts the server thread. Throws Unavailable naming
  // the address and port when it cannot bind, InvalidArgument for an address that is not IPv4.
  void start();
  void stop();  // idempotent; closes every connection and joins the thread
  int port() const { return port_; }

 private:
  void serve();
  std::string respond(const std::string& request);  // the whole HTTP response to `request`
  std::string what_;
  std::string address_;
  int port_;
  Handler handler_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace longhaul::http
