// The probe server (see health_server.h).
#include "health_server.h"

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"

namespace longhaul::operator_cli {

HealthServer::HealthServer(std::string bind_address, int port, std::function<bool()> ready)
    : address_(std::move(bind_address)), port_(port), ready_(std::move(ready)) {}

HealthServer::~HealthServer() { stop(); }

void HealthServer::start() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw_errno("cannot create the health socket", address_, errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  if (::inet_pton(AF_INET, address_.c_str(), &addr.sin_addr) != 1) {
    throw InvalidArgument("health server address \"" + address_ + "\" is not an IPv4 address");
  }
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    throw Unavailable("cannot serve /healthz on " + address_ + ":" + std::to_string(port_) + ": " +
                      std::strerror(err) + " (pick another --health-port)");
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) throw_errno("cannot create a pipe", "health", errno);
  thread_ = std::thread([this] { serve(); });
}

void HealthServer::stop() {
  if (thread_.joinable()) {
    const char c = 'x';
    [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &c, 1);
    thread_.join();
  }
  for (int* fd : {&listen_fd_, &wake_pipe_[0], &wake_pipe_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void HealthServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[2048];
    std::string request;
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    int code = 404;
    std::string body = "not found\n";
    if (request.rfind("GET /healthz", 0) == 0) {
      code = 200;
      body = "ok\n";
    } else if (request.rfind("GET /readyz", 0) == 0) {
      const bool ok = ready_ && ready_();
      code = ok ? 200 : 503;
      body = ok ? "ok\n" : "informers not synced\n";
    }
    const std::string response =
        "HTTP/1.1 " + std::to_string(code) +
        (code == 200   ? " OK"
         : code == 503 ? " Service Unavailable"
                       : " Not Found") +
        "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    [[maybe_unused]] ssize_t n = ::send(fd, response.data(), response.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
}

}  // namespace longhaul::operator_cli
