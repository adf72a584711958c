// `longhaul-worker launch`: a local data-parallel group with restarts. See launch.h.
#include "longhaul/distributed/launch.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"

extern char** environ;

namespace longhaul::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int rank = -1;  // -1: the evaluator
  std::optional<int> code;
};

// A free TCP port on `host` (informational: Gloo picks its own ports; TF_CONFIG wants one).
int free_port(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string tf_config(const std::vector<std::string>& addresses, const std::string& evaluator,
                      const std::string& type, int index) {
  nlohmann::json cluster;
  cluster["chief"] = {addresses[0]};
  if (addresses.size() > 1) {
    cluster["worker"] = std::vector<std::string>(addresses.begin() + 1, addresses.end());
  }
  if (!evaluator.empty()) cluster["evaluator"] = {evaluator};
  return nlohmann::json{{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}}.dump();
}

// The child's arguments: `--metrics-port P` / `--metrics-port=P` become P + offset.
std::vector<std::string> child_args(const std::vector<std::string>& args, int offset) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    auto bump = [&](const std::string& v) {
      try {
        const int p = std::stoi(v);
        return p > 0 ? std::to_string(p + offset) : v;
      } catch (const std::exception&) {
        return v;
      }
    };
    if (args[i] == "--metrics-port" && i + 1 < args.size()) {
      out.push_back(args[i]);
      out.push_back(bump(args[++i]));
    } else if (args[i].rfind("--metrics-port=", 0) == 0) {
      out.push_back("--metrics-port=" + bump(args[i].substr(15)));
    } else {
      out.push_back(args[i]);
    }
  }
  return out;
}

class Launcher {
 public:
  explicit Launcher(const LaunchOptions& o) : o_(o) {
    program_ = o_.program.empty() ? std::filesystem::path("/proc/self/exe") : o_.program;
    if (o_.program.empty()) {
      std::error_code ec;
      auto resolved = std::filesystem::read_symlink("/proc/self/exe", ec);
      if (!ec) program_ = resolved;
    }
    run_id_ = o_.run_id.empty() ? "launch-" + std::to_string(std::time(nullptr)) + "-" +
                                      std::to_string(::getpid())
                                : o_.run_id;
    sigemptyset(&mask_);
    sigaddset(&mask_, SIGCHLD);
    sigaddset(&mask_, SIGTERM);
    sigaddset(&mask_, SIGINT);
    ::sigprocmask(SIG_BLOCK, &mask_, &old_mask_);
  }

