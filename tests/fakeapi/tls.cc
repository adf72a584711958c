#include "tls.h"

#include <algorithm>

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <longhaul/base/error.h>
#include <longhaul/base/file.h>

namespace longhaul::fakeapi {
namespace {

[[noreturn]] void openssl_failure(const std::string& step) {
  unsigned long err = ERR_get_error();
  char text[256] = "unknown error";
  if (err != 0) ERR_error_string_n(err, text, sizeof(text));
  throw Internal("fake API server: cannot generate TLS material (" + step + "): " + text +
                 "; run without TLS or check the OpenSSL installation");
}

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

KeyPtr new_key() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) openssl_failure("EC key generation");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) openssl_failure("extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

X509Ptr new_cert(EVP_PKEY* key, const std::string& common_name, long serial) {
  X509Ptr cert(X509_new());
  if (!cert) openssl_failure("X509_new");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 60L * 60 * 24 * 365);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  return cert;
}

std::string to_pem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

std::string key_to_pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

bool is_ip_address(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

}  // namespace

std::unique_ptr<TlsContext> TlsContext::create(const std::filesystem::path& dir,
                                               const std::string& bind_address) {
  std::filesystem::create_directories(dir);
  KeyPtr ca_key = new_key();
  X509Ptr ca = new_cert(ca_key.get(), "longhaul-fake-apiserver-ca", 1);
  X509_set_issuer_name(ca.get(), X509_get_subject_name(ca.get()));
  add_extension(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE");
  add_extension(ca.get(), ca.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(ca.get(), ca.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(ca.get(), ca_key.get(), EVP_sha256()) == 0) openssl_failure("signing the CA");

  KeyPtr server_key = new_key();
  X509Ptr server = new_cert(server_key.get(), "longhaul-fake-apiserver", 2);
  X509_set_issuer_name(server.get(), X509_get_subject_name(ca.get()));
  std::string san = "DNS:localhost,IP:127.0.0.1,IP:::1";
  if (!bind_address.empty() && bind_address != "127.0.0.1" && bind_address != "0.0.0.0") {
    san += (is_ip_address(bind_address) ? ",IP:" : ",DNS:") + bind_address;
  }
  add_extension(server.get(), ca.get(), NID_subject_alt_name, san);
  add_extension(server.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(server.get(), ca.get(), NID_key_usage, "critical,digitalSignature,keyEncipherment");
  add_extension(server.get(), ca.get(), NID_ext_key_usage, "serverAuth");
  add_extension(server.get(), ca.get(), NID_authority_key_identifier, "keyid:always");
  if (X509_sign(server.get(), ca_key.get(), EVP_sha256()) == 0) {
    openssl_failure("signing the server certificate");
  }

  std::unique_ptr<TlsContext> tls(new TlsContext());
  tls->ca_pem_ = to_pem(ca.get());
  tls->ca_file_ = dir / "ca.crt";
  file::write_atomically(tls->ca_file_, tls->ca_pem_);
  file::write_atomically(dir / "server.crt", to_pem(server.get()));
  file::write_atomically(dir / "server.key", key_to_pem(server_key.get()));

  tls->ctx_ = SSL_CTX_new(TLS_server_method());
  if (tls->ctx_ == nullptr) openssl_failure("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(tls->ctx_, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate(tls->ctx_, server.get()) != 1 ||
      SSL_CTX_use_PrivateKey(tls->ctx_, server_key.get()) != 1 ||
      SSL_CTX_check_private_key(tls->ctx_) != 1) {
    openssl_failure("loading the server certificate");
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
