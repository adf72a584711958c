// longhaul-local-cluster: one command that runs a TrainingJob manifest on this machine — the fake
// Kubernetes API server, the longhaul-operator binary and a local kubelet that runs the pods as
// local processes — and shows it: job status changes and each pod's progress lines.
//
//   longhaul-local-cluster [--manifest examples/trainingjob-tiny.yaml] [--root local-cluster]
//       [--nodes 2] [--api-port 0] [--operator-binary PATH] [--bin-dir DIR] [--keep-running]
//       [--verbose]
//
// While it runs: `kubectl --kubeconfig <root>/kubeconfig get tj,pods` works against it; lines
// appended to <root>/control are commands for the kubelet:
//   preempt <pod> | preempt <namespace>/<pod> [reason]
//   lose-node <node> [evict-after-seconds]
//   add-node <node>
// Logs: <root>/logs/<pod>.log, <root>/logs/operator.log; the shared logdir of job J is
// <root>/pvc/default/J-logdir (point TensorBoard at it).
//
// Exit: 0 once every applied TrainingJob Succeeded, 1 when one Failed (or on errors); with
// --keep-running it stays up until SIGINT/SIGTERM (exit 0). Every process it started is stopped.
#include <csignal>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include <CLI/CLI.hpp>
#include <pthread.h>

#include <longhaul/base/error.h>
#include <longhaul/base/log.h>
#include <longhaul/e2e/local_cluster.h>