  ~Launcher() {
    // Every path ends here: no child outlives the launcher.
    for (auto& c : children_) {
      if (!c.code) ::kill(c.pid, SIGKILL);
    }
    for (auto& c : children_) {
      if (!c.code) {
        int status = 0;
        while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
    }
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  LaunchResult run() {
    LaunchResult result;
    std::string evaluator_address;
    if (o_.evaluator) evaluator_address = o_.host + ":" + std::to_string(free_port(o_.host));
    for (int attempt = 0;; ++attempt) {
      addresses_.clear();
      for (int r = 0; r < o_.replicas; ++r) {
        addresses_.push_back(o_.host + ":" + std::to_string(free_port(o_.host)));
      }
      const std::string attempt_id = run_id_ + "-" + std::to_string(attempt);
      LH_LOG(INFO) << "launching replicas" << kv("replicas", o_.replicas)
                   << kv("attempt", attempt_id) << kv("program", program_.string());
      if (o_.evaluator && !evaluator_started_) {
        spawn(-1, tf_config(addresses_, evaluator_address, "evaluator", 0), attempt_id);
        evaluator_started_ = true;
      }
      evaluator_address_ = evaluator_address;
      for (int r = 0; r < o_.replicas; ++r) spawn_replica(r, attempt_id);
      attempt_id_ = attempt_id;
      const std::optional<int> failure = supervise_group(result);
      if (forwarded_ != 0) {
        stop_evaluator(SIGTERM);
        result.exit_code = combined_after_signal();
        return result;
      }
      if (!failure) {
        wait_evaluator();
        result.exit_code = evaluator_code_.value_or(0);
        return result;
      }
      const bool retryable = *failure >= 128;
      if (!retryable || result.restarts + result.replacements >= o_.max_restarts) {
        LH_LOG(ERROR) << (retryable ? "giving up after the last allowed restart"
                                    : "a replica failed permanently; not restarting")
                      << kv("exit_code", *failure) << kv("restarts", result.restarts);
        stop_evaluator(SIGTERM);
        result.exit_code = *failure;
        return result;
      }
      ++result.restarts;
      LH_LOG(WARNING) << "a replica failed with a retryable code; restarting the whole group"
                      << kv("exit_code", *failure)
                      << kv("restart", result.restarts + result.replacements)
                      << kv("max_restarts", o_.max_restarts);
      group_.clear();
    }
  }

 private:
  void spawn_replica(int rank, const std::string& attempt_id) {
    spawn(rank,
          tf_config(addresses_, evaluator_address_, rank == 0 ? "chief" : "worker",
                    rank == 0 ? 0 : rank - 1),
          attempt_id);
  }

  void spawn(int rank, const std::string& config, const std::string& attempt_id) {
    std::vector<std::string> args = child_args(o_.args, rank < 0 ? 0 : rank);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kvp = *e;
      const std::string key = kvp.substr(0, kvp.find('='));
      if (key == "TF_CONFIG" || key == "LONGHAUL_RESTART_ATTEMPT" || key == "LONGHAUL_RANK" ||
          key == "LONGHAUL_WORLD_SIZE" || key == "LONGHAUL_REPLICA_TYPE" ||
          key == "LONGHAUL_REPLICA_INDEX") {
        continue;
      }
      env_strings.push_back(kvp);
    }
    env_strings.push_back("TF_CONFIG=" + config);
    env_strings.push_back("LONGHAUL_RESTART_ATTEMPT=" + attempt_id);
    env_strings.push_back(std::string("LONGHAUL_REPLICA_TYPE=") + (rank < 0    ? "evaluator"
                                                                   : rank == 0 ? "chief"
                                                                               : "worker"));
    env_strings.push_back("LONGHAUL_REPLICA_INDEX=" + std::to_string(rank <= 0 ? 0 : rank - 1));
    std::vector<char*> argv{const_cast<char*>(program_.c_str())};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno("fork for a replica of", program_.string(), errno);
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(143);
      ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      ::execve(program_.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    children_.push_back(Child{pid, rank, std::nullopt});
    if (rank < 0) return;
    for (size_t& i : group_) {
      if (children_[i].rank == rank) {  // a replacement takes its predecessor's place
        i = children_.size() - 1;
        return;
      }
    }
    group_.push_back(children_.size() - 1);
  }

  // With replace_lost_replicas: replaces replicas that were lost (killed by a signal or
  // preempted) while others still run, within the restart budget. True when every failed
  // replica was replaced (the group goes on).
  bool replace_lost(LaunchResult& result) {
    if (!o_.replace_lost_replicas || o_.replicas < 2) return false;
    std::vector<int> lost;
    bool others_running = false;
    for (size_t i : group_) {
      const auto& c = children_[i];
      if (!c.code) {
        others_running = true;
      } else if (*c.code != 0) {
        if (*c.code < 128 || *c.code == 138) return false;  // permanent, or the group gave up
        lost.push_back(c.rank);
      }
    }
    if (lost.empty() || !others_running) return false;
    if (result.restarts + result.replacements + static_cast<int>(lost.size()) > o_.max_restarts) {
      return false;
    }
    for (int rank : lost) {
      ++result.replacements;
      LH_LOG(WARNING) << "a replica was lost; starting a replacement that joins the others in "
                         "place"
                      << kv("rank", rank) << kv("replacement", result.replacements)
                      << kv("max_restarts", o_.max_restarts);
      spawn_replica(rank, attempt_id_);
    }
    return true;
  }

  bool group_running() const {
    for (size_t i : group_) {
      if (!children_[i].code) return true;
    }
    return false;
  }

  void signal_group(int sig) {
    for (size_t i : group_) {
      if (!children_[i].code) ::kill(children_[i].pid, sig);
    }
  }

  void stop_evaluator(int sig) {
    for (auto& c : children_) {
      if (c.rank < 0 && !c.code) ::kill(c.pid, sig);
    }
    wait_evaluator(Clock::now() + grace());
  }

  // Handles one signal (or times out after `timeout`) and reaps whatever exited.
  void pump(std::chrono::milliseconds timeout) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000),
                static_cast<long>((timeout.count() % 1000) * 1000000)};
    siginfo_t info;
    const int sig = ::sigtimedwait(&mask_, &info, &ts);
    if (sig == SIGTERM || sig == SIGINT) {
      if (forwarded_ == 0) {
        forwarded_ = sig;
        LH_LOG(INFO) << "forwarding a signal to every replica" << kv("signal", sig);
        for (auto& c : children_) {
          if (!c.code) ::kill(c.pid, sig);
        }
        kill_deadline_ = Clock::now() + grace();
      } else {
        LH_LOG(WARNING) << "second signal: killing every replica";
        for (auto& c : children_) {
          if (!c.code) ::kill(c.pid, SIGKILL);
        }
      }
    }
    reap();
  }

  void reap() {
    while (true) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (auto& c : children_) {
        if (c.pid != pid) continue;
        c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        LH_LOG(INFO) << (c.rank < 0 ? "evaluator exited" : "replica exited") << kv("rank", c.rank)
                     << kv("exit_code", *c.code);
        if (c.rank < 0) evaluator_code_ = c.code;
      }
    }
  }

  std::chrono::milliseconds grace() const {
    return std::chrono::milliseconds(static_cast<int64_t>(o_.grace_secs * 1000));
  }

  // Runs until every replica of the group exited; returns the first failure's exit code.
  std::optional<int> supervise_group(LaunchResult& result) {
    std::optional<int> failure;
    bool stopping = false;
    while (group_running()) {
      pump(std::chrono::milliseconds(200));
      if (!stopping && forwarded_ == 0 && replace_lost(result)) continue;
      if (!stopping && forwarded_ == 0) {
        for (size_t i : group_) {
          const auto& c = children_[i];
          if (c.code && *c.code != 0) {
            failure = *c.code;
            stopping = true;
            LH_LOG(WARNING) << "a replica failed; stopping the others" << kv("rank", c.rank)
                            << kv("exit_code", *c.code);
            signal_group(SIGTERM);
            kill_deadline_ = Clock::now() + grace();
            break;
          }
        }
      }
      if ((stopping || forwarded_ != 0) && Clock::now() > kill_deadline_) {
        signal_group(SIGKILL);
        kill_deadline_ = Clock::time_point::max();
      }
    }
    if (!failure) {
      for (size_t i : group_) {
        if (*children_[i].code != 0) {
          failure = *children_[i].code;
          break;
        }
      }
    }
    return failure;
  }

  // Waits for the evaluator; SIGKILL at `deadline` (or grace_secs after a forwarded signal).
  void wait_evaluator(Clock::time_point deadline = Clock::time_point::max()) {
    bool killed = false;
    while (true) {
      bool running = false;
      for (const auto& c : children_) running = running || (c.rank < 0 && !c.code);
      if (!running) return;
      pump(std::chrono::milliseconds(200));
      if (forwarded_ != 0 && deadline == Clock::time_point::max()) {
        deadline = Clock::now() + grace();
      }
      if (!killed && Clock::now() > deadline) {
        for (auto& c : children_) {
          if (c.rank < 0 && !c.code) ::kill(c.pid, SIGKILL);
        }
        killed = true;
      }
    }
  }

  int combined_after_signal() const {
    for (size_t i : group_) {
      const int code = *children_[i].code;
      if (code >= 1 && code <= 127) return code;
    }
    return 128 + forwarded_;
  }

  const LaunchOptions& o_;
  std::filesystem::path program_;
  std::string run_id_;
  sigset_t mask_, old_mask_;
  std::vector<Child> children_;
  std::vector<size_t> group_;  // indices into children_ of the current attempt's replicas
  std::vector<std::string> addresses_;
  std::string evaluator_address_;
  std::string attempt_id_;  // the current attempt's: a replacement joins the same one
  bool evaluator_started_ = false;
  std::optional<int> evaluator_code_;
  int forwarded_ = 0;
  Clock::time_point kill_deadline_ = Clock::time_point::max();
};

}  // namespace

LaunchResult run_launch(const LaunchOptions& options) {
  if (options.replicas < 1) throw InvalidArgument("launch --replicas must be >= 1");
  if (options.max_restarts < 0) throw InvalidArgument("launch --max-restarts must be >= 0");
  if (options.args.empty()) {
    throw InvalidArgument(
        "launch needs the replica's command after --, e.g. `launch --replicas 2 -- train "
        "--config x.yaml`");
  }
  Launcher launcher(options);
  return launcher.run();
}

}  // namespace longhaul::dist
