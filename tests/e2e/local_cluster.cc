// A whole longhaul deployment on one machine (see local_cluster.h).
#include "longhaul/e2e/local_cluster.h"

#include <cctype>
#include <csignal>
#include <cstring>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <longhaul/base/error.h>
#include <longhaul/base/log.h>
#include <longhaul/kubelet/pod_command.h>

#include "longhaul/testing/manifests.h"

namespace longhaul::e2e {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

json yaml_to_json(const YAML::Node& node) { return longhaul::testing::yaml_to_json(node); }

std::vector<json> load_manifests(const fs::path& path) {
  return longhaul::testing::load_manifests(path);
}

kube::Resource resource_for(const json& object) {
  const std::string api_version = object.value("apiVersion", "");
  const std::string kind = object.value("kind", "");
  if (api_version.empty() || kind.empty()) {
    throw InvalidArgument("object " +
                          object.value(json::json_pointer("/metadata/name"), std::string()) +
                          " has no apiVersion or kind");
  }
  if (kind == "TrainingJob") return kube::resources::kTrainingJobs;
  kube::Resource r;
  const size_t slash = api_version.find('/');
  r.group = slash == std::string::npos ? "" : api_version.substr(0, slash);
  r.version = slash == std::string::npos ? api_version : api_version.substr(slash + 1);
  r.kind = kind;
  r.plural = kind;
  for (char& c : r.plural) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.plural += "s";
  r.namespaced = kind != "Namespace" && kind != "Node" && kind != "PersistentVolume";
  return r;
}

// ---- ChildProcess ----

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const fs::path& log,
                           std::optional<std::vector<std::string>> env) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  if (env) {
    for (std::string& e : *env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
  }
  const std::string log_path = log.string();
  const pid_t pid = ::fork();
  if (pid < 0) throw Unavailable(std::string("fork for ") + argv[0] + ": " + std::strerror(errno));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);
    int fd = ::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */);
    if (env) {
      ::execve(cargv[0], cargv.data(), cenv.data());
    } else {
      ::execv(cargv[0], cargv.data());
    }
    _exit(127);
  }
  ::setpgid(pid, pid);
  pid_ = pid;
}

ChildProcess::~ChildProcess() { stop(); }

bool ChildProcess::running() {
  if (exit_code_ || pid_ < 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Polls: a child has no event to wait on with a deadline besides SIGCHLD, which belongs to
  // the embedding program.
  while (running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  if (running()) return std::nullopt;
  return exit_code_;
}

int ChildProcess::stop(std::chrono::milliseconds grace) {
  if (pid_ < 0) return -1;
  if (!running()) return *exit_code_;
  ::kill(-pid_, SIGTERM);
  if (!wait(grace)) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    exit_code_ = 128 + SIGKILL;
  }
  return *exit_code_;
}

// ---- LocalCluster ----

LocalCluster::LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {
  options_.root = fs::absolute(options_.root);
}

LocalCluster::~LocalCluster() { stop(); }

fs::path LocalCluster::claim_dir(const std::string& ns, const std::string& claim) const {
  return kubelet::claim_directory(options_.root, ns, claim);
}

void LocalCluster::start() {
  if (started_) throw FailedPrecondition("LocalCluster::start() called twice");
  started_ = true;
  fs::create_directories(options_.root / "logs");
  if (!fs::exists(options_.operator_binary)) {
    throw NotFound("operator binary " + options_.operator_binary.string() +
                   " does not exist: build the longhaul-operator target");
  }
  kube::ClusterConfig cfg;
  if (options_.external_api) {
    cfg = *options_.external_api;
  } else {
    fakeapi::Options so;
    so.port = options_.api_port;
    so.bookmark_interval = 5s;
    server_ = std::make_unique<fakeapi::FakeApiServer>(so);
    server_->start();
    server_->write_kubeconfig(kubeconfig());
    cfg.server = server_->url();
    cfg.source = "local cluster";
  }
  kube::HttpClientOptions co;
  co.qps = 0;
  co.initial_backoff = 50ms;
  co.user_agent = "longhaul-local-cluster";
  api_config_ = cfg;
  client_ = std::make_shared<kube::HttpClient>(cfg, co);

  kubelet::KubeletOptions ko;
  ko.root = options_.root;
  ko.nodes = options_.nodes;
  ko.bin_dirs = options_.bin_dirs;
  ko.on_log_line = options_.on_log_line;
  ko.stop_grace = options_.stop_grace;
  ko.resync = 500ms;
  ko.ns = options_.watch_namespace;
  kubelet_ = std::make_unique<kubelet::LocalKubelet>(client_, ko);
  kubelet_->start();

  std::vector<std::string> argv = {options_.operator_binary.string(),
                                   "--kubeconfig",
                                   kubeconfig().string(),
                                   "--no-leader-elect",
                                   "--bind-address",
                                   "127.0.0.1",
                                   "--metrics-port",
                                   "0",
                                   "--health-port",
                                   "0",
                                   "--workers",
                                   "2",
                                   "--qps",
                                   "0"};
  if (!options_.watch_namespace.empty()) {
    argv.push_back("--namespace");
    argv.push_back(options_.watch_namespace);
  }
  argv.insert(argv.end(), options_.operator_args.begin(), options_.operator_args.end());
  operator_ = std::make_unique<ChildProcess>(argv, operator_log());
  LH_LOG(INFO) << "local cluster started" << kv("api", cfg.server)
               << kv("kubeconfig", kubeconfig().string()) << kv("operator_pid", operator_->pid());
}

void LocalCluster::stop() {
  if (!started_) return;
  if (operator_) operator_->stop(options_.stop_grace);
  if (kubelet_) kubelet_->stop();
  if (client_) client_->close();
  if (server_) server_->stop();
}

json LocalCluster::apply(const json& object) {
  json o = object;
  const kube::Resource r = resource_for(o);
  std::string ns;
  if (r.namespaced) {
    ns = o["metadata"].value("namespace", std::string("default"));
    o["metadata"]["namespace"] = ns;
  }
  return client_->create(r, ns, o);
}

std::vector<json> LocalCluster::apply_file(const fs::path& manifest) {
  std::vector<json> created;
  for (const json& o : load_manifests(manifest)) created.push_back(apply(o));
  return created;
}

}  // namespace longhaul::e2e
