#include "pki.h"

#include <memory>
#include <string>

#include "longhaul/base/file.h"
#include "longhaul/testing/certificates.h"

namespace longhaul::envtest {
namespace {

using testing::cert_pem;
using testing::KeyPtr;
using testing::private_key_pem;
using testing::public_key_pem;
using testing::X509Ptr;

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

  const testing::CertificateMaker maker(
      "envtest: cannot generate the control plane's certificates");
  KeyPtr ca_key = maker.new_key();
  X509Ptr ca = maker.new_ca(ca_key.get(), "longhaul-envtest-ca", 1);
  file::write_atomically(pki.ca_crt, cert_pem(ca.get()));
  write_key(pki.ca_key, private_key_pem(ca_key.get()));

  KeyPtr serving_key = maker.new_key();
  X509Ptr serving =
      maker.new_leaf(serving_key.get(), ca.get(), ca_key.get(), "kube-apiserver", "", "serverAuth",
                     "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                     "DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1",
                     2);
  file::write_atomically(pki.serving_crt, cert_pem(serving.get()));
  write_key(pki.serving_key, private_key_pem(serving_key.get()));

  KeyPtr admin_key = maker.new_key();
  X509Ptr admin = maker.new_leaf(admin_key.get(), ca.get(), ca_key.get(), "envtest-admin",
                                 "system:masters", "clientAuth", "", 3);
  file::write_atomically(pki.admin_crt, cert_pem(admin.get()));
  write_key(pki.admin_key, private_key_pem(admin_key.get()));

  KeyPtr proxy_ca_key = maker.new_key();
  X509Ptr proxy_ca = maker.new_ca(proxy_ca_key.get(), "longhaul-envtest-front-proxy-ca", 4);
  file::write_atomically(pki.front_proxy_ca_crt, cert_pem(proxy_ca.get()));
  KeyPtr proxy_key = maker.new_key();
  X509Ptr proxy = maker.new_leaf(proxy_key.get(), proxy_ca.get(), proxy_ca_key.get(),
                                 "front-proxy-client", "", "clientAuth", "", 5);
  file::write_atomically(pki.front_proxy_client_crt, cert_pem(proxy.get()));
  write_key(pki.front_proxy_client_key, private_key_pem(proxy_key.get()));

  KeyPtr sa_key = maker.new_key();
  write_key(pki.sa_key, private_key_pem(sa_key.get()));
  file::write_atomically(pki.sa_pub, public_key_pem(sa_key.get()));
  return pki;
}

}  // namespace longhaul::envtest
