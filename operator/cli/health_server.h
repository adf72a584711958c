// A minimal HTTP/1.1 server for the kubelet's probes: GET /healthz answers 200 "ok" while the
// process runs; GET /readyz answers 200 when ready() returns true, else 503. Anything else is
// 404. One connection at a time, Connection: close.
//
// Thread-safety: start()/stop() from the owning thread; ready() is called on the server thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace longhaul::operator_cli {

class HealthServer {
 public:
  HealthServer(std::string bind_address, int port, std::function<bool()> ready);
  ~HealthServer();  // stop()
  // Binds and starts the server thread. Throws Unavailable naming the address when it cannot bind.
  void start();
  void stop();  // idempotent; joins the thread
  int port() const { return port_; }

 private:
  void serve();
  std::string address_;
  int port_;
  std::function<bool()> ready_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace longhaul::operator_cli
