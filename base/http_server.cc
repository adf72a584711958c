#include "longhaul/base/http_server.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/http_connection.h"

namespace longhaul::http {

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

namespace {

// One client connection of the event loop.
struct PendingRequest {
  int fd = -1;
  std::chrono::steady_clock::time_point deadline;
  std::string in;   // request bytes read so far
  std::string out;  // the response, once the request is complete
  size_t sent = 0;
  bool writing = false;
};

constexpr size_t kMaxConnections = 64;     // more wait in the listen backlog
constexpr size_t kMaxRequestBytes = 8192;  // a scrape or probe request is a few hundred bytes
constexpr auto kRequestDeadline = std::chrono::seconds(5);  // accept -> response sent

}  // namespace

std::string Server::respond(const std::string& request) {
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
  return "HTTP/1.1 " + std::to_string(response.status) + " " + reason_phrase(response.status) +
         "\r\nContent-Type: " + response.content_type +
         "\r\nContent-Length: " + std::to_string(response.body.size()) +
         "\r\nConnection: close\r\n\r\n" + response.body;
}

// An event loop over non-blocking sockets: up to kMaxConnections clients at once, each with a
// deadline from accept to the last byte sent, so idle or slow clients neither delay the others
// nor a stop (the wake pipe ends the loop at once and every connection is closed).
void Server::serve() {
  using Clock = std::chrono::steady_clock;
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  std::vector<PendingRequest> conns;
  auto close_all = [&] {
    for (auto& c : conns) ::close(c.fd);
    conns.clear();
  };
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(conns.size() < kMaxConnections ? POLLIN : 0), 0});
    auto next_deadline = Clock::time_point::max();
    for (const auto& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, c.deadline);
    }
    int timeout_ms = -1;
    if (!conns.empty()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      close_all();
      return;
    }
    if (fds[0].revents != 0) {
      close_all();
      return;
    }
    // Serve the connections polled (indices shift by 2), then drop the finished and expired.
    const auto now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      PendingRequest& c = conns[i];
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      if (!c.writing) {
        char buf[2048];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0 && c.in.empty()) {
          c.deadline = now;  // closed without a request
          continue;
        }
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        if (n <= 0 || c.in.find("\r\n\r\n") != std::string::npos ||
            c.in.size() >= kMaxRequestBytes) {
          c.out = respond(c.in);
          c.writing = true;
        }
        continue;
      }
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        c.deadline = now;
        continue;
      }
      c.sent += static_cast<size_t>(n);
      if (c.sent == c.out.size()) c.deadline = now;  // done
    }
    std::erase_if(conns, [&](const PendingRequest& c) {
      if (c.deadline > now) return false;
      ::close(c.fd);
      return true;
    });
    if ((fds[1].revents & POLLIN) != 0) {
      while (conns.size() < kMaxConnections) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        conns.push_back(PendingRequest{fd, Clock::now() + kRequestDeadline, {}, {}, 0, false});
      }
    }
  }
}

}  // namespace longhaul::http
