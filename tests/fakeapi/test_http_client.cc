#include "test_http_client.h"

#include <cerrno>
#include <csignal>
#include <stdexcept>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace longhaul::fakeapi::testing {
namespace {

// A test that writes to a connection the server closed must see an error, not die.
const bool kIgnoreSigpipe = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

TestHttpClient::TestHttpClient(int port, std::string token, std::filesystem::path ca_file)
    : port_(port), token_(std::move(token)), ca_file_(std::move(ca_file)) {
  (void)kIgnoreSigpipe;
}

TestHttpClient::~TestHttpClient() {
  disconnect();
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

void TestHttpClient::disconnect() {
  if (ssl_ != nullptr) {
    SSL_free(ssl_);
    ssl_ = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_.clear();
}

void TestHttpClient::connect() {
  disconnect();
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    disconnect();
    throw std::runtime_error("test client: cannot connect to port " + std::to_string(port_));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (ca_file_.empty()) return;
  if (ctx_ == nullptr) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_load_verify_locations(ctx_, ca_file_.c_str(), nullptr) != 1) {
      throw std::runtime_error("test client: cannot load CA " + ca_file_.string());
    }
  }
  ssl_ = SSL_new(ctx_);
  SSL_set_fd(ssl_, fd_);
  SSL_set_tlsext_host_name(ssl_, "localhost");
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), "127.0.0.1");
  if (SSL_connect(ssl_) != 1) {
    ERR_clear_error();
    disconnect();
    throw std::runtime_error("test client: TLS handshake failed (certificate not verified?)");
  }
}

bool TestHttpClient::send_all(const std::string& data) {
  if (ssl_ != nullptr) return SSL_write(ssl_, data.data(), static_cast<int>(data.size())) > 0;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool TestHttpClient::fill(std::chrono::steady_clock::time_point deadline) {
  if (fd_ < 0) return false;
  if (ssl_ == nullptr || SSL_pending(ssl_) == 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r == 0) {
      timed_out_ = true;
      return false;
    }
  }
  char buf[16384];
  int n = ssl_ != nullptr ? SSL_read(ssl_, buf, sizeof(buf))
                          : static_cast<int>(::recv(fd_, buf, sizeof(buf), 0));
  if (n <= 0) {
    closed_ = true;
    return false;
  }
  in_.append(buf, static_cast<size_t>(n));
  return true;
}

bool TestHttpClient::read_line(std::string& line, std::chrono::steady_clock::time_point deadline) {
  size_t eol;
  while ((eol = in_.find("\r\n")) == std::string::npos) {
    if (!fill(deadline)) return false;
  }
  line = in_.substr(0, eol);
  in_.erase(0, eol + 2);
  return true;
}

Response TestHttpClient::read_head(std::chrono::steady_clock::time_point deadline) {
  Response response;
  std::string line;
  do {
    if (!read_line(line, deadline)) throw std::runtime_error("test client: no response");
    response.status = std::stoi(line.substr(9, 3));
    response.headers.clear();
    for (;;) {
      if (!read_line(line, deadline)) throw std::runtime_error("test client: truncated headers");
      if (line.empty()) break;
      size_t colon = line.find(':');
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      response.headers[lower(line.substr(0, colon))] = value;
    }
  } while (response.status == 100);
  return response;
}

Response TestHttpClient::request(const std::string& method, const std::string& target,
                                 const std::string& body, const std::string& content_type) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool fresh = fd_ < 0;
    if (fresh) connect();
    closed_ = timed_out_ = false;
    std::string out = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    out += "Accept: application/json\r\n";
    if (!token_.empty()) out += "Authorization: Bearer " + token_ + "\r\n";
    if (!body.empty()) out += "Content-Type: " + content_type + "\r\n";
    out += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    if (!send_all(out)) {
      disconnect();
      if (fresh) throw std::runtime_error("test client: send failed");
      continue;  // a kept-alive connection the server closed: retry once on a new one
    }
    Response response;
    try {
      response = read_head(deadline);
    } catch (const std::exception&) {
      disconnect();
      if (fresh) throw;
      continue;
    }
    if (lower(response.header("transfer-encoding")) == "chunked") {
      std::string line;
      for (;;) {
        if (!read_line(line, deadline)) throw std::runtime_error("test client: bad chunk");
        size_t size = std::stoul(line, nullptr, 16);
        if (size == 0) {
          read_line(line, deadline);
          break;
        }
        while (in_.size() < size + 2) {
          if (!fill(deadline)) throw std::runtime_error("test client: truncated chunk");
        }
        response.body += in_.substr(0, size);
        in_.erase(0, size + 2);
      }
    } else {
      size_t length = std::stoul(
          response.header("content-length").empty() ? "0" : response.header("content-length"));
      while (in_.size() < length) {
        if (!fill(deadline)) throw std::runtime_error("test client: truncated body");
      }
      response.body = in_.substr(0, length);
      in_.erase(0, length);
    }
    if (lower(response.header("connection")) == "close") disconnect();
    return response;
  }
  throw std::runtime_error("test client: request failed twice");
}

Response TestHttpClient::start_watch(const std::string& target) {
  connect();
  closed_ = timed_out_ = ended_cleanly_ = false;
  stream_.clear();
  std::string out = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!token_.empty()) out += "Authorization: Bearer " + token_ + "\r\n";
  out += "\r\n";
  if (!send_all(out)) throw std::runtime_error("test client: send failed");
  Response response = read_head(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  chunked_ = lower(response.header("transfer-encoding")) == "chunked";
  if (!chunked_) {
    size_t length = std::stoul(
        response.header("content-length").empty() ? "0" : response.header("content-length"));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (in_.size() < length && fill(deadline)) {
    }
    response.body = in_.substr(0, length);
    in_.erase(0, std::min(length, in_.size()));
  }
  return response;
}

std::optional<json> TestHttpClient::next_event(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  timed_out_ = false;
  for (;;) {
    size_t nl = stream_.find('\n');
    if (nl != std::string::npos) {
      std::string line = stream_.substr(0, nl);
      stream_.erase(0, nl + 1);
      return json::parse(line);
    }
    if (ended_cleanly_ || fd_ < 0) return std::nullopt;
    // Decode one more chunk.
    std::string line;
    if (!read_line(line, deadline)) return std::nullopt;
    size_t size = std::stoul(line, nullptr, 16);
    if (size == 0) {
      read_line(line, deadline);
      ended_cleanly_ = true;
      continue;
    }
    while (in_.size() < size + 2) {
      if (!fill(deadline)) return std::nullopt;
    }
    stream_ += in_.substr(0, size);
    in_.erase(0, size + 2);
  }
}

}  // namespace longhaul::fakeapi::testing
