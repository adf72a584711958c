// TLS for the fake API server: a throw-away CA and a server certificate for 127.0.0.1 /
// localhost (plus the bind address), generated at start-up with OpenSSL, written as PEM files so
// clients can verify the server against the CA; and the transport that runs each connection of
// the shared HTTP server (base/http_connection.h) through TLS, over memory BIOs so every socket
// write uses send(MSG_NOSIGNAL).
//
// Thread-safety: immutable after create(); the SSL_CTX is shared by connection threads (OpenSSL
// allows SSL_new on one context from many threads).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "longhaul/base/http_connection.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace longhaul::fakeapi {

class TlsContext {
 public:
  // Generates a CA (ca.crt) and a server key/certificate (server.key, server.crt) in `dir`
  // (created if missing). Throws Internal naming the OpenSSL step that failed.
  static std::unique_ptr<TlsContext> create(const std::filesystem::path& dir,
                                            const std::string& bind_address);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* ctx() const { return ctx_; }
  // A transport for one server-side connection (http::ConnectionServer's TransportFactory).
  std::unique_ptr<http::Transport> transport() const;
  const std::filesystem::path& ca_file() const { return ca_file_; }
  const std::string& ca_pem() const { return ca_pem_; }

 private:
  TlsContext() = default;
  SSL_CTX* ctx_ = nullptr;
  std::filesystem::path ca_file_;
  std::string ca_pem_;
};

}  // namespace longhaul::fakeapi
