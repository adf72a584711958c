// Operator benchmark: N TrainingJobs x 4 pods (Chief + 3 Workers) reconciled by the real
// longhaul-operator binary (a child process), against either
//   --api fake  the in-process FakeApiServer (default), or
//   --api real  a real etcd + kube-apiserver + kube-controller-manager started here through
//               tests/envtest (LONGHAUL_KUBE_ASSETS, see tests/envtest/README.md),
// with a simulated kubelet that marks new pods Running and Ready (and, on the fake server,
// finalizes deletions).
//
//   build/<dir>/bench/operator_bench [--api fake|real] [--jobs 1000] [--workers 4]
//                                    [--idle-seconds 30] [--qps Q --burst B]
//
// Prints: time to converge (operator start -> every job Running with 4/4 ready), reconciles
// and their p50/p99 wall time and CPU time of the worker thread (histogram_quantile over the
// operator's own longhaul_operator_reconcile_{duration,cpu}_seconds buckets, so
// bucket-resolution), API requests and writes while converging, API writes per minute once
// converged (target 0), and the operator's RSS. With --api real also the latency of the
// operator's API requests, the CPU time each process used while converging (operator,
// kube-apiserver, etcd, controller manager, this harness with its kubelet) and a progress line
// every 5 s on stderr.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/base/mutex.h"
#include "longhaul/base/rfc3339.h"
#include "longhaul/fakeapi/server.h"
#include "longhaul/testing/loopback.h"
#ifdef LONGHAUL_BENCH_REAL
#include "longhaul/envtest/control_plane.h"
#include "longhaul/kube/informer.h"
#endif

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr const char* kJobs = "trainingjobs.longhaul.dev";

// histogram_quantile over cumulative buckets {le -> count}.
double quantile(const std::map<double, double>& buckets, double q) {
  if (buckets.empty()) return 0;
  const double total = buckets.rbegin()->second;
  if (total <= 0) return 0;
  const double rank = q * total;
  double prev_le = 0, prev_count = 0;
  for (const auto& [le, count] : buckets) {
    if (count >= rank) {
      if (std::isinf(le)) return prev_le;
      return prev_le + (le - prev_le) * (rank - prev_count) / std::max(1e-9, count - prev_count);
    }
    prev_le = le;
    prev_count = count;
  }
  return prev_le;
}

long status_kib(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field) + 1));
  }
  return 0;
}

// User + system CPU seconds of a process (its threads included, reaped children not).
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  double utime = 0, stime = 0;
  // Fields after the command: state(3) ... utime(14) stime(15).
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

json job(const std::string& name, const std::string& ns) {
  json c = {{"name", "trainer"}, {"image", "longhaul-worker"}};
  json tmpl = {{"spec", {{"containers", {c}}, {"terminationGracePeriodSeconds", 5}}}};
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"replicaSpecs",
             {{"Chief", {{"replicas", 1}, {"template", tmpl}}},
              {"Worker", {{"replicas", 3}, {"template", tmpl}}}}}}}};
}

bool job_converged(const json& j) {
  const json s = j.value("status", json::object());
  return s.value("phase", "") == "Running" && s.value("ready", "") == "4/4";
}

