#include "longhaul/envtest/control_plane.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/testing/loopback.h"
#include "longhaul/testing/manifests.h"
#include "pki.h"

namespace longhaul::envtest {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Thrown when a component exits during start-up because its port was taken between the probe
// and its bind: start() then retries on fresh ports.
struct PortTaken : Unavailable {
  using Unavailable::Unavailable;
};

fs::path default_runs_dir() {
  if (const char* d = std::getenv("LONGHAUL_ENVTEST_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* d = std::getenv("LONGHAUL_BINARY_DIR"); d != nullptr && *d != '\0') {
    return fs::path(d) / "envtest-runs";
  }
  return fs::temp_directory_path() / "longhaul-envtest";
}

// Removes the data directories of runs whose process is gone (killed before it could clean up).
void remove_stale_runs(const fs::path& runs_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(runs_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("plane-", 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + 6));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
  }
}

fs::path fresh_run_dir(const fs::path& runs_dir) {
  fs::create_directories(runs_dir);
  remove_stale_runs(runs_dir);
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0;; ++attempt) {
    const fs::path dir =
        runs_dir / ("plane-" + std::to_string(::getpid()) + "-" + std::to_string(rng() % 100000));
    if (fs::create_directory(dir)) return dir;
    if (attempt > 100)
      throw Internal("envtest: cannot create a run directory in " + runs_dir.string());
  }
}

std::string read_tail(const fs::path& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(bytes) ? size - bytes : 0;
  in.seekg(from);
  std::string out(static_cast<size_t>(size - from), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}

std::string kubeconfig_yaml(const std::string& server, const fs::path& ca, const std::string& user,
                            const std::string& credentials, const std::string& ns) {
  std::ostringstream out;
  out << "apiVersion: v1\nkind: Config\n"
      << "clusters:\n- name: envtest\n  cluster:\n    server: " << server
      << "\n    certificate-authority: " << ca.string() << "\n"
      << "users:\n- name: " << user << "\n  user:\n"
      << credentials
      << "contexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: " << user
      << "\n    namespace: " << ns << "\n"
      << "current-context: envtest\n";
  return out.str();
}

std::string object_name(const json& object) {
  return object.value(json::json_pointer("/metadata/name"), std::string());
}

}  // namespace

// ---- manifests ----

std::vector<json> parse_manifests(const std::string& yaml_text, const std::string& origin) {
  return testing::parse_manifests(yaml_text, origin);
}

std::vector<json> load_manifests(const fs::path& path) { return testing::load_manifests(path); }

// ---- start and stop ----

