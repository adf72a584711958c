// LocalKubelet: runs the pods of a Kubernetes API server as local processes, so a whole
// TrainingJob — operator, pods, shared logdir, preemption, resume — runs on one machine.
//
// It uses only public API calls, through any kube::Client (HttpClient against the project's fake
// API server or a real cluster through a kubeconfig): list/watch pods (an Informer), create
// pods/<name>/binding (scheduling), merge-patch pods/<name>/status, delete pods.
//
// Nodes: one LocalKubelet plays one or more nodes (`nodes`, default {"local-node-0"}). It
// serves pods whose spec.nodeName is one of its live nodes, and (with `schedule`) binds pods that
// have no nodeName to the live node running the fewest pods (ties: first listed). Pods bound to
// other nodes are left alone. On a shared real cluster restrict it with `label_selector`
// (e.g. "longhaul.dev/job-name") and `schedule=false` plus pods that name the node.
//
// Pods: the first container runs as a local process (pod_command.h: command, env, mounts mapped
// to local directories, TF_CONFIG addresses mapped to 127.0.0.1 ports) in a new process group,
// stdout and stderr appended to `<root>/logs/<pod>.log`. Status is reported like a kubelet:
// Pending -> Running (conditions PodScheduled, Initialized, ContainersReady, Ready True;
// containerStatuses[0].state.running; podIP/hostIP 127.0.0.1) -> Succeeded (exit 0) or Failed
// (containerStatuses[0].state.terminated with exitCode, reason "Completed"/"Error", signal,
// startedAt, finishedAt, and the termination message: what the process wrote to the file named by
// $LONGHAUL_TERMINATION_MESSAGE_PATH, emptied before each start, at most 4096 bytes, the local
// stand-in for terminationMessagePath). restartPolicy Always/OnFailure restarts the process in
// place with exponential back-off (restartCount, lastState.terminated). A program that cannot be
// started ends Failed with exit code 127, reason StartError.
//
// Deletion: a pod with deletionTimestamp gets SIGTERM (to its process group), then SIGKILL once
// metadata.deletionGracePeriodSeconds has passed, then its final status and a DELETE with
// gracePeriodSeconds=0 (uid precondition) that finalizes it. A pod that vanished from the API
// while running is killed the same way (no API writes).
//
// Preemption (preempt()): the DisruptionTarget condition (status True, reason given, default
// PreemptionByScheduler) is written first, then SIGTERM, SIGKILL after the grace period
// (spec.terminationGracePeriodSeconds, default 30 s, or the override), then phase Failed with
// reason Preempted and the container's exit code. The pod object stays (the owner deletes it).
//
// Node loss (lose_node()): every process of the node gets SIGKILL at once and the node is dead
// for good: its pods are never written again (they stay Running, as on a dead node) and nothing
// is scheduled onto it. Optionally (`evict_after`) the kubelet then plays the node lifecycle
// controller: after that delay it writes DisruptionTarget (reason DeletionByTaintManager) on
// each of the node's pods and deletes them gracefully; nobody finalizes those deletions, so the
// pods stay Terminating until someone force-deletes them (the operator, after
// nodeLostTimeoutSeconds).
//
// Node objects: like a real kubelet it registers a Node per live node (Ready, 127.0.0.1, its
// capacity) and heartbeats it with a Lease in kube-node-lease (renewed every
// `node_heartbeat`, the Node status re-reported every `node_status_every` heartbeats), so a real
// control plane's node lifecycle controller and pod garbage collector treat its pods as
// running on a healthy node. A lost node stops heartbeating (the controller marks it NotReady);
// nodes are left registered on stop(), as a kubelet leaves them.
//
// Threads: the informer thread (events only wake the sync loop), one sync thread that does every
// API write, and one waiter thread per running process (blocking waitpid). stop() kills every
// process (SIGTERM, then SIGKILL after `stop_grace`), joins every thread and reaps every child;
// the destructor calls it. A kubelet is started once.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "longhaul/base/mutex.h"
#include "longhaul/base/thread_annotations.h"
#include "longhaul/kube/client.h"
#include "longhaul/kube/informer.h"
#include "longhaul/kubelet/pod_command.h"

