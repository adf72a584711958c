// A real Kubernetes control plane for tests (the project's envtest): etcd, kube-apiserver and
// kube-controller-manager started as child processes on free loopback ports, with fresh
// certificates and a fresh data directory, the way controller-runtime's envtest runs them for
// Kubebuilder operators. No scheduler, no kubelet, no nodes: pods stay Pending unless a test
// plays kubelet (see fake_kubelet.h).
//
// What a test gets: the API server URL, an admin ClusterConfig and kubeconfig file
// (client certificate in group system:masters), ServiceAccount tokens minted through the
// TokenRequest API with kubeconfigs for them, and small conveniences (namespaces that already
// have their `default` ServiceAccount, create-or-update of manifests through API discovery, CRDs
// waited until Established).
//
// Lifetime: stop() (or the destructor) stops every process and removes the data directory. The
// children also die with the process that started them, whatever way it ends (a crash, SIGKILL,
// an abort in a test): each child runs in its own process group with PR_SET_PDEATHSIG=SIGKILL,
// armed against the thread that forked it, so start a control plane from a thread that lives as
// long as it does (the main thread: shared_control_plane() is meant for that). Data directories
// left by a killed run are removed by the next start.
//
// Binaries (find_assets): $LONGHAUL_KUBE_ASSETS, a folder holding kube-apiserver,
// kube-controller-manager and optionally etcd, each plain or .xz-compressed; else the nearest
// `shared/kube` folder beside the source tree or one of its parents. etcd falls back to
// /usr/bin/etcd (Debian's etcd-server) or `etcd` on PATH. Compressed binaries are checked
// against the folder's SHA256SUMS (when present) and unpacked once into a cache in the build tree
// (atomic rename under a file lock, so concurrent test binaries share one copy).
//
// Thread-safety: a started ControlPlane is immutable apart from stop(); its methods may be called
// from any thread. stop() must not race with other calls.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/types.h>

#include "longhaul/kube/config.h"
#include "longhaul/kube/http_client.h"
#include "longhaul/kube/http_transport.h"

namespace longhaul::envtest {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The binaries of one control plane, unpacked and executable.
struct Assets {
  fs::path kube_apiserver;
  fs::path kube_controller_manager;
  fs::path etcd;
  fs::path origin;  // the folder they were found in, for messages
};

// How a user provides the binaries; the text a skipped test prints.
std::string assets_help();

// Finds (and, when compressed, verifies and unpacks) the binaries. Returns nullopt with the
// reason in *why when a binary is missing. Throws DataLoss when a compressed binary does not
// match SHA256SUMS, Internal when unpacking fails.
std::optional<Assets> find_assets(std::string* why);

struct ControlPlaneOptions {
  // Parent of the run's data directory ("" = $LONGHAUL_ENVTEST_DIR, else
  // <build tree>/envtest-runs, else the system temp folder).
  fs::path runs_dir;
  bool controller_manager = true;  // ServiceAccounts, garbage collection, namespace deletion
  std::chrono::seconds start_timeout{180};  // per component; generous for a loaded 2-core box
  std::vector<std::string> extra_apiserver_flags;  // e.g. "--audit-policy-file=..."
  // CRD manifests installed (and waited for) before the controller manager starts, so that its
  // garbage collector knows their kinds from the start instead of after its 30 s rediscovery.
  std::vector<fs::path> crds;
  // Writes an audit log of every write request (create, update, patch, delete; level Metadata,
  // JSON lines): how tests count an operator's writes on a real server (audit_events()).
  bool audit_writes = false;
};

class ControlPlane {
 public:
  // Starts etcd, then kube-apiserver (waits for /readyz), then kube-controller-manager (waits
  // until the `default` namespace has its `default` ServiceAccount). Throws Unavailable naming
  // the component and the tail of its log when one exits or does not become ready in time;
  // everything started so far is stopped first.
  static std::unique_ptr<ControlPlane> start(const Assets& assets,
                                             ControlPlaneOptions options = {});
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // SIGTERM to each component (controller manager, API server, etcd), SIGKILL after a short
  // grace, reaps them and removes the data directory. Idempotent.
  void stop();

  const std::string& server() const { return server_; }  // "https://127.0.0.1:<port>"
  const fs::path& work_dir() const { return dir_; }
  const fs::path& ca_file() const { return ca_file_; }
  // The admin identity (user "envtest-admin", group system:masters).
  const kube::ClusterConfig& admin_config() const { return admin_; }
  const fs::path& admin_kubeconfig() const { return admin_kubeconfig_; }
  // A client with no client-side rate limit and quick retries, for tests (User-Agent
  // "longhaul-envtest", so that audit-based write counts can tell it from the operator's).
  std::shared_ptr<kube::HttpClient> admin_client() const;
  // The log of "etcd", "kube-apiserver" or "kube-controller-manager" (last `bytes` bytes).
  std::string log_tail(std::string_view component, size_t bytes = 4000) const;
  // The process ids of the running components (etcd, API server, controller manager).
  std::vector<pid_t> pids() const;