std::unique_ptr<ControlPlane> ControlPlane::start(const Assets& assets,
                                                  ControlPlaneOptions options) {
  const fs::path runs_dir = options.runs_dir.empty() ? default_runs_dir() : options.runs_dir;
  for (int attempt = 1;; ++attempt) {
    std::unique_ptr<ControlPlane> plane(new ControlPlane());
    plane->dir_ = fresh_run_dir(runs_dir);
    try {
      const Pki pki = write_pki(plane->dir_ / "pki");
      const int etcd_port = testing::free_loopback_port();
      int etcd_peer_port = testing::free_loopback_port();
      while (etcd_peer_port == etcd_port) etcd_peer_port = testing::free_loopback_port();
      int api_port = testing::free_loopback_port();
      while (api_port == etcd_port || api_port == etcd_peer_port) {
        api_port = testing::free_loopback_port();
      }
      const std::string etcd_url = "http://127.0.0.1:" + std::to_string(etcd_port);
      plane->server_ = "https://127.0.0.1:" + std::to_string(api_port);
      plane->ca_file_ = pki.ca_crt;

      plane->admin_.server = plane->server_;
      plane->admin_.tls.ca_file = pki.ca_crt.string();
      plane->admin_.tls.client_cert_file = pki.admin_crt.string();
      plane->admin_.tls.client_key_file = pki.admin_key.string();
      plane->admin_.source = "envtest admin (" + plane->dir_.string() + ")";
      plane->admin_kubeconfig_ = plane->dir_ / "admin.kubeconfig";
      file::write_atomically(
          plane->admin_kubeconfig_,
          kubeconfig_yaml(plane->server_, pki.ca_crt, "envtest-admin",
                          "    client-certificate: " + pki.admin_crt.string() +
                              "\n    client-key: " + pki.admin_key.string() + "\n",
                          "default"));
      kube::CpprestTransportOptions transport_options = kube::transport_options(plane->admin_);
      transport_options.request_timeout = 60s;
      plane->transport_ = std::make_shared<kube::CpprestTransport>(transport_options);

      // etcd: one member, no peers, its data in the run directory.
      plane->spawn(
          "etcd",
          {assets.etcd.string(), "--name=envtest", "--data-dir=" + (plane->dir_ / "etcd").string(),
           "--listen-client-urls=" + etcd_url, "--advertise-client-urls=" + etcd_url,
           "--listen-peer-urls=http://127.0.0.1:" + std::to_string(etcd_peer_port),
           "--initial-advertise-peer-urls=http://127.0.0.1:" + std::to_string(etcd_peer_port),
           "--initial-cluster=envtest=http://127.0.0.1:" + std::to_string(etcd_peer_port),
           "--unsafe-no-fsync=true", "--log-level=warn"});
      plane->wait_ready(
          "etcd", "GET " + etcd_url + "/health",
          [&] {
            const auto health = testing::http_get(etcd_port, "/health");
            return health.status == 200 && health.body.find("true") != std::string::npos;
          },
          options.start_timeout);

      std::vector<std::string> apiserver = {
          assets.kube_apiserver.string(),
          "--etcd-servers=" + etcd_url,
          "--bind-address=127.0.0.1",
          "--advertise-address=127.0.0.1",
          "--secure-port=" + std::to_string(api_port),
          "--endpoint-reconciler-type=none",
          "--cert-dir=" + (plane->dir_ / "apiserver-certs").string(),
          "--tls-cert-file=" + pki.serving_crt.string(),
          "--tls-private-key-file=" + pki.serving_key.string(),
          "--client-ca-file=" + pki.ca_crt.string(),
          "--authorization-mode=Node,RBAC",
          "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
          "--service-account-key-file=" + pki.sa_pub.string(),
          "--service-account-signing-key-file=" + pki.sa_key.string(),
          "--service-cluster-ip-range=10.96.0.0/24",
          "--allow-privileged=true",
          "--requestheader-client-ca-file=" + pki.front_proxy_ca_crt.string(),
          "--requestheader-allowed-names=front-proxy-client",
          "--requestheader-username-headers=X-Remote-User",
          "--requestheader-group-headers=X-Remote-Group",
          "--requestheader-extra-headers-prefix=X-Remote-Extra-",
          "--proxy-client-cert-file=" + pki.front_proxy_client_crt.string(),
          "--proxy-client-key-file=" + pki.front_proxy_client_key.string(),
      };
      if (options.audit_writes) {
        const fs::path policy = plane->dir_ / "audit-policy.yaml";
        file::write_atomically(policy,
                               "apiVersion: audit.k8s.io/v1\nkind: Policy\n"
                               "omitStages: [RequestReceived]\nrules:\n"
                               "  - level: None\n    verbs: [get, list, watch]\n"
                               "  - level: Metadata\n");
        plane->audit_log_ = plane->dir_ / "audit.log";
        apiserver.push_back("--audit-policy-file=" + policy.string());
        apiserver.push_back("--audit-log-path=" + plane->audit_log_.string());
        apiserver.push_back("--audit-log-format=json");
        apiserver.push_back("--audit-log-mode=blocking");
      }
      apiserver.insert(apiserver.end(), options.extra_apiserver_flags.begin(),
                       options.extra_apiserver_flags.end());
      plane->spawn("kube-apiserver", apiserver);
      plane->wait_ready(
          "kube-apiserver", "GET " + plane->server_ + "/readyz",
          [&] {
            try {
              return plane->request("GET", "/readyz", "", "", "text/plain").status == 200;
            } catch (const Error&) {
              return false;  // not listening yet
            }
          },
          options.start_timeout);

      for (const fs::path& crd : options.crds) plane->install_crd(crd);

      if (options.controller_manager) {
        int kcm_port = testing::free_loopback_port();
        while (kcm_port == api_port || kcm_port == etcd_port || kcm_port == etcd_peer_port) {
          kcm_port = testing::free_loopback_port();
        }
        const std::string kubeconfig = plane->admin_kubeconfig_.string();
        plane->spawn(
            "kube-controller-manager",
            {assets.kube_controller_manager.string(), "--kubeconfig=" + kubeconfig,
             "--authentication-kubeconfig=" + kubeconfig,
             "--authorization-kubeconfig=" + kubeconfig, "--bind-address=127.0.0.1",
             "--secure-port=" + std::to_string(kcm_port),
             "--cert-dir=" + (plane->dir_ / "controller-manager-certs").string(),
             "--leader-elect=false", "--controllers=*", "--use-service-account-credentials=false",
             "--service-account-private-key-file=" + pki.sa_key.string(),
             "--root-ca-file=" + pki.ca_crt.string(),
             "--cluster-signing-cert-file=" + pki.ca_crt.string(),
             "--cluster-signing-key-file=" + pki.ca_key.string()});
        plane->wait_ready(
            "kube-controller-manager", "the default ServiceAccount of namespace default",
            [&] {
              return plane->request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
                         .status == 200;
            },
            options.start_timeout);
      }
      return plane;
    } catch (const PortTaken&) {
      plane->stop();
      if (attempt >= 3) throw;
    } catch (...) {
      plane->stop();
      throw;
    }
  }
}

