// SignalHandler: SIGTERM/SIGINT/SIGHUP -> final checkpoint + clean stop. The signal handler itself
// only writes the signal number to a self-pipe (write(2) is async-signal-safe); the watcher thread
// reads it and talks to the Supervisor.
#include "longhaul/supervisor/signals.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/supervisor/supervisor.h"

namespace longhaul::supervisor {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<bool> g_installed{false};

extern "C" void longhaul_on_signal(int signo) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(signo);
  ssize_t rc = ::write(g_pipe[1], &b, 1);
  (void)rc;
  errno = saved;
}

}  // namespace

SignalHandler::SignalHandler(std::vector<int> signals, double exit_deadline_secs)
    : signals_(std::move(signals)), exit_deadline_secs_(exit_deadline_secs) {
  install();
}

SignalHandler::SignalHandler(Supervisor& supervisor, std::vector<int> signals,
                             double exit_deadline_secs)
    : signals_(std::move(signals)), exit_deadline_secs_(exit_deadline_secs) {
  install();
  attach(supervisor);
}

void SignalHandler::install() {
  if (g_installed.exchange(true)) {
    throw FailedPrecondition("only one SignalHandler may exist at a time in a process");
  }
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) {
    g_installed = false;
    throw_errno("cannot create the signal self-pipe", "", errno);
  }
  ::fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);  // a full pipe must never block a handler
  watcher_ = std::thread([this] { watch(); });
  previous_.resize(signals_.size());
  for (size_t i = 0; i < signals_.size(); ++i) {
    struct sigaction sa {};
    sa.sa_handler = longhaul_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(signals_[i], &sa, &previous_[i]);
  }
}

SignalHandler::~SignalHandler() {
  for (size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
  unsigned char stop = 0;
  while (::write(g_pipe[1], &stop, 1) < 0 && errno == EINTR) {
  }
  if (watcher_.joinable()) watcher_.join();
  ::close(g_pipe[0]);
  ::close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
  g_installed = false;
}

void SignalHandler::attach(Supervisor& supervisor) {
  MutexLock lock(mu_);
  supervisor_ = &supervisor;
  if (const int signo = received_.load(); signo != 0) deliver(supervisor, signo);
}

void SignalHandler::detach() {
  MutexLock lock(mu_);
  supervisor_ = nullptr;
}

double SignalHandler::seconds_since_signal() const {
  const int64_t at = received_at_ns_.load();
  if (at == 0) return 0;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  return static_cast<double>(now - at) * 1e-9;
}

void SignalHandler::deliver(Supervisor& supervisor, int signo) {
  supervisor.request_checkpoint();
  supervisor.request_stop(
      std::make_exception_ptr(Cancelled(std::string("stopped by ") + strsignal(signo))));
}

void SignalHandler::watch() {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> deadline;
  while (true) {
    int timeout_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    struct pollfd pfd {
      g_pipe[0], POLLIN, 0
    };
    int rc = ::poll(&pfd, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      LH_LOG(ERROR) << "still running " << exit_deadline_secs_
                    << " s after the stop signal (the grace period): exiting without a final "
                       "checkpoint; a restart resumes from the last committed one"
                    << kv("exit_code", kAbortedExitCode);
      std::_Exit(kAbortedExitCode);
    }
    unsigned char b = 0;
    ssize_t n = ::read(g_pipe[0], &b, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || b == 0) return;
    int signo = b;
    int expected = 0;
    if (!received_.compare_exchange_strong(expected, signo)) {
      LH_LOG(ERROR) << "second signal while stopping: exiting at once without a final "
                       "checkpoint; a restart resumes from the last committed one"
                    << kv("signal", strsignal(signo)) << kv("exit_code", kAbortedExitCode);
      std::_Exit(kAbortedExitCode);
    }
    received_at_ns_.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
    LH_LOG(WARNING) << "signal received: taking a final checkpoint and stopping"
                    << kv("signal", strsignal(signo))
                    << kv("grace_period_secs", exit_deadline_secs_);
    if (exit_deadline_secs_ > 0) {
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(exit_deadline_secs_));
    }
    MutexLock lock(mu_);
    if (supervisor_ != nullptr) deliver(*supervisor_, signo);
  }
}

}  // namespace longhaul::supervisor