  // The audit events (parsed JSON lines) written since `*offset` (a byte offset into the log,
  // advanced past what was read; start with 0). Empty when auditing is off.
  std::vector<json> audit_events(size_t* offset) const;
  // Makes one write request that lands in the audit log, and waits until it is there: every
  // write answered before this call is then in the log too. Returns the log offset just past it.
  size_t audit_barrier(const std::string& ns) const;

  // One raw HTTP request as admin: `target` is path plus encoded query; `content_type` is sent
  // when `body` is not empty; `accept` defaults to application/json. Returns any status.
  kube::HttpResponse request(const std::string& method, const std::string& target,
                             const std::string& body = "",
                             const std::string& content_type = "application/json",
                             const std::string& accept = "application/json") const;
  // request() that throws (the project's ApiError kinds, via kube::throw_api_error) on non-2xx
  // and returns the parsed body.
  json call(const std::string& method, const std::string& target, const json& body = nullptr,
            const std::string& content_type = "application/json") const;

  // Creates namespace `ns` when missing and waits until its `default` ServiceAccount exists
  // (pods are refused before that).
  void ensure_namespace(const std::string& ns) const;
  // Creates ServiceAccount ns/name when missing.
  void ensure_service_account(const std::string& ns, const std::string& name) const;
  // A bound token for ServiceAccount ns/name (TokenRequest API), valid for `ttl`.
  std::string mint_token(const std::string& ns, const std::string& name,
                         std::chrono::seconds ttl = std::chrono::hours(1)) const;
  // The config / a kubeconfig file (written to `path`) that authenticates with `token`.
  kube::ClusterConfig config_for_token(const std::string& token) const;
  void write_kubeconfig(const fs::path& path, const std::string& token,
                        const std::string& default_namespace = "default") const;

  // The REST path of a kind through API discovery (cached): e.g. {"rbac.authorization.k8s.io/v1",
  // "ClusterRole"} -> Resource{group, version, "clusterroles", namespaced=false}. Throws NotFound
  // for a kind the server does not serve.
  kube::Resource resource_for(const std::string& api_version, const std::string& kind) const;
  // Creates `object`, or replaces it (keeping its resourceVersion) when it exists. Namespaced
  // objects without a namespace go to `default_namespace`. `dry_run` adds ?dryRun=All. Returns
  // the server's answer; throws the ApiError of a refusal.
  json apply(json object, const std::string& default_namespace = "default",
             bool dry_run = false) const;
  // apply() of a CustomResourceDefinition manifest, then waits until it is Established (and its
  // resource is served). Throws the server's refusal or DeadlineExceeded naming the condition.
  void install_crd(const fs::path& yaml_file) const;

 private:
  ControlPlane() = default;
  struct Child {
    std::string name;
    pid_t pid = -1;
    fs::path log;
  };
  void spawn(const std::string& name, const std::vector<std::string>& argv);
  void stop_child(Child& child);
  void wait_ready(const std::string& name, const std::string& what,
                  const std::function<bool()>& ready, std::chrono::seconds timeout);
  bool exited(Child& child);

  fs::path dir_;
  std::string server_;
  fs::path ca_file_;
  kube::ClusterConfig admin_;
  fs::path admin_kubeconfig_;
  fs::path audit_log_;
  std::shared_ptr<kube::HttpTransport> transport_;
  std::vector<Child> children_;  // in start order
  bool stopped_ = false;
};

// YAML documents of a manifest file as JSON objects (empty documents dropped). Throws NotFound /
// InvalidArgument naming the file.
std::vector<json> load_manifests(const fs::path& path);
std::vector<json> parse_manifests(const std::string& yaml_text, const std::string& origin);

// The project's CRD manifests (<source>/crds/*.yaml).
std::vector<fs::path> project_crds();

// The process-wide control plane with the project's CRDs installed, started on the first call
// and stopped when the process exits (its children die with it also on a crash). Returns nullptr
// with the reason (assets_help()) in *why when the binaries are missing; throws when they are
// present but the plane fails to start (that is a failure, not a skip). Call it from the main
// thread (see PR_SET_PDEATHSIG above).
ControlPlane* shared_control_plane(std::string* why);

// The source tree ($LONGHAUL_SOURCE_DIR, else the one this library was built from).
fs::path source_dir();

}  // namespace longhaul::envtest
