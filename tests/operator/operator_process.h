// The longhaul-operator binary (LONGHAUL_OPERATOR_BINARY, which the suite's CMake target
// defines) run as a child process, for the suites that test it as users run it: against the fake
// API server (binary_test.cc) and the real one (real_scenario_test.cc). Header-only.
//
// Thread-safety: one test thread owns an OperatorProcess. The child is killed (SIGKILL) and
// reaped when the object goes away, on every path.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/testing/loopback.h"

namespace longhaul::testing {

class OperatorProcess {
 public:
  // Starts the binary with `args` and the kubeconfig `dir`/kubeconfig; metrics and probes on
  // free loopback ports, identity `name`, --qps=0 unless `args` set a rate. Its stdout and
  // stderr are appended to `dir`/`name`.log.
  OperatorProcess(const std::filesystem::path& dir, const std::string& name,
                  std::vector<std::string> args)
      : metrics_port_(free_loopback_port()),
        health_port_(free_loopback_port()),
        log_(dir / (name + ".log")) {
    args.insert(args.begin(), LONGHAUL_OPERATOR_BINARY);
    args.push_back("--kubeconfig=" + (dir / "kubeconfig").string());
    args.push_back("--metrics-port=" + std::to_string(metrics_port_));
    args.push_back("--health-port=" + std::to_string(health_port_));
    args.push_back("--bind-address=127.0.0.1");
    args.push_back("--identity=" + name);
    if (std::none_of(args.begin(), args.end(),
                     [](const std::string& a) { return a.rfind("--qps", 0) == 0; })) {
      args.push_back("--qps=0");
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~OperatorProcess() { kill_hard(); }
  OperatorProcess(const OperatorProcess&) = delete;
  OperatorProcess& operator=(const OperatorProcess&) = delete;

  void kill(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // SIGKILL, and waits for it to be gone.
  void kill_hard() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Waits for the process to exit; returns its exit status (128 + the signal when a signal
  // ended it), or -1 on timeout.
  int wait_exit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      // Polling a child's exit; the deadline bounds it.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  std::string metrics() { return http_get(metrics_port_, "/metrics").body; }
  int health(const std::string& path) { return http_get(health_port_, path).status; }
  bool ready() { return health("/readyz") == 200; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }
  std::string log() {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  int metrics_port_, health_port_;
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

}  // namespace longhaul::testing
