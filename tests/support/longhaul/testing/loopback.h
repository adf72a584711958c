// Loopback helpers for tests and benchmarks that talk to a server they started: a free port to
// hand it, a plain HTTP GET of what it serves (/metrics, probes), and connections held open
// without a request (what anything in a pod network can do to a metrics endpoint). Header-only;
// every test built with longhaul_add_test (and the benchmarks) has tests/support on its include
// path.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace longhaul::testing {

// A TCP port on 127.0.0.1 that was free a moment ago. Racy by nature (another process may bind
// it before the server does), so it is drawn at random from below the kernel's ephemeral range
// (ip_local_port_range): the outgoing connections of tests running in parallel, which take
// ephemeral ports, can never grab it between this probe and the server's bind. Only another
// explicit picker could, and callers that can still retry on a bind failure.
inline int free_loopback_port() {
  auto can_bind = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
  };
  int ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) {
    range >> ephemeral_low;
  }
  constexpr int kFirst = 10000;
  if (ephemeral_low - kFirst >= 1000) {
    std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
    std::uniform_int_distribution<int> pick(kFirst, ephemeral_low - 1);
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int port = pick(rng);
      if (can_bind(port)) return port;
    }
  }
  // An unusual port range: whatever ephemeral port the kernel hands out.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The whole raw reply (status line, headers, body) to GET http://127.0.0.1:<port><target>
// (HTTP/1.1, Connection: close), read until the server closes; "" when nothing listens. The
// connect, the send and each read give up after `timeout` (Prometheus abandons a scrape after
// 10 s), so a server that stalls yields what it sent until then.
inline std::string http_get_raw(int port, std::string_view target, std::chrono::seconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  timeval tv{static_cast<time_t>(timeout.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect() too
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        "GET " + std::string(target) + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    [[maybe_unused]] const ssize_t sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buf[16384];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return reply;
}

struct HttpResponse {
  int status = 0;  // 0: nothing listening, or no HTTP reply
  std::string body;
};

// GET http://127.0.0.1:<port><path> (HTTP/1.1, Connection: close); gives up on a connect or a
// reply that stalls for 5 s (half of Prometheus's scrape timeout).
inline HttpResponse http_get(int port, std::string_view path) {
  const std::string reply = http_get_raw(port, path, std::chrono::seconds(5));
  // "HTTP/1.1 200 OK\r\n...\r\n\r\n<body>"
  if (reply.size() < 12 || reply.compare(0, 5, "HTTP/") != 0) return {};
  const size_t header_end = reply.find("\r\n\r\n");
  return {std::stoi(reply.substr(9, 3)),
          header_end == std::string::npos ? std::string() : reply.substr(header_end + 4)};
}

// Raises the soft limit on open files to the hard limit, for a test or benchmark that holds
// hundreds of connections (both ends in one process); returns the new soft limit.
inline uint64_t raise_open_files_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
}

// Connections to 127.0.0.1:<port> opened without waiting for the server to accept them (a
// non-blocking connect: a server whose backlog is full cannot stall the caller), then held. Each
// may be given a prefix of a request (a client that stops, or trickles, in the middle of its
// header). The destructor closes those still open.
class HeldConnections {
 public:
  HeldConnections(int port, int count, std::string_view prefix = {}) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < count; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
          errno != EINPROGRESS) {
        ::close(fd);
        continue;
      }
      fds_.push_back(fd);
    }
    if (!prefix.empty()) send_each(prefix);
  }
  ~HeldConnections() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  HeldConnections(const HeldConnections&) = delete;
  HeldConnections& operator=(const HeldConnections&) = delete;

  size_t size() const { return fds_.size(); }

  // Sends `bytes` on every connection (those not yet connected or already closed ignore it).
  void send_each(std::string_view bytes) {
    for (int fd : fds_) {
      if (fd >= 0) {
        [[maybe_unused]] const ssize_t n =
            ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
  }

  // How many the server has closed: a read sees the end of the stream or a reset (never
  // blocks; what the server sent before closing is discarded).
  size_t closed_by_server() {
    size_t closed = 0;
    for (int& fd : fds_) {
      if (fd < 0) {
        ++closed;
        continue;
      }
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      }
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ::close(fd);
        fd = -1;
        ++closed;
      }
    }
    return closed;
  }

 private:
  std::vector<int> fds_;  // -1 once seen closed by the server
};

}  // namespace longhaul::testing
