#include "longhaul/base/http_server.h"

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"

namespace longhaul::http {
namespace {

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

}  // namespace

Server::Server(std::string what, std::string bind_address, int port, Handler handler)
    : what_(std::move(what)),
      address_(std::move(bind_address)),
      port_(port),
      handler_(std::move(handler)) {}

Server::~Server() { stop(); }

void Server::start() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  if (::inet_pton(AF_INET, address_.c_str(), &addr.sin_addr) != 1) {
    throw InvalidArgument(what_ + " address \"" + address_ + "\" is not an IPv4 address");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw_errno("cannot create a socket for", what_, errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    throw Unavailable("cannot serve " + what_ + " on " + address_ + ":" + std::to_string(port_) +
                      ": " + std::strerror(err) + "; choose a free port");
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) throw_errno("cannot create a pipe for", what_, errno);
  thread_ = std::thread([this] { serve(); });
}

void Server::stop() {
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

void Server::serve() {
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
    timeval tv{2, 0};  // a client that sends nothing cannot hold the server longer than this
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[2048];
    std::string request;
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    // Request line: METHOD SP PATH[?QUERY] SP VERSION
    const std::string_view line(request.data(), std::min(request.find("\r\n"), request.size()));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    Response response{404, "text/plain; charset=utf-8", "not found\n"};
    if (sp2 != std::string_view::npos) {
      const std::string_view method = line.substr(0, sp1);
      std::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
      path = path.substr(0, path.find('?'));
      try {
        response = handler_(method, path);
      } catch (const std::exception& e) {
        response = Response{500, "text/plain; charset=utf-8", std::string(e.what()) + "\n"};
      }
    }
    const std::string head = "HTTP/1.1 " + std::to_string(response.status) + " " +
                             reason_phrase(response.status) +
                             "\r\nContent-Type: " + response.content_type +
                             "\r\nContent-Length: " + std::to_string(response.body.size()) +
                             "\r\nConnection: close\r\n\r\n";
    std::string out = head + response.body;
    const char* p = out.data();
    size_t left = out.size();
    while (left > 0) {
      const ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::close(fd);
  }
}

}  // namespace longhaul::http