ControlPlane::~ControlPlane() { stop(); }

void ControlPlane::spawn(const std::string& name, const std::vector<std::string>& argv) {
  Child child{name, -1, dir_ / (name + ".log")};
  const int log_fd = ::open(child.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw_errno("envtest: cannot create the log", child.log.string(), errno);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string dir = dir_.string();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  if (pid < 0) throw_errno("envtest: cannot start " + name, argv[0], fork_errno);
  ::setpgid(pid, pid);  // also from here, so the group exists before we might signal it
  child.pid = pid;
  children_.push_back(std::move(child));
}

bool ControlPlane::exited(Child& child) {
  if (child.pid <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
  if (r == child.pid || (r < 0 && errno == ECHILD)) {
    child.pid = -1;
    return true;
  }
  return false;
}

void ControlPlane::wait_ready(const std::string& name, const std::string& what,
                              const std::function<bool()>& ready, std::chrono::seconds timeout) {
  Child* child = nullptr;
  for (Child& c : children_) {
    if (c.name == name) child = &c;
  }
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (ready()) return;
    if (child != nullptr && exited(*child)) {
      const std::string tail = read_tail(child->log, 3000);
      const std::string message = "envtest: " + name + " exited during start-up (log " +
                                  child->log.string() + "):\n" + tail;
      if (tail.find("address already in use") != std::string::npos) throw PortTaken(message);
      throw Unavailable(message);
    }
    if (Clock::now() > deadline) {
      throw Unavailable("envtest: " + name + " was not ready after " +
                        std::to_string(timeout.count()) + " s (" + what + "); its log " +
                        (child ? child->log.string() : "") + " ends with:\n" +
                        (child ? read_tail(child->log, 3000) : ""));
    }
    // Polling a probe is the only signal these processes give; state is re-read each round.
    std::this_thread::sleep_for(100ms);
  }
}

void ControlPlane::stop_child(Child& child) {
  if (child.pid <= 0) return;
  ::kill(-child.pid, SIGTERM);
  const auto deadline = Clock::now() + 5s;
  while (!exited(child)) {
    if (Clock::now() > deadline) {
      ::kill(-child.pid, SIGKILL);
      int status = 0;
      while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
      child.pid = -1;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
}

void ControlPlane::stop() {
  if (stopped_) return;
  stopped_ = true;
  transport_.reset();
  // Reverse start order: the controller manager and API server before their etcd.
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) stop_child(*it);
  if (!dir_.empty() && std::getenv("LONGHAUL_ENVTEST_KEEP") == nullptr) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string ControlPlane::log_tail(std::string_view component, size_t bytes) const {
  return read_tail(dir_ / (std::string(component) + ".log"), bytes);
}

std::vector<pid_t> ControlPlane::pids() const {
  std::vector<pid_t> out;
  for (const Child& c : children_) {
    if (c.pid > 0) out.push_back(c.pid);
  }
  return out;
}

std::shared_ptr<kube::HttpClient> ControlPlane::admin_client() const {
  kube::HttpClientOptions o;
  o.qps = 0;
  o.initial_backoff = 20ms;
  o.max_backoff = 500ms;
  o.max_retries = 20;
  o.user_agent = "longhaul-envtest";  // tells the test's own writes from the operator's
  return std::make_shared<kube::HttpClient>(admin_, o);
}

// ---- requests ----

kube::HttpResponse ControlPlane::request(const std::string& method, const std::string& target,
                                         const std::string& body, const std::string& content_type,
                                         const std::string& accept) const {
  if (!transport_) throw FailedPrecondition("envtest: the control plane was stopped");
  kube::HttpRequest req;
  req.method = method;
  req.target = target;
  req.headers.emplace_back("Accept", accept);
  if (!body.empty()) {
    req.headers.emplace_back("Content-Type", content_type);
    req.body = body;
  }
  return transport_->request(req);
}

json ControlPlane::call(const std::string& method, const std::string& target, const json& body,
                        const std::string& content_type) const {
  const kube::HttpResponse r =
      request(method, target, body.is_null() ? "" : body.dump(), content_type);
  if (r.status < 200 || r.status > 299)
    kube::throw_api_error(r.status, r.body, method + " " + target);
  return r.body.empty() ? json::object() : json::parse(r.body);
}

// ---- audit ----

std::vector<json> ControlPlane::audit_events(size_t* offset) const {
  std::vector<json> out;
  if (audit_log_.empty()) return out;
  std::ifstream in(audit_log_, std::ios::binary);
  if (!in) return out;
  in.seekg(static_cast<std::streamoff>(*offset));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written: read it next time
    *offset += line.size() + 1;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception&) {
      // Not an event; skip it.
    }
  }
  return out;
}

size_t ControlPlane::audit_barrier(const std::string& ns) const {
  if (audit_log_.empty()) throw FailedPrecondition("envtest: auditing is off for this plane");
  static std::atomic<int> counter{0};
  const std::string name =
      "audit-barrier-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
  call("POST", "/api/v1/namespaces/" + ns + "/configmaps",
       {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", name}}}});
  size_t offset = 0;
  const auto deadline = Clock::now() + 30s;
  while (Clock::now() < deadline) {
    for (const json& e : audit_events(&offset)) {
      if (e.value(json::json_pointer("/objectRef/name"), std::string()) == name) return offset;
    }
    std::this_thread::sleep_for(20ms);
  }
  throw DeadlineExceeded("envtest: the audit barrier " + name + " never reached " +
                         audit_log_.string());
}

// ---- namespaces, ServiceAccounts, tokens ----

void ControlPlane::ensure_namespace(const std::string& ns) const {
  const auto r = request(
      "POST", "/api/v1/namespaces",
      json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}.dump());
  if (r.status != 201 && r.status != 409)
    kube::throw_api_error(r.status, r.body, "create Namespace " + ns);
  const auto deadline = Clock::now() + 60s;
  while (request("GET", "/api/v1/namespaces/" + ns + "/serviceaccounts/default").status != 200) {
    if (Clock::now() > deadline) {
      throw DeadlineExceeded("envtest: namespace " + ns +
                             " got no default ServiceAccount within 60 s; is the controller "
                             "manager running? Its log ends with:\n" +
                             log_tail("kube-controller-manager", 2000));
    }
    std::this_thread::sleep_for(50ms);
  }
}

void ControlPlane::ensure_service_account(const std::string& ns, const std::string& name) const {
  const auto r = request("POST", "/api/v1/namespaces/" + ns + "/serviceaccounts",
                         json{{"apiVersion", "v1"},
                              {"kind", "ServiceAccount"},
                              {"metadata", {{"name", name}, {"namespace", ns}}}}
                             .dump());
  if (r.status != 201 && r.status != 409) {
    kube::throw_api_error(r.status, r.body, "create ServiceAccount " + ns + "/" + name);
  }
}

std::string ControlPlane::mint_token(const std::string& ns, const std::string& name,
                                     std::chrono::seconds ttl) const {
  const json answer =
      call("POST", "/api/v1/namespaces/" + ns + "/serviceaccounts/" + name + "/token",
           {{"apiVersion", "authentication.k8s.io/v1"},
            {"kind", "TokenRequest"},
            {"spec", {{"expirationSeconds", ttl.count()}}}});
  const std::string token = answer.value(json::json_pointer("/status/token"), std::string());
  if (token.empty()) {
    throw Internal("envtest: the TokenRequest for ServiceAccount " + ns + "/" + name +
                   " returned no token: " + answer.dump());
  }
  return token;
}

kube::ClusterConfig ControlPlane::config_for_token(const std::string& token) const {
  kube::ClusterConfig c;
  c.server = server_;
  c.tls.ca_file = ca_file_.string();
  c.token = token;
  c.source = "envtest token";
  return c;
}

void ControlPlane::write_kubeconfig(const fs::path& path, const std::string& token,
                                    const std::string& default_namespace) const {
  file::write_atomically(path, kubeconfig_yaml(server_, ca_file_, "token-user",
                                               "    token: " + token + "\n", default_namespace));
}

// ---- discovery and apply ----

kube::Resource ControlPlane::resource_for(const std::string& api_version,
                                          const std::string& kind) const {
  const bool core = api_version.find('/') == std::string::npos;
  const json list = call("GET", core ? "/api/" + api_version : "/apis/" + api_version);
  for (const json& r : list.value("resources", json::array())) {
    const std::string plural = r.value("name", "");
    if (r.value("kind", "") != kind || plural.find('/') != std::string::npos) continue;
    kube::Resource out;
    if (!core) {
      out.group = api_version.substr(0, api_version.find('/'));
      out.version = api_version.substr(api_version.find('/') + 1);
    } else {
      out.version = api_version;
    }
    out.plural = plural;
    out.namespaced = r.value("namespaced", false);
    out.kind = kind;
    return out;
  }
  throw NotFound("envtest: the API server serves no kind " + kind + " in " + api_version);
}

json ControlPlane::apply(json object, const std::string& default_namespace, bool dry_run) const {
  const std::string api_version = object.value("apiVersion", "");
  const std::string kind = object.value("kind", "");
  const std::string name = object_name(object);
  if (api_version.empty() || kind.empty() || name.empty()) {
    throw InvalidArgument("envtest: an object without apiVersion, kind or metadata.name: " +
                          object.dump().substr(0, 200));
  }
  const kube::Resource r = resource_for(api_version, kind);
  std::string ns;
  if (r.namespaced) {
    ns = object["metadata"].value("namespace", default_namespace);
    object["metadata"]["namespace"] = ns;
  }
  const std::string query = dry_run ? "?dryRun=All" : "";
  const std::string what = kind + " " + (ns.empty() ? "" : ns + "/") + name;
  auto created = request("POST", r.collection_path(ns) + query, object.dump());
  if (created.status == 201 || created.status == 200) return json::parse(created.body);
  if (created.status != 409) kube::throw_api_error(created.status, created.body, "create " + what);
  const json existing = call("GET", r.object_path(ns, name));
  object["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"];
  return call("PUT", r.object_path(ns, name) + query, object);
}

void ControlPlane::install_crd(const fs::path& yaml_file) const {
  for (const json& crd : load_manifests(yaml_file)) {
    if (crd.value("kind", "") != "CustomResourceDefinition") continue;
    apply(crd);
    const std::string name = object_name(crd);
    const auto deadline = Clock::now() + 60s;
    std::string last_conditions;
    while (true) {
      const json got =
          call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + name);
      bool established = false;
      for (const json& c : got.value(json::json_pointer("/status/conditions"), json::array())) {
        if (c.value("type", "") == "Established" && c.value("status", "") == "True") {
          established = true;
        }
      }
      last_conditions = got.value(json::json_pointer("/status/conditions"), json::array()).dump();
      if (established) {
        // Served: discovery lists the resource of the storage version.
        const std::string group = got["spec"].value("group", "");
        std::string version;
        for (const json& v : got["spec"]["versions"]) {
          if (v.value("storage", false)) version = v.value("name", "");
        }
        const std::string kind = got["spec"]["names"].value("kind", "");
        // Served, and listed in the group discovery (/apis) that clients such as the
        // controller manager's garbage collector start from.
        bool listed = false;
        for (const json& g : call("GET", "/apis").value("groups", json::array())) {
          if (g.value("name", "") != group) continue;
          for (const json& v : g.value("versions", json::array())) {
            if (v.value("version", "") == version) listed = true;
          }
        }
        if (listed) {
          try {
            resource_for(group + "/" + version, kind);
            break;
          } catch (const Error&) {
            // Not in the version's discovery yet.
          }
        }
      }
      if (Clock::now() > deadline) {
        throw DeadlineExceeded(
            "envtest: CustomResourceDefinition " + name + " from " + yaml_file.string() +
            " was not Established and served within 60 s; conditions: " + last_conditions);
      }
      std::this_thread::sleep_for(50ms);
    }
  }
}

// ---- the process-wide plane ----

std::vector<fs::path> project_crds() {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(source_dir() / "crds", ec)) {
    if (entry.path().extension() == ".yaml") out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ControlPlane* shared_control_plane(std::string* why) {
  static std::mutex mu;
  // Never destroyed by a static destructor: the HTTP library's own statics may already be gone
  // by then. An atexit handler registered after the start (so it runs before the destructors of
  // everything the start constructed) stops the processes instead.
  static ControlPlane* plane = nullptr;
  static std::string unavailable;
  static std::string failed;
  std::lock_guard lock(mu);
  if (plane != nullptr) return plane;
  if (!failed.empty()) throw Unavailable(failed);
  if (!unavailable.empty()) {
    if (why != nullptr) *why = unavailable;
    return nullptr;
  }
  std::string reason;
  const auto assets = find_assets(&reason);
  if (!assets) {
    unavailable = reason;
    if (why != nullptr) *why = reason;
    return nullptr;
  }
  try {
    ControlPlaneOptions options;
    options.crds = project_crds();
    options.audit_writes = true;
    plane = ControlPlane::start(*assets, options).release();
  } catch (const std::exception& e) {
    failed = std::string("envtest: the control plane failed to start: ") + e.what();
    throw Unavailable(failed);
  }
  std::atexit([] { plane->stop(); });
  return plane;
}

}  // namespace longhaul::envtest
