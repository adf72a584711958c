#include "longhaul/base/http_server.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/http_connection.h"

namespace longhaul::http {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestBytes = 8192;  // a scrape or probe request is a few hundred bytes
constexpr int kListenBacklog = 4096;       // the kernel caps it at net.core.somaxconn
// After accept() failed for want of descriptors with no connection left to evict.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

size_t default_max_connections() {
  rlimit limit{};
  uint64_t soft = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    soft = limit.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 20 : limit.rlim_cur;
  }
  return static_cast<size_t>(std::clamp<uint64_t>(soft / 4, 16, 1024));
}

// One client connection of the event loop.
struct Client {
  int fd = -1;
  Clock::time_point header_deadline;   // the whole request header must have arrived by then
  Clock::time_point request_deadline;  // the last byte of the response must be sent by then
  std::string in;                      // request bytes read so far
  std::string out;                     // the response, once the request is complete
  size_t sent = 0;
  bool writing = false;  // the request is complete; `out` is being sent
  bool done = false;     // to be closed
  Clock::time_point deadline() const { return writing ? request_deadline : header_deadline; }
};

// Closes the oldest connection that has not sent a whole request yet (`clients` is in accept
// order). False when every connection is already being answered.
bool evict_oldest_incomplete(std::vector<Client>& clients) {
  auto it =
      std::find_if(clients.begin(), clients.end(), [](const Client& c) { return !c.writing; });
  if (it == clients.end()) return false;
  ::close(it->fd);
  clients.erase(it);
  return true;
}

}  // namespace

Server::Server(std::string what, std::string bind_address, int port, Handler handler,
               ServerOptions options)
    : what_(std::move(what)),
      address_(std::move(bind_address)),
      port_(port),
      handler_(std::move(handler)),
      options_(options),
      max_connections_(options.max_connections > 0 ? options.max_connections
                                                   : default_max_connections()) {}

Server::~Server() { stop(); }

void Server::start() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  if (::inet_pton(AF_INET, address_.c_str(), &addr.sin_addr) != 1) {
    throw InvalidArgument(what_ + " address \"" + address_ + "\" is not an IPv4 address");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) throw_errno("cannot create a socket for", what_, errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, kListenBacklog) != 0) {
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

// The event loop: every connection polled each round (a few hundred descriptors cost poll()
// microseconds), each closed when done or past its deadline; the listen socket is drained on
// every round it is readable, evicting the oldest incomplete connection beyond the bound; the
// wake pipe ends the loop at once and every connection is closed.
void Server::serve() {
  std::vector<Client> clients;  // in accept order: the front is the oldest
  std::vector<pollfd> fds;
  auto accept_paused_until = Clock::time_point::min();
  auto close_all = [&] {
    for (auto& c : clients) ::close(c.fd);
    clients.clear();
  };
  const auto header_timeout = std::min(options_.header_timeout, options_.request_timeout);
  for (;;) {
    auto now = Clock::now();
    const bool accepting = now >= accept_paused_until;
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    auto next_deadline = accepting ? Clock::time_point::max() : accept_paused_until;
    for (const auto& c : clients) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, c.deadline());
    }
    int timeout_ms = -1;
    if (next_deadline != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60'000));
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
    now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      if (fds[i + 2].revents == 0) continue;
      if (!c.writing) {
        char buf[4096];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n < 0 || (n == 0 && c.in.empty())) {  // reset, or closed without a request
          c.done = true;
          continue;
        }
        c.in.append(buf, static_cast<size_t>(n));
        if (n > 0 && c.in.find("\r\n\r\n") == std::string::npos && c.in.size() < kMaxRequestBytes) {
          continue;  // more of the header to come
        }
        c.out = respond(c.in);
        c.writing = true;
        // The socket is almost always writable now: send without another round of poll().
      }
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        c.done = true;
        continue;
      }
      c.sent += static_cast<size_t>(n);
      if (c.sent == c.out.size()) c.done = true;
    }
    std::erase_if(clients, [&](const Client& c) {
      if (!c.done && c.deadline() > now) return false;
      ::close(c.fd);
      return true;
    });
    if ((fds[1].revents & POLLIN) == 0) continue;
    // Take every pending connection, so that a scrape never waits behind held-open ones in the
    // listen backlog; beyond the bound, the oldest that has not sent a request makes room. At
    // most a bound's worth per round, so that a flood of connects cannot stall the serving.
    for (size_t accepted = 0; accepted < max_connections_; ++accepted) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        const bool out_of_fds = errno == EMFILE || errno == ENFILE;
        if (out_of_fds && evict_oldest_incomplete(clients)) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) accept_paused_until = now + kAcceptRetry;
        break;
      }
      Client c;
      c.fd = fd;
      c.header_deadline = now + header_timeout;
      c.request_deadline = now + options_.request_timeout;
      clients.push_back(std::move(c));
      if (clients.size() > max_connections_) evict_oldest_incomplete(clients);
    }
  }
}

}  // namespace longhaul::http
