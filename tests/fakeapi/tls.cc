#include "tls.h"

#include <algorithm>

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <longhaul/base/error.h>
#include <longhaul/base/file.h>

#include "longhaul/testing/certificates.h"

namespace longhaul::fakeapi {
namespace {

using longhaul::testing::KeyPtr;
using longhaul::testing::X509Ptr;

bool is_ip_address(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

}  // namespace

std::unique_ptr<TlsContext> TlsContext::create(const std::filesystem::path& dir,
                                               const std::string& bind_address) {
  std::filesystem::create_directories(dir);
  const longhaul::testing::CertificateMaker maker(
      "fake API server: cannot generate TLS material",
      "run without TLS or check the OpenSSL installation");
  KeyPtr ca_key = maker.new_key();
  X509Ptr ca = maker.new_ca(ca_key.get(), "longhaul-fake-apiserver-ca", 1);
  KeyPtr server_key = maker.new_key();
  std::string san = "DNS:localhost,IP:127.0.0.1,IP:::1";
  if (!bind_address.empty() && bind_address != "127.0.0.1" && bind_address != "0.0.0.0") {
    san += (is_ip_address(bind_address) ? ",IP:" : ",DNS:") + bind_address;
  }
  X509Ptr server = maker.new_leaf(server_key.get(), ca.get(), ca_key.get(),
                                  "longhaul-fake-apiserver", "", "serverAuth", san, 2);

  std::unique_ptr<TlsContext> tls(new TlsContext());
  tls->ca_pem_ = longhaul::testing::cert_pem(ca.get());
  tls->ca_file_ = dir / "ca.crt";
  file::write_atomically(tls->ca_file_, tls->ca_pem_);
  file::write_atomically(dir / "server.crt", longhaul::testing::cert_pem(server.get()));
  file::write_atomically(dir / "server.key", longhaul::testing::private_key_pem(server_key.get()));

  tls->ctx_ = SSL_CTX_new(TLS_server_method());
  if (tls->ctx_ == nullptr) maker.fail("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(tls->ctx_, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate(tls->ctx_, server.get()) != 1 ||
      SSL_CTX_use_PrivateKey(tls->ctx_, server_key.get()) != 1 ||
      SSL_CTX_check_private_key(tls->ctx_) != 1) {
    maker.fail("loading the server certificate");
  }
  return tls;
}

namespace {

// One connection's TLS over memory BIOs: the socket is read and written by this class, so
// every write goes through send(MSG_NOSIGNAL).
class TlsTransport : public http::Transport {
 public:
  explicit TlsTransport(SSL_CTX* ctx) : ssl_(SSL_new(ctx)) {}
  ~TlsTransport() override {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }

  bool handshake(int fd) override {
    if (ssl_ == nullptr) return false;
    SSL_set_bio(ssl_, BIO_new(BIO_s_mem()), BIO_new(BIO_s_mem()));
    SSL_set_accept_state(ssl_);
    for (;;) {
      int r = SSL_do_handshake(ssl_);
      if (!flush(fd)) return false;
      if (r == 1) return true;
      if (SSL_get_error(ssl_, r) != SSL_ERROR_WANT_READ) {
        ERR_clear_error();
        return false;
      }
      if (!receive(fd)) return false;
    }
  }

  ReadStatus read(int fd, std::string& in) override {
    // Records that arrived together with earlier ones (e.g. a request right behind the
    // handshake) are already in the read BIO: decrypt those before waiting on the socket.
    if (BIO_ctrl_pending(SSL_get_rbio(ssl_)) > 0) {
      ReadStatus status = drain(fd, in);
      if (status != ReadStatus::kNoData) return status;
    }
    if (!receive(fd)) return ReadStatus::kEof;
    return drain(fd, in);
  }

  bool write(int fd, std::string_view data) override {
    while (!data.empty()) {
      int n =
          SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 20)));
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
      if (!flush(fd)) return false;
    }
    return true;
  }

 private:
  // Blocks for the next bytes from the socket and hands them to the read BIO; false on EOF.
  bool receive(int fd) {
    std::string raw;
    if (http::Transport::read(fd, raw) != ReadStatus::kData) return false;
    BIO_write(SSL_get_rbio(ssl_), raw.data(), static_cast<int>(raw.size()));
    return true;
  }

  // Sends what the write BIO holds.
  bool flush(int fd) {
    BIO* wbio = SSL_get_wbio(ssl_);
    char buf[16384];
    while (BIO_ctrl_pending(wbio) > 0) {
      int n = BIO_read(wbio, buf, sizeof(buf));
      if (n <= 0) break;
      if (!http::send_all(fd, std::string_view(buf, static_cast<size_t>(n)))) return false;
    }
    return true;
  }

  // Decrypts what the read BIO holds into `in`.
  ReadStatus drain(int fd, std::string& in) {
    char buf[16384];
    bool got = false;
    for (;;) {
      int m = SSL_read(ssl_, buf, sizeof(buf));
      if (m > 0) {
        in.append(buf, static_cast<size_t>(m));
        got = true;
        continue;
      }
      int err = SSL_get_error(ssl_, m);
      if (!flush(fd)) return ReadStatus::kEof;  // e.g. a key update answer
      if (err == SSL_ERROR_WANT_READ) break;
      ERR_clear_error();
      return got ? ReadStatus::kData : ReadStatus::kEof;  // close_notify or a protocol error
    }
    return got ? ReadStatus::kData : ReadStatus::kNoData;
  }

  SSL* ssl_;
};

}  // namespace

std::unique_ptr<http::Transport> TlsContext::transport() const {
  return std::make_unique<TlsTransport>(ctx_);
}

TlsContext::~TlsContext() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

}  // namespace longhaul::fakeapi
