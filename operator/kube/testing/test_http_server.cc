// Test HTTP server (see test_http_server.h).
#include "test_http_server.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"

namespace longhaul::kube::testing {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string url_decode(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size()) {
      out.push_back(static_cast<char>(std::stoi(in.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else if (in[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

}  // namespace

std::string Request::header(const std::string& name) const {
  const std::string wanted = lower(name);
  for (const auto& [key, value] : headers) {
    if (lower(key) == wanted) return value;
  }
  return "";
}

std::map<std::string, std::string> Request::params() const {
  std::map<std::string, std::string> out;
  std::stringstream in(query);
  std::string part;
  while (std::getline(in, part, '&')) {
    if (part.empty()) continue;
    auto eq = part.find('=');
    if (eq == std::string::npos) {
      out[url_decode(part)] = "";
    } else {
      out[url_decode(part.substr(0, eq))] = url_decode(part.substr(eq + 1));
    }
  }
  return out;
}

bool ResponseWriter::write_all(const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

void ResponseWriter::send(int status, const std::string& body,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::string& content_type) {
  answered_ = true;
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [key, value] : headers) out += key + ": " + value + "\r\n";
  out += "\r\n" + body;
  write_all(out);
}

bool ResponseWriter::start_stream(int status, const std::string& content_type) {
  answered_ = true;
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\nTransfer-Encoding: chunked\r\n\r\n";
  return write_all(out);
}

bool ResponseWriter::write_chunk(const std::string& data) {
  if (data.empty()) return true;
  std::ostringstream out;
  out << std::hex << data.size() << "\r\n" << data << "\r\n";
  return write_all(out.str());
}

void ResponseWriter::end_stream() { write_all("0\r\n\r\n"); }

void ResponseWriter::drop() {
  answered_ = true;
  dropped_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

bool ResponseWriter::client_gone() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

bool ResponseWriter::server_stopping() const { return server_->stopping(); }

TestHttpServer::TestHttpServer(Handler handler) : handler_(std::move(handler)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) throw_errno("test server: socket", "", errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    int err = errno;
    ::close(listen_fd_);
    throw_errno("test server: bind/listen", "127.0.0.1", err);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

TestHttpServer::~TestHttpServer() { stop(); }

void TestHttpServer::stop() {
  if (stopping_.exchange(true)) {
    if (accept_thread_.joinable()) accept_thread_.join();
    return;
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  std::list<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  cv_.notify_all();
  for (auto& t : workers) t.join();
}

void TestHttpServer::accept_loop() {
  for (;;) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) {
      ::close(fd);
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    open_fds_.push_back(fd);
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void TestHttpServer::serve(int fd) {
  std::string buffer;
  char chunk[8192];
  auto fill = [&]() {
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  };
  for (;;) {
    size_t header_end;
    bool ok = true;
    while ((header_end = buffer.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) {
        ok = false;
        break;
      }
    }
    if (!ok || stopping_.load()) break;
    Request request;
    std::istringstream head(buffer.substr(0, header_end));
    std::string line;
    std::getline(head, line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream request_line(line);
    std::string version;
    request_line >> request.method >> request.target >> version;
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      request.headers.emplace_back(line.substr(0, colon), value);
    }
    buffer.erase(0, header_end + 4);
    size_t length = 0;
    if (std::string cl = request.header("Content-Length"); !cl.empty()) length = std::stoul(cl);
    while (buffer.size() < length) {
      if (!fill()) {
        ok = false;
        break;
      }
    }
    if (!ok) break;
    request.body = buffer.substr(0, length);
    buffer.erase(0, length);
    auto q = request.target.find('?');
    request.path = request.target.substr(0, q);
    request.query = q == std::string::npos ? "" : request.target.substr(q + 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(request);
    }
    cv_.notify_all();
    ResponseWriter writer(fd, this);
    try {
      handler_(request, writer);
    } catch (const std::exception& e) {
      if (!writer.answered_) writer.send(500, std::string("test handler threw: ") + e.what());
    }
    if (!writer.answered_) writer.send(500, "test handler did not answer");
    if (writer.dropped_ || lower(request.header("Connection")) == "close") break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  ::close(fd);
}

std::vector<Request> TestHttpServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

bool TestHttpServer::wait_for_requests(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return requests_.size() >= n; });
}

void LineChannel::push(std::string line) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::move(line));
  }
  cv_.notify_all();
}

void LineChannel::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

std::optional<std::string> LineChannel::pop(const ResponseWriter& writer) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!lines_.empty()) {
      std::string line = std::move(lines_.front());
      lines_.pop_front();
      return line;
    }
    if (closed_ || writer.server_stopping() || writer.client_gone()) return std::nullopt;
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace longhaul::kube::testing
