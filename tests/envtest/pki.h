// Throw-away certificates for one envtest control plane, made with the OpenSSL API: a cluster CA,
// the API server's serving certificate for 127.0.0.1/localhost, an admin client certificate in
// group system:masters, a front-proxy CA with its client certificate (the controller manager
// needs the request-header authenticator configured), and the ServiceAccount signing keypair.
// Keys are EC P-256 (fast to generate, accepted by every component).
//
// Thread-safety: write_pki is a pure function of its arguments.
#pragma once

#include <filesystem>

namespace longhaul::envtest {

struct Pki {
  std::filesystem::path ca_crt, ca_key;
  std::filesystem::path serving_crt, serving_key;
  std::filesystem::path admin_crt, admin_key;
  std::filesystem::path front_proxy_ca_crt;
  std::filesystem::path front_proxy_client_crt, front_proxy_client_key;
  std::filesystem::path sa_key, sa_pub;
};

// Writes every file into `dir` (created if missing; keys mode 0600). Throws Internal naming the
// OpenSSL step that failed.
Pki write_pki(const std::filesystem::path& dir);

}  // namespace longhaul::envtest
