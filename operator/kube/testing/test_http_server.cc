// Test HTTP server (see test_http_server.h).
#include "test_http_server.h"

#include <algorithm>
#include <sstream>
#include <thread>

namespace longhaul::kube::testing {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
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
      out[http::url_decode(part, true)] = "";
    } else {
      out[http::url_decode(part.substr(0, eq), true)] = http::url_decode(part.substr(eq + 1), true);
    }
  }
  return out;
}

void ResponseWriter::send(int status, const std::string& body,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::string& content_type) {
  answered_ = true;
  http::Headers all = {{"Content-Type", content_type}};
  all.insert(all.end(), headers.begin(), headers.end());
  connection_.send_response(status, all, body);
}

bool ResponseWriter::start_stream(int status, const std::string& content_type) {
  answered_ = true;
  return connection_.begin_chunked(status, {{"Content-Type", content_type}});
}

bool ResponseWriter::write_chunk(const std::string& data) { return connection_.write_chunk(data); }

void ResponseWriter::end_stream() { connection_.end_chunked(); }

void ResponseWriter::drop() {
  answered_ = true;
  connection_.abort();
}

bool ResponseWriter::client_gone() const { return connection_.client_gone(); }

bool ResponseWriter::server_stopping() const { return server_->stopping(); }

TestHttpServer::TestHttpServer(Handler handler)
    : handler_(std::move(handler)),
      server_("test HTTP server", [this](const http::Request& raw, http::Connection& connection) {
        serve(raw, connection);
      }) {
  server_.start("127.0.0.1", 0);
}

TestHttpServer::~TestHttpServer() { stop(); }

int TestHttpServer::port() const { return server_.port(); }

void TestHttpServer::stop() {
  stopping_ = true;
  cv_.notify_all();
  server_.stop();
}

void TestHttpServer::serve(const http::Request& raw, http::Connection& connection) {
  Request request;
  request.method = raw.method;
  request.target = raw.target;
  const auto q = raw.target.find('?');
  request.path = raw.target.substr(0, q);
  request.query = raw.query;
  request.headers.assign(raw.headers.begin(), raw.headers.end());
  request.body = raw.body;
  {
    longhaul::MutexLock lock(mu_);
    requests_.push_back(request);
  }
  cv_.notify_all();
  ResponseWriter writer(connection, this);
  try {
    handler_(request, writer);
  } catch (const std::exception& e) {
    if (!writer.answered_) writer.send(500, std::string("test handler threw: ") + e.what());
  }
  if (!writer.answered_) writer.send(500, "test handler did not answer");
}

std::vector<Request> TestHttpServer::requests() const {
  longhaul::MutexLock lock(mu_);
  return requests_;
}

bool TestHttpServer::wait_for_requests(size_t n, std::chrono::milliseconds timeout) const {
  longhaul::MutexLock lock(mu_);
  return cv_.wait_for(mu_, timeout, [&]() REQUIRES(mu_) { return requests_.size() >= n; });
}

void LineChannel::push(std::string line) {
  {
    longhaul::MutexLock lock(mu_);
    lines_.push_back(std::move(line));
  }
  cv_.notify_all();
}

void LineChannel::close() {
  {
    longhaul::MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

std::optional<std::string> LineChannel::pop(const ResponseWriter& writer) {
  longhaul::MutexLock lock(mu_);
  for (;;) {
    if (!lines_.empty()) {
      std::string line = std::move(lines_.front());
      lines_.pop_front();
      return line;
    }
    if (closed_ || writer.server_stopping() || writer.client_gone()) return std::nullopt;
    cv_.wait_for(mu_, std::chrono::milliseconds(10));
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
