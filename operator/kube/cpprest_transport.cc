// cpprestsdk adapter: every cpprestsdk and Boost type and exception ends here.
#include "longhaul/kube/cpprest_transport.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>

#include <boost/asio/ssl.hpp>
#include <cpprest/http_client.h>
#include <pplx/threadpool.h>

#include "longhaul/base/error.h"
#include "longhaul/base/mutex.h"

namespace longhaul::kube {

namespace http = web::http;
namespace client = web::http::client;

std::optional<std::string> find_header(const HttpHeaders& headers, std::string_view name) {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return value;
    }
  }
  return std::nullopt;
}

namespace {

client::http_client_config make_config(const CpprestTransportOptions& options,
                                       std::chrono::milliseconds timeout) {
  client::http_client_config config;
  config.set_timeout(timeout);
  config.set_validate_certificates(!options.tls.insecure_skip_tls_verify);
  TlsOptions tls = options.tls;
  config.set_ssl_context_callback([tls](boost::asio::ssl::context& ctx) {
    // Runs on cpprestsdk's connection thread; errors surface as a failed request.
    if (!tls.ca_file.empty()) ctx.load_verify_file(tls.ca_file);
    if (!tls.ca_pem.empty()) ctx.add_certificate_authority(boost::asio::buffer(tls.ca_pem));
    if (!tls.client_cert_file.empty()) ctx.use_certificate_chain_file(tls.client_cert_file);
    if (!tls.client_cert_pem.empty())
      ctx.use_certificate_chain(boost::asio::buffer(tls.client_cert_pem));
    if (!tls.client_key_file.empty())
      ctx.use_private_key_file(tls.client_key_file, boost::asio::ssl::context::pem);
    if (!tls.client_key_pem.empty())
      ctx.use_private_key(boost::asio::buffer(tls.client_key_pem), boost::asio::ssl::context::pem);
  });
  return config;
}

http::http_request make_request(const HttpRequest& request) {
  http::http_request req(http::method(request.method));
  req.set_request_uri(web::uri(request.target));
  std::string content_type;
  for (const auto& [name, value] : request.headers) {
    req.headers().add(name, value);
    if (name == "Content-Type") content_type = value;
  }
  if (!request.body.empty()) {
    req.set_body(request.body, content_type.empty() ? "application/json" : content_type);
  }
  return req;
}

HttpHeaders copy_headers(const http::http_headers& headers) {
  HttpHeaders out;
  for (const auto& [name, value] : headers) out.emplace_back(name, value);
  return out;
}

[[noreturn]] void throw_network(const CpprestTransportOptions& options, const HttpRequest& request,
                                const std::string& what) {
  throw Unavailable("HTTP " + request.method + " " + options.server + request.target +
                    " failed: " + what + " (" + options.unreachable_hint + ")");
}

client::http_client make_client(const CpprestTransportOptions& options,
                                std::chrono::milliseconds timeout) {
  try {
    return client::http_client(web::uri(options.server), make_config(options, timeout));
  } catch (const std::exception& e) {
    throw InvalidArgument("API server URL '" + options.server + "' is not usable: " + e.what() +
                          " (expected https://host:port)");
  }
}

// The response is resolved lazily: status()/headers()/read_line() wait for the headers, and
// cancel() aborts the request whether or not the headers have arrived.
class CpprestStream : public HttpStream {
 public:
  CpprestStream(client::http_client client, pplx::task<http::http_response> pending,
                pplx::cancellation_token_source cancel, std::string what)
      : client_(std::move(client)),
        pending_(std::move(pending)),
        cancel_(std::move(cancel)),
        what_(std::move(what)) {}

  ~CpprestStream() override {
    cancel();
    try {
      pending_.wait();  // cpprestsdk's request must finish before its client goes away
    } catch (...) {
    }
  }

  int status() const override {
    resolve();
    return response_.status_code();
  }
  const HttpHeaders& headers() const override {
    resolve();
    return headers_;
  }

  // Lines are cut from chunks read off the body, as many bytes as have arrived at a time:
  // cpprestsdk's own read_line moves one byte per call through its locked buffer and runs a
  // task continuation per step, which cost more CPU than parsing the watch events.
  std::optional<std::string> read_line() override {
    if (cancelled_.load()) return std::nullopt;
    try {
      resolve();
    } catch (const Cancelled&) {
      return std::nullopt;
    }
    for (;;) {
      const size_t newline = buffered_.find('\n', scanned_);
      if (newline != std::string::npos) {
        std::string text = buffered_.substr(start_, newline - start_);
        start_ = scanned_ = newline + 1;
        if (start_ == buffered_.size()) {
          buffered_.clear();
          start_ = scanned_ = 0;
        }
        if (!text.empty() && text.back() == '\r') text.pop_back();
        return text;
      }
      scanned_ = buffered_.size();
      bool more = false;
      try {
        more = read_some();
      } catch (const std::exception& e) {
        if (cancelled_.load()) return std::nullopt;
        throw Unavailable(what_ + ": stream broke: " + e.what());
      }
      if (cancelled_.load()) return std::nullopt;
      if (!more) {  // the end: what is left is the last line
        if (start_ == buffered_.size()) return std::nullopt;
        std::string text = buffered_.substr(start_);
        buffered_.clear();
        start_ = scanned_ = 0;
        if (!text.empty() && text.back() == '\r') text.pop_back();
        return text;
      }
    }
  }

