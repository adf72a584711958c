// Throwaway X.509 material for test servers that speak TLS: the fake API server (tests/fakeapi)
// and the real control plane's PKI (tests/envtest). EC P-256 keys, a self-signed CA, leaf
// certificates it signs for serving or client authentication, and their PEM text. Header-only;
// a target that includes it links OpenSSL::SSL, OpenSSL::Crypto and longhaul::base.
//
//   const testing::CertificateMaker maker("fake API server: cannot generate TLS material");
//   auto ca_key = maker.new_key();
//   auto ca = maker.new_ca(ca_key.get(), "test-ca", 1);
//   auto key = maker.new_key();
//   auto cert = maker.new_leaf(key.get(), ca.get(), ca_key.get(), "server", "", "serverAuth",
//                              "DNS:localhost,IP:127.0.0.1", 2);
//   write(testing::cert_pem(cert.get()), testing::private_key_pem(key.get()));
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "longhaul/base/error.h"

namespace longhaul::testing {

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

class CertificateMaker {
 public:
  // `failure` opens the message of the Internal error an OpenSSL failure throws; the step that
  // failed, OpenSSL's reason and `remedy` follow it.
  explicit CertificateMaker(std::string failure,
                            std::string remedy = "check the OpenSSL installation")
      : failure_(std::move(failure)), remedy_(std::move(remedy)) {}

  KeyPtr new_key() const {
    KeyPtr key(EVP_EC_gen("P-256"));
    if (!key) fail("EC key generation");
    return key;
  }

  // A self-signed CA certificate for `key`, subject CN=common_name, valid for a year.
  X509Ptr new_ca(EVP_PKEY* key, const std::string& common_name, long serial) const {
    X509Ptr ca = new_cert(key, common_name, "", serial);
    X509_set_issuer_name(ca.get(), X509_get_subject_name(ca.get()));
    add_extension(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE");
    add_extension(ca.get(), ca.get(), NID_key_usage,
                  "critical,digitalSignature,keyCertSign,cRLSign");
    add_extension(ca.get(), ca.get(), NID_subject_key_identifier, "hash");
    if (X509_sign(ca.get(), key, EVP_sha256()) == 0) fail("signing CA " + common_name);
    return ca;
  }

  // A leaf certificate for `key` signed by `ca`: subject CN=common_name (O=organization when
  // given), `usage` "serverAuth" or "clientAuth", subjectAltName `subject_alt_names` when given
  // ("DNS:localhost,IP:127.0.0.1").
  X509Ptr new_leaf(EVP_PKEY* key, X509* ca, EVP_PKEY* ca_key, const std::string& common_name,
                   const std::string& organization, const std::string& usage,
                   const std::string& subject_alt_names, long serial) const {
    X509Ptr cert = new_cert(key, common_name, organization, serial);
    X509_set_issuer_name(cert.get(), X509_get_subject_name(ca));
    if (!subject_alt_names.empty()) {
      add_extension(cert.get(), ca, NID_subject_alt_name, subject_alt_names);
    }
    add_extension(cert.get(), ca, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), ca, NID_key_usage, "critical,digitalSignature,keyEncipherment");
    add_extension(cert.get(), ca, NID_ext_key_usage, usage);
    add_extension(cert.get(), ca, NID_authority_key_identifier, "keyid:always");
    if (X509_sign(cert.get(), ca_key, EVP_sha256()) == 0) {
      fail("signing certificate " + common_name);
    }
    return cert;
  }

  // Throws the Internal error for `step`, with OpenSSL's reason.
  [[noreturn]] void fail(const std::string& step) const {
    const unsigned long err = ERR_get_error();
    char text[256] = "unknown error";
    if (err != 0) ERR_error_string_n(err, text, sizeof text);
    throw Internal(failure_ + " (" + step + "): " + text + "; " + remedy_);
  }

 private:
  // Valid from an hour ago (clock skew between processes) for a year.
  X509Ptr new_cert(EVP_PKEY* key, const std::string& common_name, const std::string& organization,
                   long serial) const {
    X509Ptr cert(X509_new());
    if (!cert) fail("X509_new");
    X509_set_version(cert.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 60L * 60 * 24 * 365);
    X509_set_pubkey(cert.get(), key);
    X509_NAME* name = X509_get_subject_name(cert.get());
    if (!organization.empty()) add_name_entry(name, "O", organization);
    add_name_entry(name, "CN", common_name);
    return cert;
  }

  static void add_name_entry(X509_NAME* name, const char* field, const std::string& value) {
    X509_NAME_add_entry_by_txt(name, field, MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0);
  }

  void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) const {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (ext == nullptr) fail("extension " + value);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  std::string failure_;
  std::string remedy_;
};

// The PEM text of a memory BIO's contents; frees the BIO.
inline std::string take_bio_string(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

inline std::string cert_pem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  return take_bio_string(bio);
}

inline std::string private_key_pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  return take_bio_string(bio);
}

inline std::string public_key_pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PUBKEY(bio, key);
  return take_bio_string(bio);
}

}  // namespace longhaul::testing
