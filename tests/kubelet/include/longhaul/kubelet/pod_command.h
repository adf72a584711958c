// How the local kubelet turns a Pod into a local process: which program, which arguments, which
// environment, which working directory — with the container world mapped onto one machine:
//
//  - Program: the first container's `command` + `args` (Kubernetes semantics: `command` replaces
//    the image's ENTRYPOINT, `args` its CMD). With no `command`, the entrypoint is the image's
//    repository basename without tag or digest (`ghcr.io/longhaul-dev/longhaul-worker:0.1.0` ->
//    `longhaul-worker`, as longhaul's images declare), unless `entrypoints` maps that basename
//    (or the full image) to another command. The program is looked up in `bin_dirs`, then $PATH.
//  - Environment: `pass_env` variables of the kubelet's own environment (PATH gets `bin_dirs`
//    prepended), HOSTNAME = spec.hostname or the pod name, then the container's `env` in order:
//    `value` with $(VAR) references expanded (Kubernetes rules: $$ escapes, unknown references
//    stay as written), `valueFrom.fieldRef` for metadata.name/namespace/uid/labels['k']/
//    annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP/hostIP (127.0.0.1).
//    Other valueFrom sources (secrets, config maps, resources) are reported in `warnings`.
//  - Volumes: each volumeMount of the container gets a local directory: a persistentVolumeClaim
//    -> `<root>/pvc/<namespace>/<claimName>` (shared by every pod that mounts the claim), an
//    emptyDir -> `<pod_dir>/volumes/<volume>`, a hostPath -> its path. Programs see the local
//    directory *instead of the mountPath*: every occurrence of the mountPath as a whole path
//    prefix in command, args, env values and workingDir is replaced by the local directory
//    (`/logdir` -> `/tmp/x/pvc/default/j-logdir`, `--logdir=/logdir/run` -> `--logdir=/tmp/x/pvc/
//    default/j-logdir/run`; `/logdirs` is left alone). LONGHAUL_LOGDIR=/logdir, which the
//    operator sets, becomes the shared claim directory that way. Other volume types are
//    reported in `warnings` and not mapped.
//  - Network: every pod runs on 127.0.0.1. Host names `<pod>.<service>.<ns>.svc` do not resolve
//    locally, so TF_CONFIG's cluster addresses and LONGHAUL_CHIEF_ADDRESS are rewritten from
//    `host:port` to `127.0.0.1:<local port>`, where the local port is assigned per distinct
//    `host:port` by `PortMap` (the same for every pod of the kubelet, so all replicas agree),
//    and LONGHAUL_HOST_OVERRIDE=127.0.0.1 is set (before the container's env, which may
//    override it): longhaul-worker binds its Gloo transport to that host (worker/distributed).
//  - Working directory: the rewritten workingDir, else `pod_dir`.
//
// Thread-safety: the functions are pure; PortMap is safe for concurrent use.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/base/mutex.h"

namespace longhaul::kubelet {

using json = nlohmann::json;

// Stable local ports for cluster addresses.
class PortMap {
 public:
  // base 0: each new address gets a free ephemeral port of 127.0.0.1 (bound and released);
  // otherwise base, base+1, ... in order of first use.
  explicit PortMap(int base = 0) : next_(base) {}
  // The local port of "host:port" (assigned on first use).
  int port_for(const std::string& address);
  // "127.0.0.1:<port_for(address)>"; an address without a port is returned unchanged.
  std::string local_address(const std::string& address);

 private:
  longhaul::Mutex mu_;
  int next_ GUARDED_BY(mu_);
  std::map<std::string, int> ports_ GUARDED_BY(mu_);
};

struct CommandOptions {
  std::filesystem::path root;     // <root>/pvc/<ns>/<claim>
  std::filesystem::path pod_dir;  // the pod's own folder (emptyDir volumes, default cwd)
  std::vector<std::filesystem::path> bin_dirs;
  std::map<std::string, std::string> entrypoints;  // image basename (or full image) -> command
  // The node-level variables a container runtime would give every container on this machine.
  // OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE pin the BLAS kernels on hosts whose CPU an older
  // OpenBLAS misdetects (a node image sets them for its containers): without them a pod would
  // round differently from a process started on the same host (tests/kubelet/README.md).
  std::vector<std::string> pass_env = {"PATH",
                                       "HOME",
                                       "USER",
                                       "LANG",
                                       "LC_ALL",
                                       "TMPDIR",
                                       "TZ",
                                       "LONGHAUL_LOG_LEVEL",
                                       "OMP_NUM_THREADS",
                                       "OPENBLAS_CORETYPE",
                                       "OPENBLAS_L2_SIZE"};
  std::string pod_ip = "127.0.0.1";
  PortMap* ports = nullptr;  // null: addresses are not rewritten
};

struct VolumeMapping {
  std::string volume;
  std::string mount_path;  // inside the "container"
  std::filesystem::path local;
};

struct PodCommand {
  std::string container;          // the container's name
  std::vector<std::string> argv;  // argv[0] is the resolved program path (or the name as given
                                  // when it cannot be found: exec then fails with 127)
  std::vector<std::pair<std::string, std::string>> env;  // in order; later entries win
  std::filesystem::path working_dir;
  std::vector<VolumeMapping> volumes;  // directories to create before starting
  std::vector<std::string> warnings;   // what could not be mapped, for the pod's log
};

// Builds the command of the pod's first container. Throws InvalidArgument naming the pod and
// field when the pod has no container or neither a command nor an image.
PodCommand build_pod_command(const json& pod, const CommandOptions& options);

// The variables `options.pass_env` takes from this process's environment, as build_pod_command
// sets them first for every pod (PATH with `bin_dirs` prepended). A process started with exactly
// these runs in a pod's host environment (the end-to-end reference runs do).
std::vector<std::pair<std::string, std::string>> passed_host_environment(
    const CommandOptions& options);

// The image's repository basename: "ghcr.io/a/longhaul-worker:0.1" -> "longhaul-worker".
std::string image_basename(const std::string& image);

// Replaces `mount_path` as a whole path prefix inside `text` (see the file comment).
std::string replace_mount_path(const std::string& text, const std::string& mount_path,
                               const std::string& local);

// Expands $(VAR) references against `vars` with Kubernetes' rules.
std::string expand_references(const std::string& text,
                              const std::map<std::string, std::string>& vars);

// TF_CONFIG with every cluster address mapped through `ports` (the JSON is returned unchanged
// when it does not parse).
std::string rewrite_tf_config(const std::string& tf_config, PortMap& ports);

// The local directory of a claim: <root>/pvc/<namespace>/<claim>.
std::filesystem::path claim_directory(const std::filesystem::path& root, const std::string& ns,
                                      const std::string& claim);

}  // namespace longhaul::kubelet
