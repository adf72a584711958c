// longhaul-local-kubelet: runs the pods of an API server as local processes (see
// longhaul/kubelet/local_kubelet.h for what it does and how containers map onto one machine).
//
//   longhaul-local-kubelet --kubeconfig /tmp/demo/kubeconfig --root /tmp/demo
//       [--node local-node-0 --node local-node-1] [--no-schedule] [--namespace ns]
//       [--selector longhaul.dev/job-name] [--bin-dir build/worker/cli] [--entrypoint IMG=CMD]
//       [--control /tmp/demo/control]
//
// Control (for demos): each line appended to the --control file is one command:
//   preempt <namespace>/<pod> [reason]     DisruptionTarget + SIGTERM + grace + SIGKILL
//                                          (a bare <pod> when its name is unique here)
//   lose-node <node> [evict-after-seconds] SIGKILL the node's processes, stop serving it
//   add-node <node>                        a new live node
// SIGTERM or SIGINT: stop every pod process (SIGTERM, SIGKILL after --stop-grace), exit 0.
#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <pthread.h>

#include <longhaul/base/error.h>
#include <longhaul/base/log.h>
#include <longhaul/kube/config.h>
#include <longhaul/kube/http_client.h>
#include <longhaul/kubelet/local_kubelet.h>

namespace {

using namespace longhaul;

int run(int argc, char** argv) {
  CLI::App app{"longhaul-local-kubelet: runs an API server's pods as local processes"};
  std::string kubeconfig, context, control_file;
  kubelet::KubeletOptions o;
  std::vector<std::string> nodes, bin_dirs, entrypoints;
  bool no_schedule = false;
  double stop_grace = 10;
  app.add_option("--kubeconfig", kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)");
  app.add_option("--context", context, "kubeconfig context (default: current-context)");
  app.add_option("--root", o.root, "folder for pvc/, logs/ and pods/")->required();
  app.add_option("--node", nodes,
                 "node name this kubelet plays; repeatable (default local-node-0)");
  app.add_flag("--no-schedule", no_schedule, "do not bind pods that have no spec.nodeName");
  app.add_option("--namespace", o.ns, "only pods of this namespace (default: all)");
  app.add_option("--selector", o.label_selector, "only pods matching this label selector");
  app.add_option("--bin-dir", bin_dirs, "folder searched first for programs; repeatable");
  app.add_option("--entrypoint", entrypoints,
                 "IMAGE=COMMAND: the program of containers of IMAGE (or its basename) that give "
                 "no command; repeatable");
  app.add_option("--port-base", o.port_base,
                 "first local port for TF_CONFIG addresses (0: free ephemeral ports)");
  app.add_option("--stop-grace", stop_grace, "seconds between SIGTERM and SIGKILL on shutdown");
  app.add_option("--control", control_file, "file whose appended lines are control commands");
  CLI11_PARSE(app, argc, argv);
  if (!nodes.empty()) o.nodes = nodes;
  o.schedule = !no_schedule;
  for (const std::string& d : bin_dirs) o.bin_dirs.emplace_back(d);
  for (const std::string& e : entrypoints) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos)
      throw InvalidArgument("--entrypoint " + e + ": want IMAGE=COMMAND");
    o.entrypoints[e.substr(0, eq)] = e.substr(eq + 1);
  }
  o.stop_grace = std::chrono::milliseconds(static_cast<int64_t>(stop_grace * 1000));

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const kube::ClusterConfig config = kube::load_default_config(kubeconfig, context);
  kube::HttpClientOptions co;
  co.qps = 0;
  co.user_agent = "longhaul-local-kubelet";
  auto client = std::make_shared<kube::HttpClient>(config, co);
  kubelet::LocalKubelet k(client, o);
  k.start();

  // The control file is followed by a thread that polls it (a FIFO would block the shutdown).
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread follower;
  if (!control_file.empty()) {
    std::ofstream(control_file, std::ios::app).flush();  // exists from now on
    follower = std::thread([&] {
      std::ifstream in(control_file);
      std::string line;
      std::unique_lock lock(mu);
      while (!stopping) {
        lock.unlock();
        while (std::getline(in, line)) {
          try {
            const std::string done = kubelet::run_control_command(k, line);
            if (!done.empty()) {
              LH_LOG(INFO) << "control" << kv("done", done);
            }
          } catch (const std::exception& e) {
            LH_LOG(ERROR) << "control command failed" << kv("line", line) << kv("error", e.what());
          }
        }
        in.clear();  // at EOF: wait for more lines
        lock.lock();
        cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping; });
      }
    });
  }
  int sig = 0;
  sigwait(&signals, &sig);
  LH_LOG(INFO) << "local kubelet stopping" << kv("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  {
    std::lock_guard lock(mu);
    stopping = true;
  }
  cv.notify_all();
  if (follower.joinable()) follower.join();
  k.stop();
  client->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "longhaul-local-kubelet: " << e.what() << "\n";
    return 1;
  }
}