namespace longhaul::kubelet {

struct KubeletOptions {
  std::filesystem::path root;  // <root>/pvc, <root>/logs, <root>/pods (created)
  std::vector<std::string> nodes = {"local-node-0"};
  bool schedule = true;  // bind pods without spec.nodeName to a live node
  std::string ns;        // "" = all namespaces
  std::string label_selector;
  std::vector<std::filesystem::path> bin_dirs;     // searched first for programs, prepended to PATH
  std::map<std::string, std::string> entrypoints;  // see CommandOptions
  int port_base = 0;                               // see PortMap
  std::chrono::milliseconds resync{1000};          // status/deadline re-check even without events
  std::chrono::milliseconds stop_grace{std::chrono::seconds(10)};
  std::chrono::milliseconds crash_backoff_initial{std::chrono::seconds(10)};
  std::chrono::milliseconds crash_backoff_max{std::chrono::minutes(5)};
  bool register_nodes = true;  // create/heartbeat Node objects and their Leases
  std::chrono::milliseconds node_heartbeat{std::chrono::seconds(10)};
  int node_status_every = 6;
  // Called with every line a pod writes (from the pod's log file), tagged with the pod name;
  // for the demo's progress output. Runs on the sync thread: must not block.
  std::function<void(const std::string& pod, const std::string& line)> on_log_line;
};

// What the kubelet knows about one pod it runs, for tests and the demo.
struct LocalPodInfo {
  std::string ns, name, uid, node;
  pid_t pid = -1;                // of the current (or last) process; -1 before the start
  bool running = false;          // a process is alive
  std::optional<int> exit_code;  // of the last process: code, or 128+signal
  int restart_count = 0;
  bool preempted = false;
  bool terminating = false;  // SIGTERM sent (deletion or preemption)
  bool lost = false;         // the node was lost
  std::filesystem::path log;
};

struct LoseNodeOptions {
  // Play the node lifecycle controller: evict (DisruptionTarget + graceful delete) the node's
  // pods after this delay. nullopt: the pods stay as they are.
  std::optional<std::chrono::milliseconds> evict_after;
  // gracePeriodSeconds of the eviction's delete (>= 1); nullopt: the pod's
  // terminationGracePeriodSeconds, as the real controller does.
  std::optional<int64_t> eviction_grace_seconds;
};

class LocalKubelet {
 public:
  LocalKubelet(std::shared_ptr<kube::Client> client, KubeletOptions options);
  ~LocalKubelet();  // stop()
  LocalKubelet(const LocalKubelet&) = delete;
  LocalKubelet& operator=(const LocalKubelet&) = delete;

  // Creates the folders, starts the informer and the sync thread. Throws FailedPrecondition when
  // called twice, Unavailable when the pod list does not sync within 30 s.
  void start() EXCLUDES(mu_);
  // Kills every process (SIGTERM, SIGKILL after stop_grace), joins every thread. Idempotent.
  // Pods are not written: they stay as last reported.
  void stop() EXCLUDES(mu_);

  // Preempts a running pod (see the file comment). Throws NotFound when this kubelet runs no live
  // process for it. `grace` overrides spec.terminationGracePeriodSeconds.
  void preempt(const std::string& ns, const std::string& name,
               const std::string& reason = "PreemptionByScheduler",
               std::optional<std::chrono::milliseconds> grace = std::nullopt) EXCLUDES(mu_);
  // Loses a node (see the file comment). Throws NotFound for a node this kubelet does not play.
  void lose_node(const std::string& node, LoseNodeOptions options = {}) EXCLUDES(mu_);
  // Adds a live node (e.g. a replacement for a lost one).
  void add_node(const std::string& node) EXCLUDES(mu_);
  std::vector<std::string> live_nodes() const EXCLUDES(mu_);

  std::optional<LocalPodInfo> pod(const std::string& ns, const std::string& name) const
      EXCLUDES(mu_);
  // "NS/POD" -> {NS, POD}. A bare "POD" names the one pod of that name this kubelet knows, in
  // whatever namespace; throws NotFound when it knows none, InvalidArgument when the name is
  // in several namespaces (the message lists them: write NS/POD).
  std::pair<std::string, std::string> resolve_pod(const std::string& ns_slash_pod) const
      EXCLUDES(mu_);
  std::vector<LocalPodInfo> pods() const EXCLUDES(mu_);
  // Blocks until `predicate` (called under no lock) is true, re-evaluating it after every local
  // change (process start/exit, status written, node lost). False on timeout.
  bool wait_for(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) const
      EXCLUDES(mu_);

