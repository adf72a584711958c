// SignalHandler: SIGTERM / SIGINT / SIGHUP to a final checkpoint and a clean stop of a
// Supervisor (supervisor.h), with an exit deadline. Implemented in signals.cc.
#pragma once

#include <atomic>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"

namespace longhaul::supervisor {

class Supervisor;

// Turns SIGTERM / SIGINT / SIGHUP into supervisor.request_checkpoint() + request_stop(Cancelled):
// a final checkpoint and a clean exit. The handler only writes the signal number to a self-pipe
// (async-signal-safe); a watcher thread does the rest.
//
// It may be installed before any Supervisor exists (start-up: config, data, model, rendezvous)
// and attached to one later: a signal received before attach() is delivered by attach(), and
// stop_requested() lets start-up code poll it. The exit deadline runs from the FIRST signal,
// whatever the process is doing then (loading data, waiting at a rendezvous, inside a long step,
// writing the final checkpoint, stopping services): with exit_deadline_secs > 0 a process still
// running that long after the first signal exits with kAbortedExitCode (138, retryable; the state
// file still names the last committed checkpoint). A second signal exits at once with
// kAbortedExitCode too, without a final checkpoint: 143/130 always mean "committed".
// One SignalHandler at a time per process; the destructor restores the previous handlers and
// joins the watcher.
inline constexpr int kAbortedExitCode = 138;

class SignalHandler {
 public:
  // Installs the handlers for `signals` with no Supervisor attached yet.
  explicit SignalHandler(std::vector<int> signals = {SIGTERM, SIGINT, SIGHUP},
                         double exit_deadline_secs = 0);
  // Installs the handlers and attaches `supervisor`.
  explicit SignalHandler(Supervisor& supervisor,
                         std::vector<int> signals = {SIGTERM, SIGINT, SIGHUP},
                         double exit_deadline_secs = 0);
  ~SignalHandler();
  SignalHandler(const SignalHandler&) = delete;
  SignalHandler& operator=(const SignalHandler&) = delete;

  // Signals go to `supervisor` from now on (one received earlier is delivered at once). detach()
  // (or destroying the handler) must happen before the supervisor is destroyed.
  void attach(Supervisor& supervisor);
  void detach();

  // The first signal received (0 when none): the worker exits 143 after SIGTERM.
  int signal_received() const { return received_.load(); }
  bool stop_requested() const { return received_.load() != 0; }
  // Seconds since the first signal (0 when none).
  double seconds_since_signal() const;
  double exit_deadline_secs() const { return exit_deadline_secs_; }

 private:
  void install();
  void watch();
  void deliver(Supervisor& supervisor, int signo);
  Mutex mu_;  // guards supervisor_
  Supervisor* supervisor_ GUARDED_BY(mu_) = nullptr;
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  double exit_deadline_secs_;
  std::atomic<int> received_{0};
  std::atomic<int64_t> received_at_ns_{0};  // steady clock
  std::thread watcher_;
};

}  // namespace longhaul::supervisor
