#include "pki.h"

#include <memory>
#include <string>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"

namespace longhaul::envtest {
namespace {

[[noreturn]] void openssl_failure(const std::string& step) {
  const unsigned long err = ERR_get_error();
  char text[256] = "unknown error";
  if (err != 0) ERR_error_string_n(err, text, sizeof text);
  throw Internal("envtest: cannot generate the control plane's certificates (" + step +
                 "): " + text + "; check the OpenSSL installation");
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

void add_name_entry(X509_NAME* name, const char* field, const std::string& value) {
  X509_NAME_add_entry_by_txt(name, field, MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0);
}

// A certificate for `key` with subject CN=common_name (O=organization when given), valid from an
// hour ago (clock skew between processes) for a year.
X509Ptr new_cert(EVP_PKEY* key, const std::string& common_name, const std::string& organization,
                 long serial) {
  X509Ptr cert(X509_new());
  if (!cert) openssl_failure("X509_new");
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

X509Ptr new_ca(EVP_PKEY* key, const std::string& common_name, long serial) {
  X509Ptr ca = new_cert(key, common_name, "", serial);
  X509_set_issuer_name(ca.get(), X509_get_subject_name(ca.get()));
  add_extension(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE");
  add_extension(ca.get(), ca.get(), NID_key_usage, "critical,digitalSignature,keyCertSign,cRLSign");
  add_extension(ca.get(), ca.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(ca.get(), key, EVP_sha256()) == 0) openssl_failure("signing CA " + common_name);
  return ca;
}

// A leaf certificate signed by `ca`; `usage` is "serverAuth" or "clientAuth".
X509Ptr new_leaf(EVP_PKEY* key, X509* ca, EVP_PKEY* ca_key, const std::string& common_name,
                 const std::string& organization, const std::string& usage,
                 const std::string& subject_alt_names, long serial) {
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
    openssl_failure("signing certificate " + common_name);
  }
  return cert;
}

std::string bio_string(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

std::string cert_pem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  return bio_string(bio);
}

std::string private_key_pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  return bio_string(bio);
}

std::string public_key_pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PUBKEY(bio, key);
  return bio_string(bio);
}

void write_key(const std::filesystem::path& path, const std::string& pem) {
  file::write_atomically(path, pem);
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

}  // namespace

Pki write_pki(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  Pki pki;
  pki.ca_crt = dir / "ca.crt";
  pki.ca_key = dir / "ca.key";
  pki.serving_crt = dir / "apiserver.crt";
  pki.serving_key = dir / "apiserver.key";
  pki.admin_crt = dir / "admin.crt";
  pki.admin_key = dir / "admin.key";
  pki.front_proxy_ca_crt = dir / "front-proxy-ca.crt";
  pki.front_proxy_client_crt = dir / "front-proxy-client.crt";
  pki.front_proxy_client_key = dir / "front-proxy-client.key";
  pki.sa_key = dir / "sa.key";
  pki.sa_pub = dir / "sa.pub";

  KeyPtr ca_key = new_key();
  X509Ptr ca = new_ca(ca_key.get(), "longhaul-envtest-ca", 1);
  file::write_atomically(pki.ca_crt, cert_pem(ca.get()));
  write_key(pki.ca_key, private_key_pem(ca_key.get()));

  KeyPtr serving_key = new_key();
  X509Ptr serving =
      new_leaf(serving_key.get(), ca.get(), ca_key.get(), "kube-apiserver", "", "serverAuth",
               "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
               "DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1",
               2);
  file::write_atomically(pki.serving_crt, cert_pem(serving.get()));
  write_key(pki.serving_key, private_key_pem(serving_key.get()));

  KeyPtr admin_key = new_key();
  X509Ptr admin = new_leaf(admin_key.get(), ca.get(), ca_key.get(), "envtest-admin",
                           "system:masters", "clientAuth", "", 3);
  file::write_atomically(pki.admin_crt, cert_pem(admin.get()));
  write_key(pki.admin_key, private_key_pem(admin_key.get()));

  KeyPtr proxy_ca_key = new_key();
  X509Ptr proxy_ca = new_ca(proxy_ca_key.get(), "longhaul-envtest-front-proxy-ca", 4);
  file::write_atomically(pki.front_proxy_ca_crt, cert_pem(proxy_ca.get()));
  KeyPtr proxy_key = new_key();
  X509Ptr proxy = new_leaf(proxy_key.get(), proxy_ca.get(), proxy_ca_key.get(),
                           "front-proxy-client", "", "clientAuth", "", 5);
  file::write_atomically(pki.front_proxy_client_crt, cert_pem(proxy.get()));
  write_key(pki.front_proxy_client_key, private_key_pem(proxy_key.get()));

  KeyPtr sa_key = new_key();
  write_key(pki.sa_key, private_key_pem(sa_key.get()));
  file::write_atomically(pki.sa_pub, public_key_pem(sa_key.get()));
  return pki;
}

}  // namespace longhaul::envtest