  // <root>/logs/<pod>.log (<root>/logs/<namespace>_<pod>.log outside "default").
  std::filesystem::path log_path(const std::string& ns, const std::string& pod) const;
  const std::filesystem::path& root() const { return options_.root; }

 private:
  // Proc and PodState are reached only through pods_ and waiters_ (GUARDED_BY(mu_)), and the
  // functions taking a PodState& REQUIRE mu_; their own fields carry no GUARDED_BY because
  // clang cannot name the enclosing LocalKubelet's mutex from a nested struct.
  struct Proc;
  struct PodState;
  void run() EXCLUDES(mu_);
  void sync_once() EXCLUDES(mu_);
  void sync_pod(const json& pod) EXCLUDES(mu_);
  // The steps of sync_pod, called with mu_ held (report() and sync_deletion() release it around
  // their API writes and hold it again before they return or throw). adopt_pod_locked: the
  // state of a pod first seen on one of our nodes (nullptr when the node is not ours).
  // sync_deletion: SIGTERM, SIGKILL after the grace period, then the final DELETE.
  // due_to_start_locked: whether the container (re)starts now, after its back-off.
  PodState* adopt_pod_locked(const json& pod) REQUIRES(mu_);
  void sync_deletion(PodState& state, const json& pod, std::chrono::steady_clock::time_point now)
      REQUIRES(mu_);
  void kill_after_grace_locked(PodState& state, std::chrono::steady_clock::time_point now)
      REQUIRES(mu_);
  void begin_preemption_locked(PodState& state, const json& pod) REQUIRES(mu_);
  bool due_to_start_locked(PodState& state, const json& pod,
                           std::chrono::steady_clock::time_point now) REQUIRES(mu_);
  void handle_gone(PodState& state) REQUIRES(mu_);
  void start_process(PodState& state, const json& pod) REQUIRES(mu_);
  void report(PodState& state, const json& pod) REQUIRES(mu_);
  void schedule(const json& pod) EXCLUDES(mu_);
  void evict_lost_pods() EXCLUDES(mu_);
  void pump_logs() EXCLUDES(mu_);
  // Registers live nodes not registered yet, renews the Leases of live nodes when due.
  void heartbeat_nodes() EXCLUDES(mu_);
  void register_node(const std::string& node) EXCLUDES(mu_);
  void notify() REQUIRES(mu_);
  void waiter(std::shared_ptr<Proc> proc) EXCLUDES(mu_);
  static LocalPodInfo info_of(const PodState& s);

  std::shared_ptr<kube::Client> client_;
  KubeletOptions options_;
  PortMap ports_;
  std::unique_ptr<kube::Informer> informer_;
  std::thread sync_thread_;

  mutable Mutex mu_;
  mutable CondVar cv_;                    // wakes the sync loop and wait_for()
  uint64_t changes_ GUARDED_BY(mu_) = 0;  // bumped on every change
  bool dirty_ GUARDED_BY(mu_) = false;    // the sync loop has work
  bool started_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::string> live_nodes_ GUARDED_BY(mu_);
  std::set<std::string> lost_nodes_ GUARDED_BY(mu_);
  struct Eviction {
    std::chrono::steady_clock::time_point when;
    std::optional<int64_t> grace_seconds;
  };
  std::map<std::string, Eviction> evictions_ GUARDED_BY(mu_);  // lost node -> pending eviction
  std::map<std::string, std::unique_ptr<PodState>> pods_ GUARDED_BY(mu_);  // uid -> state
  // Bindings sent whose pods the informer has not shown bound yet (so pods created together
  // spread over the nodes): uid -> node.
  std::map<std::string, std::string> pending_bindings_ GUARDED_BY(mu_);
  std::vector<std::pair<std::thread, std::shared_ptr<Proc>>> waiters_ GUARDED_BY(mu_);
  std::map<std::string, uint64_t> log_offsets_;  // sync thread only: log file -> bytes read
  // Sync thread only: registered node -> its uid; when the next heartbeat is due; count.
  std::map<std::string, std::string> registered_nodes_;
  std::chrono::steady_clock::time_point next_heartbeat_{};
  int heartbeats_ = 0;
};

// Runs one control line (the --control file of longhaul-local-kubelet and the demo):
//   preempt NS/POD [REASON]    lose-node NODE [EVICT_SECONDS]    add-node NODE
// Returns what was done ("" for blank and # lines). Throws InvalidArgument naming the line.
std::string run_control_command(LocalKubelet& kubelet, const std::string& line);

}  // namespace longhaul::kubelet
