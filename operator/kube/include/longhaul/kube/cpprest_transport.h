// HttpTransport over cpprestsdk's http_client (the production transport). cpprestsdk types stay
// inside cpprest_transport.cc; this header only names the options.
//
// TLS: the server certificate is verified against `ca_file`/`ca_pem` (plus the system store) with
// hostname verification on, unless insecure_skip_tls_verify is set. A client certificate and key
// (file or PEM data) are presented when given.
//
// Thread-safety: safe for concurrent use (see http_transport.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "longhaul/kube/http_transport.h"

namespace longhaul::kube {

struct TlsOptions {
  std::string ca_file;  // PEM bundle of trusted CAs
  std::string ca_pem;   // or the bundle itself
  std::string client_cert_file;
  std::string client_cert_pem;
  std::string client_key_file;
  std::string client_key_pem;
  bool insecure_skip_tls_verify = false;
};

struct CpprestTransportOptions {
  std::string server;  // base URL, "https://10.0.0.1:443" (a path prefix is kept)
  TlsOptions tls;
  // Inactivity timeout of ordinary requests (cpprestsdk's timeout is per send/receive step).
  std::chrono::milliseconds request_timeout{30000};
  // What a network failure's message asks the reader to check.
  std::string unreachable_hint = "is the API server reachable?";
};

// Sizes cpprestsdk's process-wide I/O thread pool, which runs every request's and watch's
// network steps (its default, 40 threads, spends more CPU switching between threads than working
// when a process has a few connections on a few cores). For a program's main(), before the first
// transport exists; false (nothing changed) when the pool is already running.
bool set_io_threads(size_t threads);

class CpprestTransport : public HttpTransport {
 public:
  // Throws InvalidArgument when the server URL is malformed.
  explicit CpprestTransport(CpprestTransportOptions options);
  ~CpprestTransport() override;

  HttpResponse request(const HttpRequest& request) override;
  std::unique_ptr<HttpStream> stream(const HttpRequest& request,
                                     std::chrono::seconds idle_timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longhaul::kube