// The operator's /metrics, parsed on demand.
struct Metrics {
  std::string text;
  static Metrics scrape(int port) { return {longhaul::testing::http_get(port, "/metrics").body}; }
  // Sum of every sample of `name` (any labels) whose line contains each of `must`.
  double sum(const std::string& name, const std::vector<std::string>& any_of = {}) const {
    double total = 0;
    std::istringstream m(text);
    for (std::string line; std::getline(m, line);) {
      if (line.rfind(name, 0) != 0) continue;
      const char next = line.size() > name.size() ? line[name.size()] : '\0';
      if (next != ' ' && next != '{') continue;
      bool match = any_of.empty();
      for (const auto& s : any_of) match = match || line.find(s) != std::string::npos;
      if (match) total += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return total;
  }
  std::map<double, double> buckets(const std::string& histogram) const {
    std::map<double, double> out;
    const std::string prefix = histogram + "_bucket{le=\"";
    std::istringstream m(text);
    for (std::string line; std::getline(m, line);) {
      if (line.rfind(prefix, 0) != 0) continue;
      const auto q = line.find('"', prefix.size());
      const std::string le = line.substr(prefix.size(), q - prefix.size());
      out[le == "+Inf" ? INFINITY : std::stod(le)] = std::stod(line.substr(line.rfind(' ') + 1));
    }
    return out;
  }
  double ms(const std::string& histogram, double q) const {
    return 1000 * quantile(buckets(histogram), q);
  }
  double requests() const { return sum("longhaul_operator_api_requests_total"); }
  double writes() const {
    return sum("longhaul_operator_api_requests_total",
               {"verb=\"create\"", "verb=\"update\"", "verb=\"patch\"", "verb=\"delete\""});
  }
  double queue_depth() const { return sum("longhaul_operator_workqueue_depth"); }
};

// Starts longhaul-operator with `args`, output to `log`; it dies with this process.
pid_t start_operator(const fs::path& log, const std::vector<std::string>& args) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(LONGHAUL_OPERATOR_BINARY));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(LONGHAUL_OPERATOR_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

// Waits until the operator's work queue read empty twice, one second apart (the tail of no-op
// reconciles after the last status writes), at most two minutes.
void wait_queue_drained(int metrics_port) {
  for (int quiet = 0, tries = 0; quiet < 2 && tries < 120; ++tries) {
    quiet = Metrics::scrape(metrics_port).queue_depth() == 0 ? quiet + 1 : 0;
    std::this_thread::sleep_for(1s);  // sampling interval of the queue-depth gauge
  }
}

void row(const char* metric, const std::string& value) {
  std::printf("| %-50s | %15s |\n", metric, value.c_str());
}
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string fmt2(const char* f, double a, double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

int run_fake(int jobs, int workers, int idle_seconds) {
  longhaul::fakeapi::Options so;
  so.default_node_name = "node-1";
  so.event_history_size = 500000;
  longhaul::fakeapi::FakeApiServer server(so);
  server.start();
  const fs::path dir = fs::temp_directory_path() / ("operator-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);
  server.write_kubeconfig(dir / "kubeconfig", "default");
  for (int i = 0; i < jobs; ++i) {
    server.create(kJobs, "default", job("bench-" + std::to_string(i), "default"));
  }

  // The kubelet: new pods run, deleted pods go.
  std::atomic<bool> stop{false};
  std::thread kubelet([&] {
    while (!stop) {
      try {
        for (const json& pod : server.list("pods")) {
          const json& md = pod["metadata"];
          if (md.contains("deletionTimestamp")) {
            server.finalize_pod_deletion("default", md["name"].get<std::string>());
          } else if (!pod.contains("status") || pod["status"].value("phase", "") != "Running") {
            server.patch_status(
                "pods", "default", md["name"].get<std::string>(),
                {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}});
          }
        }
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(200ms);  // the kubelet's sync period
    }
  });

  const int metrics_port = longhaul::testing::free_loopback_port(),
            health_port = longhaul::testing::free_loopback_port();
  const auto t0 = Clock::now();
  server.clear_requests();
  const pid_t pid = start_operator(
      dir / "operator.log",
      {"--kubeconfig=" + (dir / "kubeconfig").string(),
       "--metrics-port=" + std::to_string(metrics_port),
       "--health-port=" + std::to_string(health_port), "--workers=" + std::to_string(workers),
       "--leader-elect=false", "--qps=0", "--bind-address=127.0.0.1", "--log-level=warning"});

  auto converged = [&] {
    int ok = 0;
    for (const json& j : server.list(kJobs, "default")) ok += job_converged(j) ? 1 : 0;
    return ok == jobs;
  };
  // Polled twice a second: listing every job on each store change would load the server.
  bool done = false;
  for (auto deadline = t0 + std::chrono::minutes(15);
       !(done = converged()) && Clock::now() < deadline;) {
    std::this_thread::sleep_for(500ms);
  }
  const double converge_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const size_t requests = server.count_requests();
  const size_t writes = server.count_requests({.write = true});

  wait_queue_drained(metrics_port);
  server.clear_requests();
  const long rss_converged = status_kib(pid, "VmRSS:");
  std::this_thread::sleep_for(std::chrono::seconds(idle_seconds));  // the measured idle window
  const size_t idle_writes = server.count_requests({.write = true});
  const size_t idle_requests = server.count_requests();
  std::map<std::string, int> idle_by_kind;
  for (const auto& r : server.requests()) ++idle_by_kind[r.verb + " " + r.resource];

  const Metrics m = Metrics::scrape(metrics_port);
  const long rss = status_kib(pid, "VmRSS:"), hwm = status_kib(pid, "VmHWM:");
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  stop = true;
  kubelet.join();
  server.stop();

  std::printf("operator_bench: %d TrainingJobs x 4 pods, %d workers, fake API server in-process\n",
              jobs, workers);
  row("metric", "value");
  std::printf("|%s|%s|\n", std::string(52, '-').c_str(), std::string(17, '-').c_str());
  row("converged", done ? "yes" : "NO (15 min)");
  row("time to converge (s)", fmt("%.1f", converge_s));
  row("reconciles", fmt("%.0f", m.sum("longhaul_operator_reconcile_duration_seconds_count")));
  row("reconcile p50 / p99, wall (ms)",
      fmt2("%.1f / %.1f", m.ms("longhaul_operator_reconcile_duration_seconds", 0.5),
           m.ms("longhaul_operator_reconcile_duration_seconds", 0.99)));
  row("reconcile p50 / p99, operator CPU (ms)",
      fmt2("%.2f / %.2f", m.ms("longhaul_operator_reconcile_cpu_seconds", 0.5),
           m.ms("longhaul_operator_reconcile_cpu_seconds", 0.99)));
  row("API requests while converging", fmt("%.0f", static_cast<double>(requests)));
  row("API writes while converging", fmt("%.0f", static_cast<double>(writes)));
  row("API writes/min once converged (target 0)",
      fmt("%.1f", 60.0 * static_cast<double>(idle_writes) / idle_seconds));
  row("API requests/min once converged",
      fmt("%.1f", 60.0 * static_cast<double>(idle_requests) / idle_seconds));
  row("operator RSS converged / end (MiB)",
      fmt2("%.1f / %.1f", rss_converged / 1024.0, rss / 1024.0));
  row("operator peak RSS (MiB)", fmt("%.1f", hwm / 1024.0));
  row("operator exit status on SIGTERM", fmt("%.0f", WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  for (const auto& [kind, n] : idle_by_kind) {
    std::printf("  idle requests: %-40s %d\n", kind.c_str(), n);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return done ? 0 : 1;
}

#ifdef LONGHAUL_BENCH_REAL
namespace res = longhaul::kube::resources;

std::string now_rfc3339() { return longhaul::format_rfc3339(std::chrono::system_clock::now()); }

// The status a kubelet reports for a pod whose container started at `now`.
json running_status(const std::string& now) {
  return {{"status",
           {{"phase", "Running"},
            {"conditions",
             {{{"type", "Ready"}, {"status", "True"}},
              {{"type", "ContainersReady"}, {"status", "True"}}}},
            {"containerStatuses",
             {{{"name", "trainer"},
               {"image", "longhaul-worker"},
               {"imageID", ""},
               {"ready", true},
               {"restartCount", 0},
               {"state", {{"running", {{"startedAt", now}}}}}}}}}}};
}

// The kubelets of a cluster whose pods are never bound (there is no scheduler). A pod informer
// (a list, then a watch, as a kubelet watches the pods bound to its node) hands each new
// Pending pod to one of `n` threads, by name, which reports it Running and Ready as the kubelet
// of the pod's node would. Every pod event is sent once, not once per kubelet, and nothing is
// listed again and again. (Until 2026-11-25 the kubelets polled a list of the Pending pods
// every 200 ms: API server CPU a cluster's kubelets do not cost.) The destructor stops the
// threads and the informer, on every path.
class SimulatedKubelets {
 public:
  SimulatedKubelets(std::shared_ptr<longhaul::kube::Client> client, std::string ns, int n)
      : client_(std::move(client)), ns_(std::move(ns)), queues_(n), pods_(client_, [&] {
          longhaul::kube::InformerOptions o;
          o.resource = res::kPods;
          o.ns = ns_;
          return o;
        }()) {
    pods_.add_handlers({.on_add = [this](const json& pod) { enqueue(pod); },
                        .on_update = [this](const json&, const json& pod) { enqueue(pod); },
                        .on_delete = nullptr});
    for (Queue& q : queues_) threads_.emplace_back([this, &q] { run(q); });
    pods_.start();
  }
  ~SimulatedKubelets() { stop(); }

  bool wait_for_sync(std::chrono::milliseconds timeout) { return pods_.wait_for_sync(timeout); }
  void stop() {
    stop_ = true;
    for (Queue& q : queues_) {
      longhaul::MutexLock lock(q.mu);
      q.cv.notify_all();
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    pods_.stop();
  }
  long writes() const { return writes_.load(); }
  long errors() const { return errors_.load(); }

 private:
  struct Queue {
    longhaul::Mutex mu;
    longhaul::CondVar cv;
    std::deque<std::string> pods GUARDED_BY(mu);  // names of Pending pods
  };

  void enqueue(const json& pod) {
    const json& md = pod["metadata"];
    if (md.contains("deletionTimestamp")) return;
    if (pod.value("status", json::object()).value("phase", "Pending") != "Pending") return;
    const std::string name = md["name"].get<std::string>();
    Queue& q = queues_[std::hash<std::string>{}(name) % queues_.size()];
    longhaul::MutexLock lock(q.mu);
    q.pods.push_back(name);
    q.cv.notify_one();
  }

  void run(Queue& q) {
    std::set<std::string> done_uids;
    for (;;) {
      std::string name;
      {
        longhaul::MutexLock lock(q.mu);
        q.cv.wait(q.mu, [&]() REQUIRES(q.mu) { return stop_ || !q.pods.empty(); });
        if (stop_) return;
        name = std::move(q.pods.front());
        q.pods.pop_front();
      }
      // The informer's current view: the pod may have gone or run since it was queued.
      const auto pod = pods_.store().get(ns_, name);
      if (pod == nullptr || (*pod)["metadata"].contains("deletionTimestamp")) continue;
      const std::string uid = (*pod)["metadata"].value("uid", "");
      if (done_uids.contains(uid)) continue;
      try {
        client_->patch(res::kPods, ns_, name, running_status(now_rfc3339()),
                       longhaul::kube::PatchType::kMerge, /*status_subresource=*/true);
        done_uids.insert(uid);
        ++writes_;
      } catch (const std::exception&) {
        ++errors_;  // the pod went away between its event and the patch
      }
    }
  }

  const std::shared_ptr<longhaul::kube::Client> client_;
  const std::string ns_;
  std::atomic<bool> stop_{false};
  std::atomic<long> writes_{0}, errors_{0};
  std::vector<Queue> queues_;
  std::vector<std::thread> threads_;
  longhaul::kube::Informer pods_;
};

// The TrainingJobs that converged, counted off an informer: each status change is seen once, as
// it happens, instead of listing every job twice a second.
class ConvergedJobs {
 public:
  ConvergedJobs(std::shared_ptr<longhaul::kube::Client> client, const std::string& ns)
      : jobs_(std::move(client), [&] {
          longhaul::kube::InformerOptions o;
          o.resource = res::kTrainingJobs;
          o.ns = ns;
          return o;
        }()) {
    jobs_.add_handlers({.on_add = [this](const json& j) { observe(j); },
                        .on_update = [this](const json&, const json& j) { observe(j); },
                        .on_delete = nullptr});
    jobs_.start();
  }
  ~ConvergedJobs() { stop(); }

  void stop() { jobs_.stop(); }

  bool wait_for_sync(std::chrono::milliseconds timeout) { return jobs_.wait_for_sync(timeout); }
  // Waits until `n` jobs converged or `until`; returns how many have.
  int wait(int n, Clock::time_point until) EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    cv_.wait_until(mu_, until,
                   [&]() REQUIRES(mu_) { return static_cast<int>(converged_.size()) == n; });
    return static_cast<int>(converged_.size());
  }

 private:
  void observe(const json& j) EXCLUDES(mu_) {
    const std::string key = longhaul::kube::object_key(j);
    longhaul::MutexLock lock(mu_);
    if (job_converged(j)) {
      converged_.insert(key);
    } else {
      converged_.erase(key);
    }
    cv_.notify_all();
  }

  longhaul::Mutex mu_;
  longhaul::CondVar cv_;
  std::set<std::string> converged_ GUARDED_BY(mu_);
  longhaul::kube::Informer jobs_;  // last: stopped before the members its handlers use
};

// CPU seconds per process of interest, sampled together.
struct CpuTimes {
  std::map<std::string, double> by;  // operator, kube-apiserver, etcd, kube-controller-manager
  static CpuTimes sample(const std::map<std::string, pid_t>& pids) {
    CpuTimes t;
    for (const auto& [name, pid] : pids) t.by[name] = cpu_seconds(pid);
    return t;
  }
  double get(const std::string& name) const { return by.contains(name) ? by.at(name) : 0; }
  CpuTimes operator-(const CpuTimes& o) const {
    CpuTimes d;
    for (const auto& [name, v] : by) d.by[name] = v - (o.by.contains(name) ? o.by.at(name) : 0);
    return d;
  }
};

int run_real(int jobs, int workers, int idle_seconds, double qps, int burst, int kubelets,
             int timeout_minutes) {
  namespace envtest = longhaul::envtest;
  std::string why;
  const auto assets = envtest::find_assets(&why);
  if (!assets) {
    std::fprintf(stderr, "operator_bench --api real: %s\n", why.c_str());
    return 2;
  }
  const auto t_start = Clock::now();
  auto since = [&](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // A plane of its own (not the test suites' shared one): no audit log, which a production API
  // server would not write for every request either.
  envtest::ControlPlaneOptions po;
  po.crds = envtest::project_crds();
  auto plane = envtest::ControlPlane::start(*assets, po);
  std::fprintf(stderr, "[%6.1fs] control plane up at %s\n", since(t_start),
               plane->server().c_str());
  std::map<std::string, pid_t> pids;
  {
    const char* names[] = {"etcd", "kube-apiserver", "kube-controller-manager"};
    const auto p = plane->pids();
    for (size_t i = 0; i < p.size() && i < 3; ++i) pids[names[i]] = p[i];
  }
  pids["harness+kubelet"] = getpid();
  const std::string ns = "operator-bench";
  plane->ensure_namespace(ns);
  auto admin = plane->admin_client();
  const fs::path dir = plane->work_dir() / "operator-bench";
  fs::create_directories(dir);
  {  // Created by 4 threads: this is setup, not measured.
    std::vector<std::thread> creators;
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    for (int t = 0; t < 4; ++t) {
      creators.emplace_back([&] {
        for (int i; (i = next++) < jobs && !failed;) {
          try {
            admin->create(res::kTrainingJobs, ns, job("bench-" + std::to_string(i), ns));
          } catch (const std::exception& e) {
            std::fprintf(stderr, "creating bench-%d: %s\n", i, e.what());
            failed = true;
          }
        }
      });
    }
    for (auto& c : creators) c.join();
    if (failed) return 1;
  }
  std::fprintf(stderr, "[%6.1fs] %d TrainingJobs created\n", since(t_start), jobs);

  SimulatedKubelets kubelet(admin, ns, kubelets);
  ConvergedJobs converged_jobs(admin, ns);
  if (!kubelet.wait_for_sync(std::chrono::minutes(2)) ||
      !converged_jobs.wait_for_sync(std::chrono::minutes(2))) {
    std::fprintf(stderr, "operator_bench: the harness's informers did not sync\n");
    return 1;
  }

  const int metrics_port = longhaul::testing::free_loopback_port(),
            health_port = longhaul::testing::free_loopback_port();
  std::vector<std::string> args = {"--kubeconfig=" + plane->admin_kubeconfig().string(),
                                   "--metrics-port=" + std::to_string(metrics_port),
                                   "--health-port=" + std::to_string(health_port),
                                   "--workers=" + std::to_string(workers),
                                   "--namespace=" + ns,
                                   "--leader-elect=false",
                                   "--bind-address=127.0.0.1",
                                   "--log-level=warning"};
  if (qps >= 0) args.push_back("--qps=" + std::to_string(qps));
  if (burst > 0) args.push_back("--burst=" + std::to_string(burst));
  const CpuTimes cpu0 = CpuTimes::sample(pids);
  const auto t0 = Clock::now();
  const pid_t pid = start_operator(dir / "operator.log", args);
  pids["operator"] = pid;

  // A progress line every 5 s until every job converged.
  int converged = 0;
  auto last_report = t0;
  const auto deadline = t0 + std::chrono::minutes(timeout_minutes);
  for (;;) {
    converged = converged_jobs.wait(jobs, std::min(deadline, last_report + 5s));
    if (converged == jobs || Clock::now() > deadline) break;
    if (Clock::now() - last_report >= 5s) {
      last_report = Clock::now();
      const CpuTimes c = CpuTimes::sample(pids) - cpu0;
      double requests = 0;
      try {
        requests = Metrics::scrape(metrics_port).requests();
      } catch (const std::exception&) {
      }
      std::fprintf(stderr,
                   "[%6.1fs] converged %d/%d, pods Running %ld/%d, operator requests %.0f; CPU s: "
                   "operator %.1f apiserver %.1f etcd %.1f kcm %.1f harness %.1f\n",
                   since(t0), converged, jobs, kubelet.writes(), 4 * jobs, requests,
                   c.get("operator"), c.get("kube-apiserver"), c.get("etcd"),
                   c.get("kube-controller-manager"), c.get("harness+kubelet"));
    }
  }
  const bool done = converged == jobs;
  const double converge_s = since(t0);
  const CpuTimes cpu = CpuTimes::sample(pids) - cpu0;
  const Metrics at_converge = Metrics::scrape(metrics_port);
  std::fprintf(stderr, "[%6.1fs] %s: %d/%d jobs Running 4/4\n", converge_s,
               done ? "converged" : "NOT converged", converged, jobs);

  kubelet.stop();  // nothing left for the kubelets to do
  converged_jobs.stop();
  wait_queue_drained(metrics_port);
  const Metrics idle0 = Metrics::scrape(metrics_port);
  const long rss_converged = status_kib(pid, "VmRSS:");
  std::this_thread::sleep_for(std::chrono::seconds(idle_seconds));  // the measured idle window
  const Metrics idle1 = Metrics::scrape(metrics_port);
  const long rss = status_kib(pid, "VmRSS:"), hwm = status_kib(pid, "VmHWM:");
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  const double reconciles = idle1.sum("longhaul_operator_reconcile_duration_seconds_count");
  const double reconcile_cpu_s = idle1.sum("longhaul_operator_reconcile_cpu_seconds_sum");

  std::printf(
      "operator_bench: %d TrainingJobs x 4 pods, %d workers, client qps %s burst %s, %d kubelet "
      "threads, REAL kube-apiserver + etcd (envtest, %s)\n",
      jobs, workers,
      qps < 0    ? "default"
      : qps == 0 ? "unlimited"
                 : fmt("%.0f", qps).c_str(),
      burst > 0 ? std::to_string(burst).c_str() : "default", kubelets,
      assets->kube_apiserver.filename().c_str());
  row("metric", "value");
  std::printf("|%s|%s|\n", std::string(52, '-').c_str(), std::string(17, '-').c_str());
  row("converged", done ? "yes" : ("NO (" + std::to_string(timeout_minutes) + " min)").c_str());
  row("time to converge (s)", fmt("%.1f", converge_s));
  row("reconciles", fmt("%.0f", reconciles));
  row("reconcile p50 / p99, wall (ms)",
      fmt2("%.1f / %.1f", idle1.ms("longhaul_operator_reconcile_duration_seconds", 0.5),
           idle1.ms("longhaul_operator_reconcile_duration_seconds", 0.99)));
  row("reconcile p50 / p99, operator CPU (ms)",
      fmt2("%.2f / %.2f", idle1.ms("longhaul_operator_reconcile_cpu_seconds", 0.5),
           idle1.ms("longhaul_operator_reconcile_cpu_seconds", 0.99)));
  row("API request p50 / p99, operator's (ms)",
      fmt2("%.1f / %.1f", idle1.ms("longhaul_operator_api_request_duration_seconds", 0.5),
           idle1.ms("longhaul_operator_api_request_duration_seconds", 0.99)));
  row("operator API requests while converging", fmt("%.0f", at_converge.requests()));
  row("operator API writes while converging", fmt("%.0f", at_converge.writes()));
  row("kubelet status writes (not the operator's)",
      fmt("%.0f", static_cast<double>(kubelet.writes())));
  row("operator API writes/min once converged (target 0)",
      fmt("%.1f", 60.0 * (idle1.writes() - idle0.writes()) / idle_seconds));
  row("operator API requests/min once converged",
      fmt("%.1f", 60.0 * (idle1.requests() - idle0.requests()) / idle_seconds));
  row("CPU s converging: operator (in reconciles)",
      fmt2("%.1f (%.1f)", cpu.get("operator"), reconcile_cpu_s));
  row("CPU s converging: kube-apiserver", fmt("%.1f", cpu.get("kube-apiserver")));
  row("CPU s converging: etcd", fmt("%.1f", cpu.get("etcd")));
  row("CPU s converging: kube-controller-manager", fmt("%.1f", cpu.get("kube-controller-manager")));
  row("CPU s converging: harness + kubelets", fmt("%.1f", cpu.get("harness+kubelet")));
  row("operator RSS converged / end (MiB)",
      fmt2("%.1f / %.1f", rss_converged / 1024.0, rss / 1024.0));
  row("operator peak RSS (MiB)", fmt("%.1f", hwm / 1024.0));
  row("operator exit status on SIGTERM", fmt("%.0f", WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  std::printf("  operator requests while converging by verb/code:");
  {
    std::istringstream m(at_converge.text);
    for (std::string line; std::getline(m, line);) {
      const std::string p = "longhaul_operator_api_requests_total{";
      if (line.rfind(p, 0) == 0) std::printf(" %s", line.substr(p.size() - 1).c_str());
    }
  }
  std::printf("\n");
  if (kubelet.errors() > 0) std::printf("  kubelet request errors: %ld\n", kubelet.errors());
  plane->stop();
  return done ? 0 : 1;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"operator_bench: N TrainingJobs x 4 pods reconciled by longhaul-operator"};
  int jobs = 1000, workers = 4, idle_seconds = 30, burst = 0, kubelets = 4, timeout_minutes = 10;
  std::string api = "fake";
  double qps = -1;
  app.add_option("--api", api, "fake (in-process) or real (envtest: etcd + kube-apiserver)")
      ->check(CLI::IsMember({"fake", "real"}));
  app.add_option("--jobs", jobs, "TrainingJobs to create");
  app.add_option("--workers", workers, "operator reconcile workers");
  app.add_option("--idle-seconds", idle_seconds, "seconds to count writes once converged");
  app.add_option("--qps", qps,
                 "--api real: the operator's client QPS limit (0: none; default: the "
                 "operator's default)");
  app.add_option("--burst", burst, "--api real: the operator's client burst (default: its own)");
  app.add_option("--kubelets", kubelets, "--api real: simulated kubelet threads");
  app.add_option("--timeout-minutes", timeout_minutes, "--api real: give up converging after");
  CLI11_PARSE(app, argc, argv);
  if (api == "real") {
#ifdef LONGHAUL_BENCH_REAL
    return run_real(jobs, workers, idle_seconds, qps, burst, std::max(1, kubelets),
                    timeout_minutes);
#else
    std::fprintf(stderr, "operator_bench: built without tests/envtest; --api real unavailable\n");
    return 2;
#endif
  }
  return run_fake(jobs, workers, idle_seconds);
}
