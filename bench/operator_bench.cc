// Operator benchmark: N TrainingJobs x 4 pods (Chief + 3 Workers) reconciled by the real
// longhaul-operator binary (a child process) against the in-process FakeApiServer, with a
// simulated kubelet that marks new pods Running and finalizes deletions.
//
//   build/<dir>/bench/operator_bench [--jobs 1000] [--workers 4] [--idle-seconds 30]
//
// Prints: time to converge (operator start -> every job Running with 4/4 ready), reconciles
// and their p50/p99 (histogram_quantile over the operator's own
// longhaul_operator_reconcile_duration_seconds buckets, so bucket-resolution), API requests
// while converging, API writes per minute once converged (target 0), and the operator's peak
// and final RSS (VmHWM / VmRSS of the process).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/fakeapi/server.h"
#include "longhaul/testing/loopback.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
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

json job(const std::string& name) {
  json c = {{"name", "trainer"}, {"image", "longhaul-worker"}};
  json tmpl = {{"spec", {{"containers", {c}}, {"terminationGracePeriodSeconds", 5}}}};
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"replicaSpecs",
             {{"Chief", {{"replicas", 1}, {"template", tmpl}}},
              {"Worker", {{"replicas", 3}, {"template", tmpl}}}}}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"operator_bench: N TrainingJobs x 4 pods on the fake API server"};
  int jobs = 1000, workers = 4, idle_seconds = 30;
  app.add_option("--jobs", jobs, "TrainingJobs to create");
  app.add_option("--workers", workers, "operator reconcile workers");
  app.add_option("--idle-seconds", idle_seconds, "seconds to count writes once converged");
  CLI11_PARSE(app, argc, argv);

  longhaul::fakeapi::Options so;
  so.default_node_name = "node-1";
  so.event_history_size = 500000;
  longhaul::fakeapi::FakeApiServer server(so);
  server.start();
  const fs::path dir = fs::temp_directory_path() / ("operator-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);
  server.write_kubeconfig(dir / "kubeconfig", "default");
  for (int i = 0; i < jobs; ++i) server.create(kJobs, "default", job("bench-" + std::to_string(i)));

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
  const auto t0 = std::chrono::steady_clock::now();
  server.clear_requests();
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open((dir / "operator.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string a1 = "--kubeconfig=" + (dir / "kubeconfig").string();
    const std::string a2 = "--metrics-port=" + std::to_string(metrics_port);
    const std::string a3 = "--health-port=" + std::to_string(health_port);
    const std::string a4 = "--workers=" + std::to_string(workers);
    execl(LONGHAUL_OPERATOR_BINARY, LONGHAUL_OPERATOR_BINARY, a1.c_str(), a2.c_str(), a3.c_str(),
          a4.c_str(), "--leader-elect=false", "--qps=0", "--bind-address=127.0.0.1",
          "--log-level=warning", static_cast<char*>(nullptr));
    _exit(127);
  }

  auto converged = [&] {
    int ok = 0;
    for (const json& j : server.list(kJobs, "default")) {
      const json s = j.value("status", json::object());
      if (s.value("phase", "") == "Running" && s.value("ready", "") == "4/4") ++ok;
    }
    return ok == jobs;
  };
  // Polled twice a second: listing every job on each store change would load the server.
  bool done = false;
  for (auto deadline = t0 + std::chrono::minutes(15);
       !(done = converged()) && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(500ms);
  }
  const double converge_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t requests = server.count_requests();
  const size_t writes = server.count_requests({.write = true});

  // Let the tail drain (the no-op reconciles that follow the last status writes, their Events)
  // before the idle window: the operator's work-queue depth must read 0 twice, 1 s apart.
  auto queue_depth = [&] {
    std::istringstream m(longhaul::testing::http_get(metrics_port, "/metrics").body);
    for (std::string line; std::getline(m, line);) {
      if (line.rfind("longhaul_operator_workqueue_depth ", 0) == 0) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return -1.0;
  };
  for (int quiet = 0, tries = 0; quiet < 2 && tries < 120; ++tries) {
    quiet = queue_depth() == 0 ? quiet + 1 : 0;
    std::this_thread::sleep_for(1s);  // sampling interval of the queue-depth gauge
  }
  server.clear_requests();
  const long rss_converged = status_kib(pid, "VmRSS:");
  std::this_thread::sleep_for(std::chrono::seconds(idle_seconds));  // the measured idle window
  const size_t idle_writes = server.count_requests({.write = true});
  const size_t idle_requests = server.count_requests();
  std::map<std::string, int> idle_by_kind;
  for (const auto& r : server.requests()) ++idle_by_kind[r.verb + " " + r.resource];

  // Reconcile latency from the operator's own histogram.
  std::map<double, double> buckets;
  double reconciles = 0;
  std::istringstream metrics(longhaul::testing::http_get(metrics_port, "/metrics").body);
  for (std::string line; std::getline(metrics, line);) {
    const std::string prefix = "longhaul_operator_reconcile_duration_seconds_bucket{le=\"";
    if (line.rfind(prefix, 0) == 0) {
      const auto q = line.find('"', prefix.size());
      const std::string le = line.substr(prefix.size(), q - prefix.size());
      buckets[le == "+Inf" ? INFINITY : std::stod(le)] =
          std::stod(line.substr(line.rfind(' ') + 1));
    }
    if (line.rfind("longhaul_operator_reconcile_duration_seconds_count", 0) == 0) {
      reconciles = std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  const long rss = status_kib(pid, "VmRSS:"), hwm = status_kib(pid, "VmHWM:");
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  stop = true;
  kubelet.join();
  server.stop();

  std::printf("operator_bench: %d TrainingJobs x 4 pods, %d workers, fake API server in-process\n",
              jobs, workers);
  std::printf("| metric                                   | value        |\n");
  std::printf("|------------------------------------------|--------------|\n");
  std::printf("| converged                                | %-12s |\n",
              done ? "yes" : "NO (15 min)");
  std::printf("| time to converge (s)                     | %12.1f |\n", converge_s);
  std::printf("| reconciles                               | %12.0f |\n", reconciles);
  std::printf("| reconcile p50 (ms)                       | %12.2f |\n",
              1000 * quantile(buckets, 0.5));
  std::printf("| reconcile p99 (ms)                       | %12.2f |\n",
              1000 * quantile(buckets, 0.99));
  std::printf("| API requests while converging            | %12zu |\n", requests);
  std::printf("| API writes while converging              | %12zu |\n", writes);
  std::printf("| API writes/min once converged (target 0) | %12.1f |\n",
              60.0 * static_cast<double>(idle_writes) / idle_seconds);
  std::printf("| API requests/min once converged          | %12.1f |\n",
              60.0 * static_cast<double>(idle_requests) / idle_seconds);
  std::printf("| operator RSS converged / end (MiB)       | %5.1f / %5.1f |\n",
              rss_converged / 1024.0, rss / 1024.0);
  std::printf("| operator peak RSS (MiB)                  | %12.1f |\n", hwm / 1024.0);
  std::printf("| operator exit status on SIGTERM          | %12d |\n",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  for (const auto& [kind, n] : idle_by_kind) {
    std::printf("  idle requests: %-40s %d\n", kind.c_str(), n);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return done ? 0 : 1;
}
