// The thread-per-connection HTTP/1.1 server (see http_connection.h).
#include "longhaul/base/http_connection.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/base/strings.h"

namespace longhaul::http {
namespace {

constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kMaxBodyBytes = 64 << 20;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Request::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

std::string Request::param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}

std::string url_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2])));
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 413:
      return "Request Entity Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status " + std::to_string(status);
  }
}

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Transport: the socket itself

bool Transport::handshake(int) { return true; }

Transport::ReadStatus Transport::read(int fd, std::string& in) {
  char buf[16384];
  ssize_t n;
  do {
    n = ::recv(fd, buf, sizeof(buf), 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return ReadStatus::kEof;
  in.append(buf, static_cast<size_t>(n));
  return ReadStatus::kData;
}

bool Transport::write(int fd, std::string_view data) { return send_all(fd, data); }

// ---------------------------------------------------------------------------------------------
// Connection

Connection::Connection(int fd, std::unique_ptr<Transport> transport)
    : fd_(fd), transport_(transport ? std::move(transport) : std::make_unique<Transport>()) {}

Connection::~Connection() = default;

bool Connection::send_bytes(std::string_view data) {
  if (broken_) return false;
  if (!transport_->write(fd_, data)) {
    broken_ = true;
    return false;
  }
  return true;
}

bool Connection::fill() {
  for (;;) {
    const Transport::ReadStatus status = transport_->read(fd_, in_);
    if (status == Transport::ReadStatus::kData) return true;
    if (status == Transport::ReadStatus::kEof) return false;
  }
}

bool Connection::handshake() { return transport_->handshake(fd_); }

bool Connection::read_chunked_body(std::string& body) {
  for (;;) {
    size_t eol;
    while ((eol = in_.find("\r\n")) == std::string::npos) {
      if (!fill()) return false;
    }
    size_t size = std::strtoul(in_.substr(0, eol).c_str(), nullptr, 16);
    in_.erase(0, eol + 2);
    if (size == 0) {
      // Trailers (ignored) end with an empty line.
      for (;;) {
        while ((eol = in_.find("\r\n")) == std::string::npos) {
          if (!fill()) return false;
        }
        bool empty = eol == 0;
        in_.erase(0, eol + 2);
        if (empty) return true;
      }
    }
    if (body.size() + size > kMaxBodyBytes) return false;
    while (in_.size() < size + 2) {
      if (!fill()) return false;
    }
    body.append(in_, 0, size);
    in_.erase(0, size + 2);
  }
}

bool Connection::read_request(Request& request) {
  size_t end;
  while ((end = in_.find("\r\n\r\n")) == std::string::npos) {
    if (in_.size() > kMaxHeaderBytes) {
      send_response(431, {{"Content-Type", "text/plain"}}, "request headers too large\n");
      return false;
    }
    if (!fill()) return false;
  }
  std::string_view head(in_.data(), end);
  size_t line_end = head.find("\r\n");
  std::string_view request_line = head.substr(0, line_end);
  size_t sp1 = request_line.find(' ');
  size_t sp2 = request_line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) {
    send_response(400, {{"Content-Type", "text/plain"}}, "malformed request line\n");
    return false;
  }
  request = Request();
  request.method = std::string(request_line.substr(0, sp1));
  request.target = std::string(request_line.substr(sp1 + 1, sp2 - sp1 - 1));
  std::string version(request_line.substr(sp2 + 1));
  size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t next = head.find("\r\n", pos);
    if (next == std::string_view::npos) next = head.size();
    std::string_view line = head.substr(pos, next - pos);
    size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      request.headers[lower(trim(line.substr(0, colon), " \t"))] =
          std::string(trim(line.substr(colon + 1), " \t\r"));
    }
    pos = next + 2;
  }
  in_.erase(0, end + 4);

  size_t q = request.target.find('?');
  request.path = url_decode(request.target.substr(0, q), false);
  if (q != std::string::npos) {
    request.query = request.target.substr(q + 1);
    std::string_view query = request.query;
    while (!query.empty()) {
      size_t amp = query.find('&');
      std::string_view pair = query.substr(0, amp);
      size_t eq = pair.find('=');
      std::string key = url_decode(pair.substr(0, eq), true);
      std::string value = eq == std::string_view::npos ? "" : url_decode(pair.substr(eq + 1), true);
      if (!key.empty()) request.params[key] = value;
      if (amp == std::string_view::npos) break;
      query.remove_prefix(amp + 1);
    }
  }

  std::string connection = lower(request.header("connection"));
  keep_alive_ = version == "HTTP/1.1" ? connection.find("close") == std::string::npos
                                      : connection.find("keep-alive") != std::string::npos;
  if (lower(request.header("expect")) == "100-continue") {
    if (!send_bytes("HTTP/1.1 100 Continue\r\n\r\n")) return false;
  }
  if (lower(request.header("transfer-encoding")).find("chunked") != std::string::npos) {
    if (!read_chunked_body(request.body)) return false;
  } else if (std::string length = request.header("content-length"); !length.empty()) {
    size_t n = std::strtoull(length.c_str(), nullptr, 10);
    if (n > kMaxBodyBytes) {
      send_response(413, {{"Content-Type", "text/plain"}}, "request body too large\n");
      return false;
    }
    while (in_.size() < n) {
      if (!fill()) return false;
    }
    request.body = in_.substr(0, n);
    in_.erase(0, n);
  }
  return true;
}