  void cancel() override {
    if (!cancelled_.exchange(true)) cancel_.cancel();
  }

 private:
  // Waits for the headers. Throws Cancelled after cancel(), Unavailable on network failure.
  void resolve() const {
    MutexLock lock(mu_);
    if (resolved_) return;
    try {
      response_ = pending_.get();
      headers_ = copy_headers(response_.headers());
      resolved_ = true;
    } catch (const std::exception& e) {
      if (cancelled_.load()) throw Cancelled(what_ + ": cancelled");
      throw Unavailable(what_ + " failed: " + e.what() + " (is the API server reachable?)");
    }
  }

  // Appends what has arrived of the body to buffered_, waiting for at least one byte; false at
  // the end of the body. Throws when the stream fails.
  bool read_some() {
    auto buffer = response_.body().streambuf();
    size_t available = buffer.in_avail();
    if (available == 0) {
      if (buffer.getc().get() == decltype(buffer)::traits::eof()) return false;
      available = std::max<size_t>(buffer.in_avail(), 1);
    }
    if (start_ > 0 && start_ * 2 >= buffered_.size()) {  // drop the lines already returned
      buffered_.erase(0, start_);
      scanned_ -= start_;
      start_ = 0;
    }
    const size_t old_size = buffered_.size();
    buffered_.resize(old_size + available);
    const size_t got =
        buffer.getn(reinterpret_cast<uint8_t*>(buffered_.data() + old_size), available).get();
    buffered_.resize(old_size + got);
    return got > 0;
  }

  client::http_client client_;  // keeps the connection pool alive while streaming
  pplx::task<http::http_response> pending_;
  pplx::cancellation_token_source cancel_;
  const std::string what_;
  std::atomic<bool> cancelled_{false};
  mutable Mutex mu_;
  mutable bool resolved_ GUARDED_BY(mu_) = false;
  mutable http::http_response response_;  // set once resolved_
  mutable HttpHeaders headers_;           // set once resolved_
  std::string buffered_;  // reader thread only: body bytes read, from start_ not yet returned
  size_t start_ = 0;      // reader thread only: where the next line starts in buffered_
  size_t scanned_ = 0;    // reader thread only: buffered_ before this holds no newline after start_
};

}  // namespace

bool set_io_threads(size_t threads) {
  try {
    crossplat::threadpool::initialize_with_threads(std::max<size_t>(threads, 1));
    return true;
  } catch (const std::exception&) {
    return false;  // already running
  }
}

struct CpprestTransport::Impl {
  CpprestTransportOptions options;
  client::http_client client;
};

CpprestTransport::CpprestTransport(CpprestTransportOptions options)
    : impl_(new Impl{options, make_client(options, options.request_timeout)}) {}

CpprestTransport::~CpprestTransport() = default;

HttpResponse CpprestTransport::request(const HttpRequest& request) {
  pplx::cancellation_token_source cancel;
  std::stop_callback abort(request.stop, [&cancel] { cancel.cancel(); });
  try {
    http::http_response response =
        impl_->client.request(make_request(request), cancel.get_token()).get();
    HttpResponse out;
    out.status = response.status_code();
    out.headers = copy_headers(response.headers());
    out.body = response.extract_utf8string(true).get();
    return out;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    if (request.stop.stop_requested()) {
      throw Cancelled("HTTP " + request.method + " " + impl_->options.server + request.target +
                      ": cancelled (leadership lost or shutting down)");
    }
    throw_network(impl_->options, request, e.what());
  }
}

std::unique_ptr<HttpStream> CpprestTransport::stream(const HttpRequest& request,
                                                     std::chrono::seconds idle_timeout) {
  // A client of its own: cpprestsdk's timeout is per client, and a watch outlives the default.
  client::http_client watch_client = make_client(impl_->options, idle_timeout);
  pplx::cancellation_token_source cancel;
  try {
    auto pending = watch_client.request(make_request(request), cancel.get_token());
    return std::make_unique<CpprestStream>(
        std::move(watch_client), std::move(pending), std::move(cancel),
        "HTTP " + request.method + " " + impl_->options.server + request.target);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw_network(impl_->options, request, e.what());
  }
}

}  // namespace longhaul::kube
