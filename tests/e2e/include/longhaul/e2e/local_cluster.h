// LocalCluster: a whole longhaul deployment on one machine, for the end-to-end scenarios and the
// `longhaul-local-cluster` demo: the fake Kubernetes API server (in-process, real HTTP), the
// `longhaul-operator` binary as a child process pointed at it through a kubeconfig, and a
// LocalKubelet (in-process) that runs the pods as local processes on a few local nodes.
//
// Layout under `root`: kubeconfig (clients such as kubectl can use it while the cluster runs),
// logs/operator.log, logs/<pod>.log, pvc/<namespace>/<claim>/ (the shared logdir of a job),
// pods/<namespace>/<pod>/.
//
// Manifests are YAML (one or more documents, anchors resolved) turned into JSON and created
// through the API as `kubectl create` would: TrainingJobs, Pods, Services, ConfigMaps, Secrets,
// PersistentVolumeClaims — any apiVersion/kind whose plural is the lower-case kind + "s".
//
// Thread-safety: start()/stop() from one owning thread; the accessors return objects that are
// themselves thread-safe.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/types.h>

#include <longhaul/fakeapi/server.h>
#include <longhaul/kube/http_client.h>
#include <longhaul/kubelet/local_kubelet.h>

namespace YAML {
class Node;
}

namespace longhaul::e2e {

using json = nlohmann::json;

// YAML -> JSON with Kubernetes' scalar typing: plain scalars that read as null, bool, integer or
// float become those; quoted scalars stay strings.
json yaml_to_json(const YAML::Node& node);
// Every non-empty document of a YAML file. Throws InvalidArgument naming the file on a parse
// error, NotFound when it is missing.
std::vector<json> load_manifests(const std::filesystem::path& path);
// The collection of an object from its apiVersion and kind.
kube::Resource resource_for(const json& object);

// A child process with stdout+stderr appended to a log file, in its own process group.
class ChildProcess {
 public:
  // `env` (NAME=VALUE entries) replaces the environment when given; else it is inherited.
  ChildProcess(const std::vector<std::string>& argv, const std::filesystem::path& log,
               std::optional<std::vector<std::string>> env = std::nullopt);
  ~ChildProcess();  // stop()
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  bool running();
  // Waits for the exit up to `timeout`; the exit code (128+signal when killed), or nullopt.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // SIGTERM, SIGKILL after `grace`; reaps. Returns the exit code (128+signal when killed).
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(10));
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

struct LocalClusterOptions {
  std::filesystem::path root;
  std::filesystem::path operator_binary;        // longhaul-operator
  std::vector<std::filesystem::path> bin_dirs;  // where longhaul-worker is found
  std::vector<std::string> nodes = {"local-node-0", "local-node-1"};
  int api_port = 0;                        // 0: a free port
  std::vector<std::string> operator_args;  // appended to the operator's flags
  std::function<void(const std::string& pod, const std::string& line)> on_log_line;
  std::chrono::milliseconds stop_grace{std::chrono::seconds(10)};
  // A real API server instead of the in-process fake one: its config (the kubelet and the
  // apply() client use it) and a kubeconfig file for the operator. The operator then watches
  // only `watch_namespace` ("" = all) and the kubelet serves only that namespace. The
  // TrainingJob CRD must be installed already.
  std::optional<kube::ClusterConfig> external_api;
  std::filesystem::path external_kubeconfig;
  std::string watch_namespace;
};

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options);
  ~LocalCluster();  // stop()
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // API server, kubeconfig, kubelet, then the operator. Throws when a part cannot start.
  void start();
  // Operator (SIGTERM), kubelet (pod processes), API server; every thread joined, every child
  // reaped. Idempotent.
  void stop();

  // Creates `object` through the API (namespace "default" when it names none).
  json apply(const json& object);
  std::vector<json> apply_file(const std::filesystem::path& manifest);

  // The fake API server (not with external_api).
  fakeapi::FakeApiServer& api() { return *server_; }
  kubelet::LocalKubelet& kubelet() { return *kubelet_; }
  kube::Client& client() { return *client_; }
  // Where the API server is (the fake one's URL, or external_api), for clients of a test's own
  // such as a watch. Valid after start().
  const kube::ClusterConfig& api_config() const { return api_config_; }
  bool operator_running() { return operator_ && operator_->running(); }
  std::filesystem::path kubeconfig() const {
    return options_.external_api ? options_.external_kubeconfig : options_.root / "kubeconfig";
  }
  std::filesystem::path claim_dir(const std::string& ns, const std::string& claim) const;
  std::filesystem::path operator_log() const { return options_.root / "logs" / "operator.log"; }

 private:
  LocalClusterOptions options_;
  std::unique_ptr<fakeapi::FakeApiServer> server_;
  kube::ClusterConfig api_config_;
  std::shared_ptr<kube::HttpClient> client_;
  std::unique_ptr<kubelet::LocalKubelet> kubelet_;
  std::unique_ptr<ChildProcess> operator_;
  bool started_ = false;
};

}  // namespace longhaul::e2e
