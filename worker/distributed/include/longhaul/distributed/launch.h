// `longhaul-worker launch`: runs a data-parallel group on one machine, like
// `torchrun --standalone`.
//
//   longhaul-worker launch --replicas 3 --max-restarts 2 [--evaluator] -- train --config x.yaml
//
// starts `replicas` copies of the program with the arguments after `--`, each with a TF_CONFIG
// naming a chief and replicas-1 workers on 127.0.0.1 (plus an evaluator task when asked), and
// LONGHAUL_RESTART_ATTEMPT set to "<run id>-<attempt>" so every attempt rendezvous in a fresh
// folder. A `--metrics-port P` (P > 0) among the arguments becomes P + rank for each replica.
//
// Supervision:
//   - a child that exits non-zero makes the launcher stop the others (SIGTERM, then SIGKILL
//     after grace_secs) and wait for all of them;
//   - when the first failure is retryable (exit code >= 128: 138 aborted, killed by a signal)
//     and fewer than max_restarts restarts happened, the whole group is started again with the
//     next attempt: replicas resume together from the latest checkpoint;
//   - with replace_lost_replicas (the replicas run with supervisor.on_peer_loss: regroup), a
//     replica killed by a signal or preempted (a retryable code other than 138) while others
//     still run is replaced alone: the same rank, TF_CONFIG and attempt, so it joins the
//     survivors in place (worker/distributed/README.md, "Recovery in place"). Each replacement
//     counts as one restart. Exit 138 means the survivors gave up (regroup timeout): the whole
//     group restarts as above;
//   - SIGTERM / SIGINT to the launcher are forwarded to every child (no restart afterwards); a
//     second one sends SIGKILL. Children run in their own process group (a terminal's Ctrl-C
//     reaches them once, through the launcher) and get SIGTERM if the launcher dies;
//   - every child is reaped on every path.
// The exit code combines the children's: 0 when every replica finished; otherwise the first
// permanent failure's code (1-127), else, after a forwarded signal, 128 + that signal, else
// the last retryable code once restarts are exhausted. The evaluator (if any) runs once across
// restarts; it is stopped with SIGTERM when training fails and waited for when it succeeds.
//
// Thread-safety: run_launch blocks SIGTERM/SIGINT/SIGCHLD in the calling thread and must be
// called from the main thread of a process with no other threads.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace longhaul::dist {

struct LaunchOptions {
  int replicas = 1;
  int max_restarts = 3;
  bool evaluator = false;
  std::filesystem::path program;  // default: this executable (/proc/self/exe)
  std::vector<std::string> args;  // the child's arguments, e.g. {"train", "--config", "x.yaml"}
  std::string host = "127.0.0.1";
  double grace_secs = 30;              // SIGTERM -> SIGKILL delay when stopping children
  std::string run_id;                  // attempt prefix; default "launch-<unix seconds>-<pid>"
  bool replace_lost_replicas = false;  // see above
};

struct LaunchResult {
  int exit_code = 0;
  int restarts = 0;      // group restarts performed
  int replacements = 0;  // single replicas replaced in place
};

// Throws InvalidArgument for bad options; child failures are reported in the result.
LaunchResult run_launch(const LaunchOptions& options);

}  // namespace longhaul::dist