bool Connection::send_response(int status, const Headers& headers, std::string_view body) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  for (const auto& [name, value] : headers) out += name + ": " + value + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (!keep_alive_) out += "Connection: close\r\n";
  out += "\r\n";
  out.append(body);
  return send_bytes(out);
}

bool Connection::begin_chunked(int status, const Headers& headers) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  for (const auto& [name, value] : headers) out += name + ": " + value + "\r\n";
  out += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive_) out += "Connection: close\r\n";
  out += "\r\n";
  return send_bytes(out);
}

bool Connection::write_chunk(std::string_view data) {
  if (data.empty()) return true;
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out(size);
  out.append(data);
  out += "\r\n";
  return send_bytes(out);
}

bool Connection::end_chunked() { return send_bytes("0\r\n\r\n"); }

Connection::WaitResult Connection::wait(int wake_fd,
                                        std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return WaitResult::kTimeout;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int r = ::poll(fds, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      broken_ = true;
      return WaitResult::kClientClosed;
    }
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) return WaitResult::kWoken;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      if (transport_->read(fd_, in_) == Transport::ReadStatus::kEof) {
        broken_ = true;
        return WaitResult::kClientClosed;
      }
    }
  }
}

bool Connection::client_gone() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

void Connection::abort() {
  broken_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

// ---------------------------------------------------------------------------------------------
// Server

ConnectionServer::ConnectionServer(std::string what, Handler handler, TransportFactory transport,
                                   std::string port_hint)
    : what_(std::move(what)),
      handler_(std::move(handler)),
      transport_(std::move(transport)),
      port_hint_(std::move(port_hint)) {}

ConnectionServer::~ConnectionServer() { stop(); }

void ConnectionServer::start(const std::string& address, int port) {
  stopping_ = false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string ip = address == "localhost" ? "127.0.0.1" : address;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    throw InvalidArgument(what_ + ": bind address '" + address +
                          "' is not an IPv4 address; use e.g. 127.0.0.1 or 0.0.0.0");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw_errno(what_ + ": cannot create a socket", address, errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 128) != 0) {
    int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    throw Unavailable(what_ + ": cannot listen on " + address + ":" + std::to_string(port) + ": " +
                      std::strerror(err) + "; " + port_hint_);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  running_ = true;
  acceptor_ = std::thread([this] { accept_loop(); });
}

void ConnectionServer::accept_loop() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) {
          LH_LOG(WARNING) << what_ << ": out of file descriptors while accepting";
        }
        continue;
      }
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    reap_finished();
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_id_++;
    auto& slot = connections_[id];
    slot.first = fd;
    slot.second = std::thread([this, id, fd] { serve(id, fd); });
  }
}

void ConnectionServer::serve(uint64_t id, int fd) {
  {
    Connection connection(fd, transport_ ? transport_() : nullptr);
    try {
      if (connection.handshake()) {
        Request request;
        while (!stopping_ && connection.read_request(request)) {
          handler_(request, connection);
          if (!connection.keep_alive()) break;
        }
      }
    } catch (const std::exception& e) {
      LH_LOG(ERROR) << what_ << ": connection handler failed: " << e.what();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(id);
  if (it != connections_.end()) {
    it->second.first = -1;
    finished_.push_back(id);
  }
  ::close(fd);
}

void ConnectionServer::reap_finished() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : finished_) {
      auto it = connections_.find(id);
      if (it != connections_.end()) {
        done.push_back(std::move(it->second.second));
        connections_.erase(it);
      }
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void ConnectionServer::stop() {
  if (!running_) return;
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  listen_fd_ = -1;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, slot] : connections_) {
      if (slot.first >= 0) ::shutdown(slot.first, SHUT_RDWR);
      threads.push_back(std::move(slot.second));
    }
    connections_.clear();
    finished_.clear();
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  running_ = false;
}

}  // namespace longhaul::http