namespace {

using namespace longhaul;
namespace fs = std::filesystem;
using json = nlohmann::json;

std::mutex print_mu;
void print(const std::string& line) {
  std::lock_guard lock(print_mu);
  std::cout << line << std::endl;
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

// A one-line summary of a TrainingJob's status.
std::string summary(const json& job) {
  const json st = job.value("status", json::object());
  std::ostringstream out;
  out << "phase=" << st.value("phase", "-") << " ready=" << st.value("ready", "-")
      << " restarts=" << st.value("restartCount", 0)
      << " preemptions=" << st.value("preemptionCount", 0)
      << " failures=" << st.value("failureBudget", std::to_string(st.value("failureCount", 0)))
      << " attempt=" << st.value("restartAttempt", 0) << " chief=" << st.value("chiefPod", "-");
  // The chief's progress, when its metrics port is declared (status.progress).
  if (const json progress = st.value("progress", json::object()); progress.contains("steps")) {
    out << " step=" << progress.value("steps", "")
        << " last-ckpt-step=" << progress.value("lastCheckpointStep", int64_t{0});
  }
  // The newest condition says why.
  std::string latest_time, latest;
  for (const json& c : st.value("conditions", json::array())) {
    const std::string t = c.value("lastTransitionTime", "");
    if (t >= latest_time) {
      latest_time = t;
      latest = c.value("type", "") + "=" + c.value("status", "") + " " + c.value("reason", "") +
               ": " + c.value("message", "");
    }
  }
  if (!latest.empty()) out << " | " << latest;
  return out.str();
}

bool is_progress(const std::string& line) {
  return line.rfind("step ", 0) == 0 || line.rfind("longhaul-worker:", 0) == 0 ||
         line.rfind("[local-kubelet]", 0) == 0;
}

void control(e2e::LocalCluster& cluster, const std::string& line) {
  if (kubelet::run_control_command(cluster.kubelet(), line).empty()) return;
  print(timestamp() + " [control] " + line);
}

int run(int argc, char** argv) {
  CLI::App app{"longhaul-local-cluster: run a TrainingJob manifest on this machine"};
  std::vector<std::string> manifests;
  std::string root = "local-cluster", operator_binary = LONGHAUL_DEFAULT_OPERATOR;
  std::vector<std::string> bin_dirs;
  int nodes = 2, api_port = 0;
  bool keep_running = false, verbose = false;
  app.add_option("--manifest", manifests, "YAML manifest to apply; repeatable")
      ->check(CLI::ExistingFile);
  app.add_option("--root", root, "folder for kubeconfig, logs/, pvc/, pods/, control")
      ->capture_default_str();
  app.add_option("--nodes", nodes, "local nodes the kubelet plays")->check(CLI::Range(1, 64));
  app.add_option("--api-port", api_port, "port of the fake API server (0: a free one)");
  app.add_option("--operator-binary", operator_binary, "the longhaul-operator to run")
      ->capture_default_str();
  app.add_option("--bin-dir", bin_dirs,
                 "folder where pods' programs (longhaul-worker) are found first; repeatable "
                 "(default: this build's worker/cli)");
  app.add_flag("--keep-running", keep_running, "stay up after the jobs finish (until Ctrl-C)");
  app.add_flag("--verbose", verbose, "print every pod log line, not only progress lines");
  CLI11_PARSE(app, argc, argv);
  if (manifests.empty()) manifests.push_back(LONGHAUL_DEFAULT_MANIFEST);
  if (bin_dirs.empty()) bin_dirs.push_back(LONGHAUL_DEFAULT_WORKER_DIR);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  e2e::LocalClusterOptions o;
  o.root = root;
  o.operator_binary = operator_binary;
  for (const std::string& d : bin_dirs) o.bin_dirs.emplace_back(fs::absolute(d));
  o.nodes.clear();
  for (int i = 0; i < nodes; ++i) o.nodes.push_back("local-node-" + std::to_string(i));
  o.api_port = api_port;
  o.on_log_line = [verbose](const std::string& pod, const std::string& line) {
    if (verbose || is_progress(line)) print(timestamp() + " [" + pod + "] " + line);
  };
  e2e::LocalCluster cluster(o);
  cluster.start();
  const fs::path control_file = fs::absolute(root) / "control";
  std::ofstream(control_file, std::ios::app).flush();
  print("longhaul local cluster: API " + cluster.api().url() + " | kubeconfig " +
        cluster.kubeconfig().string() + " | logs " + (fs::absolute(root) / "logs").string() +
        " | control " + control_file.string());

  std::vector<std::pair<std::string, std::string>> jobs;  // namespace, name
  for (const std::string& m : manifests) {
    for (const json& created : cluster.apply_file(m)) {
      const json& md = created["metadata"];
      print(timestamp() + " applied " + created.value("kind", "") + " " +
            md.value("namespace", "") + "/" + md.value("name", ""));
      if (created.value("kind", "") == "TrainingJob") {
        jobs.emplace_back(md.value("namespace", "default"), md.value("name", ""));
      }
    }
  }

  std::ifstream control_in(control_file);
  std::map<std::string, std::string> last;
  int exit_code = 0;
  timespec tick{0, 200'000'000};
  while (true) {
    siginfo_t info;
    if (sigtimedwait(&signals, &info, &tick) > 0) {
      print(timestamp() + " stopping (signal " + std::to_string(info.si_signo) + ")");
      break;
    }
    std::string line;
    while (std::getline(control_in, line)) {
      try {
        control(cluster, line);
      } catch (const std::exception& e) {
        print(timestamp() + " [control] failed: " + line + ": " + e.what());
      }
    }
    control_in.clear();
    bool all_done = !jobs.empty();
    bool any_failed = false;
    for (const auto& [ns, name] : jobs) {
      auto job = cluster.api().try_get("trainingjobs.longhaul.dev", ns, name);
      if (!job) continue;
      const std::string s = summary(*job);
      if (last[name] != s) {
        last[name] = s;
        print(timestamp() + " [job " + name + "] " + s);
      }
      const std::string phase = job->value("status", json::object()).value("phase", "");
      all_done &= phase == "Succeeded" || phase == "Failed";
      any_failed |= phase == "Failed";
    }
    if (!cluster.operator_running()) {
      print(timestamp() + " the operator exited; see " + cluster.operator_log().string());
      exit_code = 1;
      break;
    }
    if (all_done && !keep_running) {
      exit_code = any_failed ? 1 : 0;
      print(timestamp() + (any_failed ? " a job failed" : " all jobs succeeded") +
            "; logdirs under " + (fs::absolute(root) / "pvc").string());
      break;
    }
  }
  cluster.stop();
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "longhaul-local-cluster: " << e.what() << "\n";
    return 1;
  }
}
