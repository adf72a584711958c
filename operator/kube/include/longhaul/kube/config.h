// Where the API server is and how to authenticate to it: in-cluster service-account config and
// kubeconfig files (parsed with yaml-cpp), plus TokenSource, which follows a rotating token file.
//
// Errors: InvalidArgument / NotFound whose message names the kubeconfig path (or in-cluster file)
// and the missing or malformed field, e.g.
//   "kubeconfig /home/a/.kube/config: context 'prod' names cluster 'p' which has no 'server'".
//
// Thread-safety: ClusterConfig is a value. TokenSource is safe for concurrent use.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

#include <sys/types.h>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/cpprest_transport.h"

namespace longhaul::kube {

struct ClusterConfig {
  std::string server;      // "https://10.96.0.1:443"
  TlsOptions tls;          // CA, client certificate, insecure_skip_tls_verify
  std::string token;       // a fixed bearer token, or
  std::string token_file;  // a token file re-read when it changes (bound service-account tokens)
  std::string default_namespace = "default";
  std::string source;  // "in-cluster" or "kubeconfig <path> context <name>", for messages
};

struct InClusterPaths {
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

// True when KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are set.
bool running_in_cluster();

// The pod's service-account config: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT,
// the token file (kept as a file so rotation is followed), the CA and the namespace file.
// Throws FailedPrecondition when the environment is not set, NotFound when the token or CA is
// missing.
ClusterConfig load_in_cluster_config(const InClusterPaths& paths = {});

// Parses a kubeconfig. `path` "" means $KUBECONFIG (first entry of a colon-separated list) or
// ~/.kube/config; `context` "" means current-context. Relative file references resolve against
// the kubeconfig's folder. Throws NotFound for a missing file or context, InvalidArgument for a
// malformed document or missing field.
ClusterConfig load_kubeconfig(const std::string& path = "", const std::string& context = "");

// The usual order: an explicit kubeconfig path wins; else in-cluster when running in a pod; else
// $KUBECONFIG / ~/.kube/config.
ClusterConfig load_default_config(const std::string& kubeconfig_path = "",
                                  const std::string& context = "");

// Supplies the bearer token: a fixed token, or the content of a file re-read whenever the file
// changes (checked with stat() on each call, so a rotated token is used on the next request).
class TokenSource {
 public:
  TokenSource(std::string fixed_token, std::string token_file);
  // The current token ("" when none is configured). Throws NotFound when the file vanished and
  // no earlier token was read.
  std::string token();
  // Forces a re-read on the next call (after a 401).
  void invalidate();

 private:
  Mutex mu_;
  const std::string fixed_token_;
  const std::string token_file_;
  std::string cached_ GUARDED_BY(mu_);
  struct FileStamp {
    ino_t inode = 0;
    long long mtime_ns = 0;
    long long size = -1;
    bool operator==(const FileStamp&) const = default;
  } stamp_ GUARDED_BY(mu_);
};

// Builds the transport options (server + TLS) of a config.
CpprestTransportOptions transport_options(const ClusterConfig& config);

}  // namespace longhaul::kube
