// The local kubelet (see local_kubelet.h).
#include "longhaul/kubelet/local_kubelet.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <longhaul/base/error.h>
#include <longhaul/base/log.h>
#include <longhaul/base/rfc3339.h>
#include <longhaul/kube/leader_election.h>

namespace longhaul::kubelet {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

const char* kLocalIp = "127.0.0.1";

std::string str(const json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string now_rfc3339() { return format_rfc3339(std::chrono::system_clock::now()); }

// Runs `write` (an API call) with `mu` released; `mu` is held again when this returns or throws,
// so the caller's MutexLock still owns it.
template <typename Write>
void unlocked(Mutex& mu, Write&& write) REQUIRES(mu) {
  mu.Unlock();
  try {
    write();
  } catch (...) {
    mu.Lock();
    throw;
  }
  mu.Lock();
}

// What a container left at its terminationMessagePath, as a kubelet reports it: at most 4096
// bytes; nullopt when it wrote nothing (or there is no file).
std::optional<std::string> termination_message(const fs::path& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::string text(4096, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.empty()) return std::nullopt;
  return text;
}

int64_t int_or(const json& object, const char* key, int64_t fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

}  // namespace

// One process of a pod. The waiter thread sets `exit_code` (under the kubelet's mutex).
struct LocalKubelet::Proc {
  pid_t pid = -1;
  std::string started_at, finished_at;
  std::optional<int> exit_code;  // code, or 128+signal
  int signal = 0;
  bool reaped = false;
};

// Everything the kubelet tracks for one pod (by uid). Guarded by mu_ (see local_kubelet.h).
struct LocalKubelet::PodState {
  std::string ns, name, uid, node, container, image, restart_policy;
  fs::path log;
  // The container's terminationMessagePath, emulated: a file in the pod's folder that the process
  // finds in $LONGHAUL_TERMINATION_MESSAGE_PATH (emptied before each start; read when it ends).
  fs::path termination_log;
  std::string start_time;
  std::shared_ptr<Proc> proc;           // current or last process
  std::optional<json> last_terminated;  // lastState.terminated after an in-place restart
  int restart_count = 0;
  Clock::time_point restart_at{};  // crash back-off: restart not before
  milliseconds backoff{0};
  bool start_failed = false;  // exec failed: Failed, 127, StartError
  std::string start_error;
  bool terminal = false;  // no more processes will run
  // Termination (deletion or preemption).
  bool term_sent = false;
  bool kill_sent = false;
  Clock::time_point kill_at{};
  bool deleting = false;
  bool finalized = false;  // DELETE grace 0 sent
  bool gone = false;       // no longer in the API
  milliseconds termination_grace{30000};
  // Preemption.
  bool preempt_requested = false;
  bool preempted = false;
  std::string preempt_reason;
  std::optional<milliseconds> preempt_grace;
  std::string disruption_time;
  bool lost = false;  // node lost: never written again
  // Reported status, to write only changes; condition transition times.
  json last_status;
  std::map<std::string, std::pair<std::string, std::string>> condition_times;  // type->(st,time)

  bool alive() const { return proc && !proc->exit_code; }
};

LocalKubelet::LocalKubelet(std::shared_ptr<kube::Client> client, KubeletOptions options)
    : client_(std::move(client)), options_(std::move(options)), ports_(options_.port_base) {
  if (options_.root.empty()) throw InvalidArgument("local kubelet: options.root is empty");
  options_.root = fs::absolute(options_.root);
  live_nodes_ = options_.nodes;
}

LocalKubelet::~LocalKubelet() { stop(); }

fs::path LocalKubelet::log_path(const std::string& ns, const std::string& pod) const {
  return options_.root / "logs" /
         ((ns == "default" || ns.empty()) ? pod + ".log" : ns + "_" + pod + ".log");
}

void LocalKubelet::notify() {
  ++changes_;
  dirty_ = true;
  cv_.notify_all();
}

void LocalKubelet::start() {
  {
    MutexLock lock(mu_);
    if (started_) throw FailedPrecondition("local kubelet: start() called twice");
    started_ = true;
  }
  for (const char* sub : {"pvc", "logs", "pods"}) fs::create_directories(options_.root / sub);
  kube::InformerOptions io;
  io.resource = kube::resources::kPods;
  io.ns = options_.ns;
  io.label_selector = options_.label_selector;
  io.watch_timeout = std::chrono::seconds(60);
  io.initial_backoff = milliseconds(100);
  io.max_backoff = milliseconds(2000);
  informer_ = std::make_unique<kube::Informer>(client_, io);
  auto wake = [this] {
    MutexLock lock(mu_);
    dirty_ = true;
    cv_.notify_all();
  };
  informer_->add_handlers({[wake](const json&) { wake(); },
                           [wake](const json&, const json&) { wake(); },
                           [wake](const json&) { wake(); }});
  informer_->start();
  if (!informer_->wait_for_sync(std::chrono::seconds(30))) {
    informer_->stop();
    throw Unavailable(
        "local kubelet: the pod list did not sync within 30 s: is the API server up?");
  }
  sync_thread_ = std::thread([this] { run(); });
  LH_LOG(INFO) << "local kubelet started" << kv("root", options_.root.string())
               << kv("nodes", static_cast<int>(options_.nodes.size()));
}

void LocalKubelet::stop() {
  {
    MutexLock lock(mu_);
    if (!started_) return;
    stopping_ = true;  // a second stop() finds everything joined already
    cv_.notify_all();
  }
  if (sync_thread_.joinable()) sync_thread_.join();
  if (informer_) informer_->stop();
  // Kill what still runs: SIGTERM, then SIGKILL after stop_grace.
  MutexLock lock(mu_);
  auto signal_all = [&](int sig) REQUIRES(mu_) {
    for (auto& [uid, s] : pods_) {
      if (s->alive()) ::kill(-s->proc->pid, sig);
    }
  };
  signal_all(SIGTERM);
  auto all_dead = [&]() REQUIRES(mu_) {
    return std::all_of(pods_.begin(), pods_.end(),
                       [](const auto& kv) { return !kv.second->alive(); });
  };
  if (!cv_.wait_for(mu_, options_.stop_grace, all_dead)) signal_all(SIGKILL);
  std::vector<std::pair<std::thread, std::shared_ptr<Proc>>> waiters;
  waiters.swap(waiters_);
  lock.Unlock();
  for (auto& [t, p] : waiters) t.join();
}

void LocalKubelet::waiter(std::shared_ptr<Proc> proc) {
  // Wait for the exit without reaping: while the leader is a zombie its pid, and so its process
  // group id, cannot be reused, so killing the group's leftover children cannot hit a stranger.
  siginfo_t info{};
  int w;
  do {
    w = ::waitid(P_PID, static_cast<id_t>(proc->pid), &info, WEXITED | WNOWAIT);
  } while (w < 0 && errno == EINTR);
  ::kill(-proc->pid, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(proc->pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  MutexLock lock(mu_);
  if (r < 0) {
    proc->exit_code = 128 + SIGKILL;  // cannot happen for our own child; treat as killed
  } else if (WIFEXITED(status)) {
    proc->exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    proc->signal = WTERMSIG(status);
    proc->exit_code = 128 + proc->signal;
  } else {
    proc->exit_code = 128;
  }
  proc->finished_at = now_rfc3339();
  proc->reaped = true;
  notify();
}

void LocalKubelet::run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    dirty_ = false;
    lock.Unlock();
    try {
      heartbeat_nodes();
    } catch (const std::exception& e) {
      LH_LOG(WARNING) << "local kubelet: node heartbeat failed; retrying" << kv("error", e.what());
    }
    try {
      sync_once();
    } catch (const std::exception& e) {
      LH_LOG(WARNING) << "local kubelet: sync failed; retrying" << kv("error", e.what());
    }
    lock.Lock();
    // Nearest deadline: SIGKILL, restart back-off, eviction, heartbeat; else the resync period.
    Clock::time_point wake = Clock::now() + options_.resync;
    if (options_.register_nodes) wake = std::min(wake, next_heartbeat_);
    for (const auto& [uid, s] : pods_) {
      if (s->term_sent && !s->kill_sent && s->alive()) wake = std::min(wake, s->kill_at);
      if (!s->terminal && !s->alive() && s->restart_at != Clock::time_point{}) {
        wake = std::min(wake, s->restart_at);
      }
    }
    for (const auto& [node, e] : evictions_) wake = std::min(wake, e.when);
    cv_.wait_until(mu_, wake, [this]() REQUIRES(mu_) { return stopping_ || dirty_; });
  }
}

void LocalKubelet::register_node(const std::string& node) {
  namespace res = kube::resources;
  json created;
  try {
    created = client_->create(res::kNodes, "",
                              {{"apiVersion", "v1"},
                               {"kind", "Node"},
                               {"metadata",
                                {{"name", node},
                                 {"labels",
                                  {{"kubernetes.io/hostname", node},
                                   {"kubernetes.io/os", "linux"},
                                   {"longhaul.dev/local-kubelet", "true"}}}}}});
  } catch (const kube::AlreadyExistsError&) {
    created = client_->get(res::kNodes, "", node);  // registered before (a restarted kubelet)
  }
  registered_nodes_[node] = created["metadata"].value("uid", std::string());
  LH_LOG(INFO) << "local kubelet: node registered" << kv("node", node);
}

void LocalKubelet::heartbeat_nodes() {
  namespace res = kube::resources;
  if (!options_.register_nodes || Clock::now() < next_heartbeat_) return;
  const std::vector<std::string> nodes = live_nodes();
  const bool report_status = heartbeats_ % std::max(1, options_.node_status_every) == 0;
  const std::string now = now_rfc3339();
  const std::string micro = kube::format_micro_time(std::chrono::system_clock::now());
  for (const std::string& node : nodes) {
    const bool fresh = !registered_nodes_.contains(node);
    if (fresh) register_node(node);
    if (fresh || report_status) {
      const json ready = {
          {"type", "Ready"},          {"status", "True"},
          {"reason", "KubeletReady"}, {"message", "longhaul local kubelet is posting ready status"},
          {"lastHeartbeatTime", now}, {"lastTransitionTime", now}};
      json status = {{"conditions", {ready}},
                     {"addresses",
                      {{{"type", "InternalIP"}, {"address", "127.0.0.1"}},
                       {{"type", "Hostname"}, {"address", node}}}},
                     {"capacity", {{"cpu", "64"}, {"memory", "256Gi"}, {"pods", "110"}}},
                     {"allocatable", {{"cpu", "64"}, {"memory", "256Gi"}, {"pods", "110"}}},
                     {"nodeInfo",
                      {{"kubeletVersion", "v1.26.4-longhaul-local"},
                       {"operatingSystem", "linux"},
                       {"architecture", "amd64"}}}};
      if (!fresh) status["conditions"][0].erase("lastTransitionTime");  // kept as it was
      client_->patch(res::kNodes, "", node, {{"status", status}}, kube::PatchType::kStrategicMerge,
                     true);
    }
    // The Lease is the heartbeat the node lifecycle controller reads.
    try {
      client_->patch(res::kLeases, "kube-node-lease", node,
                     {{"spec", {{"holderIdentity", node}, {"renewTime", micro}}}},
                     kube::PatchType::kMerge);
    } catch (const kube::NotFoundError&) {
      json owner = {
          {"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}, {"uid", registered_nodes_[node]}};
      json lease = {
          {"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", node}, {"namespace", "kube-node-lease"}}},
          {"spec", {{"holderIdentity", node}, {"leaseDurationSeconds", 40}, {"renewTime", micro}}}};
      if (!registered_nodes_[node].empty()) lease["metadata"]["ownerReferences"] = {owner};
      client_->create(res::kLeases, "kube-node-lease", lease);
    }
  }
  ++heartbeats_;
  next_heartbeat_ = Clock::now() + options_.node_heartbeat;
}

void LocalKubelet::sync_once() {
  std::vector<kube::ObjectPtr> objects = informer_->store().list();
  std::set<std::string> present;
  for (const kube::ObjectPtr& o : objects) {
    const json& pod = *o;
    present.insert(str(pod.value("metadata", json::object()), "uid"));
    try {
      sync_pod(pod);
    } catch (const kube::NotFoundError&) {
      // Deleted under us: the watch brings the DELETED event.
    } catch (const kube::ConflictError& e) {
      LH_LOG(DEBUG) << "local kubelet: conflict; next round" << kv("error", e.what());
    } catch (const Error& e) {
      LH_LOG(WARNING) << "local kubelet: pod sync failed" << kv("error", e.what());
    }
  }
  // Pods that left the API: kill what still runs, forget the rest.
  {
    MutexLock lock(mu_);
    for (auto it = pods_.begin(); it != pods_.end();) {
      PodState& s = *it->second;
      if (present.contains(it->first)) {
        ++it;
        continue;
      }
      s.gone = true;
      handle_gone(s);
      if (!s.alive()) {
        it = pods_.erase(it);
        notify();
      } else {
        ++it;
      }
    }
    for (auto it = pending_bindings_.begin(); it != pending_bindings_.end();) {
      it = present.contains(it->first) ? std::next(it) : pending_bindings_.erase(it);
    }
    // Join the waiters whose process is reaped.
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second->reaped) {
        it->first.join();
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  evict_lost_pods();
  pump_logs();
}

void LocalKubelet::handle_gone(PodState& s) {
  if (!s.alive() || s.lost) return;
  const auto now = Clock::now();
  if (!s.term_sent) {
    ::kill(-s.proc->pid, SIGTERM);
    s.term_sent = true;
    s.kill_at = now + s.termination_grace;
  } else if (!s.kill_sent && now >= s.kill_at) {
    ::kill(-s.proc->pid, SIGKILL);
    s.kill_sent = true;
  }
}

void LocalKubelet::schedule(const json& pod) {
  std::string node;
  const json& meta = pod["metadata"];
  {
    MutexLock lock(mu_);
    if (live_nodes_.empty() || pending_bindings_.contains(str(meta, "uid"))) return;
    // Load: pods this kubelet runs or is about to run, per live node.
    std::map<std::string, int> load;
    for (const std::string& n : live_nodes_) load[n] = 0;
    for (const auto& [uid, s] : pods_) {
      if (load.contains(s->node) && !s->terminal) ++load[s->node];
    }
    for (const auto& [uid, n] : pending_bindings_) {
      if (load.contains(n)) ++load[n];
    }
    node = live_nodes_.front();
    for (const std::string& n : live_nodes_) {
      if (load[n] < load[node]) node = n;
    }
    pending_bindings_[str(meta, "uid")] = node;
  }
  const std::string ns = str(meta, "namespace"), name = str(meta, "name");
  kube::Resource binding{"", "v1", "pods/" + name + "/binding", true, "Binding"};
  auto forget = [&] {
    MutexLock lock(mu_);
    pending_bindings_.erase(str(meta, "uid"));
  };
  try {
    client_->create(binding, ns,
                    {{"apiVersion", "v1"},
                     {"kind", "Binding"},
                     {"metadata", {{"name", name}, {"namespace", ns}, {"uid", str(meta, "uid")}}},
                     {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}});
  } catch (...) {
    forget();  // the next round tries again (or finds it bound by someone else)
    throw;
  }
  LH_LOG(INFO) << "local kubelet: scheduled" << kv("pod", ns + "/" + name) << kv("node", node);
}

// One pod's round: adopt it if it is new on one of our nodes (or bind an unscheduled one), then
// finish its deletion, report a terminal pod, begin a requested preemption, enforce the grace
// period of a terminating process, or (re)start its container when due.
void LocalKubelet::sync_pod(const json& pod) {
  const json meta = pod.value("metadata", json::object());
  const std::string uid = str(meta, "uid");
  const std::string node = str(pod.value("spec", json::object()), "nodeName");
  const bool deleting = meta.contains("deletionTimestamp");

  MutexLock lock(mu_);
  if (!node.empty()) pending_bindings_.erase(uid);
  auto it = pods_.find(uid);
  PodState* s = it == pods_.end() ? nullptr : it->second.get();
  if (s == nullptr) {
    if (node.empty()) {
      lock.Unlock();
      if (options_.schedule && !deleting) schedule(pod);
      return;
    }
    s = adopt_pod_locked(pod);
    if (s == nullptr) return;  // bound to a node that is not ours
  }
  if (s->lost || s->gone) return;
  const auto now = Clock::now();
  if (deleting) {
    sync_deletion(*s, pod, now);
    return;
  }
  if (s->terminal) {
    report(*s, pod);
    return;
  }
  if (s->preempt_requested && !s->preempted) begin_preemption_locked(*s, pod);
  if (s->alive()) {
    kill_after_grace_locked(*s, now);
    report(*s, pod);
    return;
  }
  if (!due_to_start_locked(*s, pod, now)) return;
  start_process(*s, pod);
  report(*s, pod);
}

LocalKubelet::PodState* LocalKubelet::adopt_pod_locked(const json& pod) {
  const json meta = pod.value("metadata", json::object());
  const json spec = pod.value("spec", json::object());
  const std::string node = str(spec, "nodeName");
  if (std::find(live_nodes_.begin(), live_nodes_.end(), node) == live_nodes_.end()) return nullptr;
  auto state = std::make_unique<PodState>();
  state->ns = str(meta, "namespace");
  state->name = str(meta, "name");
  state->uid = str(meta, "uid");
  state->node = node;
  state->log = log_path(state->ns, state->name);
  state->restart_policy = spec.value("restartPolicy", std::string("Always"));
  state->termination_grace =
      std::chrono::seconds(int_or(spec, "terminationGracePeriodSeconds", 30));
  const json containers = spec.value("containers", json::array());
  if (containers.is_array() && !containers.empty()) {
    state->container = str(containers[0], "name");
    state->image = str(containers[0], "image");
  }
  const std::string phase = str(pod.value("status", json::object()), "phase");
  if (phase == "Succeeded" || phase == "Failed") {
    state->terminal = true;  // finished before we came: only finalize deletions
    state->last_status = pod["status"];
  } else if (phase == "Running") {
    // Running, but this kubelet never started it (it was restarted): the process is gone.
    state->terminal = true;
    state->proc = std::make_shared<Proc>();
    state->proc->exit_code = 128 + SIGKILL;
    state->proc->reaped = true;
    state->proc->finished_at = now_rfc3339();
    state->start_error = "the local kubelet restarted and lost this pod's process";
  }
  PodState* s = state.get();
  pods_[s->uid] = std::move(state);
  notify();
  return s;
}

void LocalKubelet::sync_deletion(PodState& s, const json& pod, Clock::time_point now) {
  s.deleting = true;
  const std::string who = s.ns + "/" + s.name;
  if (s.alive()) {
    if (!s.term_sent) {
      const int64_t grace =
          int_or(pod.value("metadata", json::object()), "deletionGracePeriodSeconds",
                 s.termination_grace.count() / 1000);
      ::kill(-s.proc->pid, SIGTERM);
      s.term_sent = true;
      s.kill_at = now + std::chrono::seconds(grace);
      LH_LOG(INFO) << "local kubelet: pod deleted; SIGTERM" << kv("pod", who)
                   << kv("grace_seconds", grace);
      notify();
    } else {
      kill_after_grace_locked(s, now);
    }
    return;
  }
  s.terminal = true;
  if (s.finalized) return;
  report(s, pod);  // unlocks around the write
  const std::string ns = s.ns, name = s.name, uid = s.uid;
  unlocked(mu_, [&] {
    client_->remove(kube::resources::kPods, ns, name,
                    kube::DeleteOptions{.grace_period_seconds = 0, .precondition_uid = uid});
  });
  s.finalized = true;
  notify();
  LH_LOG(INFO) << "local kubelet: pod deletion finalized" << kv("pod", who);
}

void LocalKubelet::kill_after_grace_locked(PodState& s, Clock::time_point now) {
  if (!s.term_sent || s.kill_sent || now < s.kill_at) return;
  ::kill(-s.proc->pid, SIGKILL);
  s.kill_sent = true;
  LH_LOG(INFO) << "local kubelet: grace period over; SIGKILL" << kv("pod", s.ns + "/" + s.name);
  notify();
}

void LocalKubelet::begin_preemption_locked(PodState& s, const json& pod) {
  // DisruptionTarget first, then SIGTERM.
  s.preempted = true;
  s.disruption_time = now_rfc3339();
  report(s, pod);
  if (s.alive()) {
    ::kill(-s.proc->pid, SIGTERM);
    s.term_sent = true;
    s.kill_at = Clock::now() + s.preempt_grace.value_or(s.termination_grace);
    LH_LOG(INFO) << "local kubelet: preempting; SIGTERM" << kv("pod", s.ns + "/" + s.name)
                 << kv("reason", s.preempt_reason);
  }
  notify();
}

bool LocalKubelet::due_to_start_locked(PodState& s, const json& pod, Clock::time_point now) {
  if (!s.proc || !s.proc->exit_code) return true;  // the first start
  const int code = *s.proc->exit_code;
  const bool restart =
      !s.preempted && !s.start_failed &&
      (s.restart_policy == "Always" || (s.restart_policy == "OnFailure" && code != 0));
  if (!restart) {
    s.terminal = true;
    report(s, pod);
    return false;
  }
  if (s.restart_at == Clock::time_point{}) {
    s.backoff = s.backoff == milliseconds(0) ? options_.crash_backoff_initial
                                             : std::min(options_.crash_backoff_max, s.backoff * 2);
    s.restart_at = now + s.backoff;
    s.last_terminated = json{{"exitCode", code},
                             {"reason", code == 0 ? "Completed" : "Error"},
                             {"startedAt", s.proc->started_at},
                             {"finishedAt", s.proc->finished_at}};
    if (auto message = termination_message(s.termination_log)) {
      (*s.last_terminated)["message"] = *message;
    }
    report(s, pod);
    return false;
  }
  if (now < s.restart_at) return false;
  s.restart_at = Clock::time_point{};
  ++s.restart_count;
  return true;
}

void LocalKubelet::start_process(PodState& s, const json& pod) {
  // Caller holds mu_ (fork under the lock keeps waiters from racing the new Proc).
  const fs::path pod_dir = options_.root / "pods" / s.ns / s.name;
  CommandOptions co;
  co.root = options_.root;
  co.pod_dir = pod_dir;
  co.bin_dirs = options_.bin_dirs;
  co.entrypoints = options_.entrypoints;
  co.ports = &ports_;
  auto proc = std::make_shared<Proc>();
  proc->started_at = now_rfc3339();
  if (s.start_time.empty()) s.start_time = proc->started_at;
  s.proc = proc;
  s.term_sent = s.kill_sent = false;

  std::ofstream header(s.log, std::ios::app);
  auto fail = [&](const std::string& why) REQUIRES(mu_) {
    s.start_failed = true;
    s.start_error = why;
    proc->exit_code = 127;
    proc->reaped = true;
    proc->finished_at = now_rfc3339();
    header << "[local-kubelet] cannot start pod " << s.ns << "/" << s.name << ": " << why << "\n";
    LH_LOG(WARNING) << "local kubelet: cannot start pod" << kv("pod", s.ns + "/" + s.name)
                    << kv("error", why);
    notify();
  };
  PodCommand cmd;
  try {
    fs::create_directories(pod_dir);
    cmd = build_pod_command(pod, co);
    for (const VolumeMapping& v : cmd.volumes) fs::create_directories(v.local);
    fs::create_directories(cmd.working_dir);
    // As a kubelet mounts an empty file at terminationMessagePath for each container start.
    s.termination_log = pod_dir / ("termination-log-" + cmd.container);
    std::ofstream(s.termination_log, std::ios::trunc).close();
    cmd.env.emplace_back("LONGHAUL_TERMINATION_MESSAGE_PATH", s.termination_log.string());
  } catch (const std::exception& e) {
    fail(e.what());
    return;
  }
  header << "[local-kubelet] " << proc->started_at << " starting pod " << s.ns << "/" << s.name
         << " (uid " << s.uid << ", node " << s.node << ", restart " << s.restart_count << "):";
  for (const std::string& a : cmd.argv) header << " " << a;
  header << "\n";
  for (const std::string& w : cmd.warnings) header << "[local-kubelet] warning: " << w << "\n";
  header.close();

  // Everything the child needs is prepared before fork (only async-signal-safe calls after).
  std::vector<std::string> env_strings;
  {
    std::map<std::string, std::string> last;  // later entries win
    for (const auto& [k, v] : cmd.env) last[k] = v;
    for (const auto& [k, v] : last) env_strings.push_back(k + "=" + v);
  }
  std::vector<char*> argv, envp;
  for (std::string& a : cmd.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string log = s.log.string(), cwd = cmd.working_dir.string();
  int errpipe[2];
  if (::pipe2(errpipe, O_CLOEXEC) != 0) {
    fail(std::string("pipe: ") + std::strerror(errno));
    return;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(errpipe[0]);
    ::close(errpipe[1]);
    fail(std::string("fork: ") + std::strerror(errno));
    return;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    ::setpgid(0, 0);
    int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    if (devnull >= 0) ::dup2(devnull, 0);
    int err = 0;
    if (::chdir(cwd.c_str()) != 0) err = errno;
    if (err == 0) {
      // No descriptor of the kubelet (API sockets, other pods' pipes) leaks into the pod; the
      // error pipe closes on exec too, which tells the parent that exec succeeded.
      ::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */);
      ::execve(argv[0], argv.data(), envp.data());
      err = errno;
    }
    [[maybe_unused]] ssize_t w = ::write(errpipe[1], &err, sizeof err);
    _exit(127);
  }
  ::setpgid(pid, pid);
  ::close(errpipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(errpipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    s.start_failed = true;
    s.start_error = "cannot run " + cmd.argv[0] + " in " + cwd + ": " + std::strerror(child_errno);
    std::ofstream(s.log, std::ios::app) << "[local-kubelet] " << s.start_error << "\n";
  }
  proc->pid = pid;
  waiters_.emplace_back(std::thread([this, proc] { waiter(proc); }), proc);
  LH_LOG(INFO) << "local kubelet: started pod" << kv("pod", s.ns + "/" + s.name) << kv("pid", pid)
               << kv("node", s.node);
  ::close(errpipe[0]);
  notify();
}

void LocalKubelet::report(PodState& s, const json& pod) {
  // The caller holds mu_ (in a MutexLock): it is released around the API write and held again
  // before this returns or throws, so the caller's MutexLock still unlocks it.
  const std::string now = now_rfc3339();
  std::string phase = "Pending";
  json cstate = json::object(), cs_last = json::object();
  bool ready = false;
  std::optional<int> code = s.proc ? s.proc->exit_code : std::nullopt;
  const bool waiting_restart = !s.terminal && !s.alive() && s.restart_at != Clock::time_point{};
  if (s.alive()) {
    phase = "Running";
    ready = !s.term_sent;
    cstate = {{"running", {{"startedAt", s.proc->started_at}}}};
  } else if (waiting_restart) {
    phase = "Running";
    cstate = {{"waiting",
               {{"reason", "CrashLoopBackOff"},
                {"message", "back-off restarting the failed container"}}}};
  } else if (code) {
    phase = (*code == 0 && !s.preempted) ? "Succeeded" : "Failed";
    json term = {{"exitCode", *code},
                 {"reason", s.start_failed ? "StartError" : (*code == 0 ? "Completed" : "Error")},
                 {"startedAt", s.proc->started_at},
                 {"finishedAt", s.proc->finished_at},
                 {"containerID", "local://" + std::to_string(s.proc->pid)}};
    if (s.proc->signal != 0) term["signal"] = s.proc->signal;
    if (auto message = termination_message(s.termination_log)) term["message"] = *message;
    if (!s.start_error.empty()) term["message"] = s.start_error;
    cstate = {{"terminated", term}};
  } else if (s.terminal) {
    return;  // finished before this kubelet came: nothing to say
  } else {
    cstate = {{"waiting", {{"reason", "ContainerCreating"}}}};
  }
  if (s.last_terminated) cs_last = {{"terminated", *s.last_terminated}};

  auto condition = [&](const std::string& type, bool status, const std::string& reason,
                       const std::string& message) {
    const std::string st = status ? "True" : "False";
    auto& [prev, at] = s.condition_times[type];
    if (prev != st) {
      prev = st;
      at = now;
    }
    json c = {{"type", type}, {"status", st}, {"lastTransitionTime", at}};
    if (!reason.empty()) c["reason"] = reason;
    if (!message.empty()) c["message"] = message;
    return c;
  };
  const bool finished = phase == "Succeeded" || phase == "Failed";
  const std::string not_ready = finished ? "PodCompleted" : "ContainersNotReady";
  json conditions = json::array();
  conditions.push_back(condition("PodScheduled", true, "", ""));
  conditions.push_back(condition("Initialized", true, "", ""));
  conditions.push_back(condition("ContainersReady", ready, ready ? "" : not_ready, ""));
  conditions.push_back(condition("Ready", ready, ready ? "" : not_ready, ""));
  if (s.preempted) {
    json d = {{"type", "DisruptionTarget"},
              {"status", "True"},
              {"reason", s.preempt_reason},
              {"message", "the local kubelet preempted this pod"},
              {"lastTransitionTime", s.disruption_time}};
    conditions.push_back(d);
  }
  json cs = {{"name", s.container}, {"image", s.image},     {"imageID", ""},
             {"ready", ready},      {"started", s.alive()}, {"restartCount", s.restart_count},
             {"state", cstate},     {"lastState", cs_last}};
  if (s.proc && s.proc->pid > 0) cs["containerID"] = "local://" + std::to_string(s.proc->pid);
  json status = {{"phase", phase},
                 {"conditions", conditions},
                 {"hostIP", kLocalIp},
                 {"podIP", kLocalIp},
                 {"podIPs", json::array({{{"ip", kLocalIp}}})},
                 {"containerStatuses", json::array({cs})},
                 {"reason", nullptr},
                 {"message", nullptr}};
  if (!s.start_time.empty()) status["startTime"] = s.start_time;
  if (s.preempted && finished) {
    status["reason"] = "Preempted";
    status["message"] = "Preempted by the local kubelet: " + s.preempt_reason;
  }
  if (status == s.last_status) return;
  // The API write happens without the lock (the sync thread is the only writer of `s`).
  const std::string ns = s.ns, name = s.name, uid = s.uid;
  // By name, so the uid goes in the patch as a precondition (metadata.uid is immutable: the API
  // server refuses it on any other pod): the final status of a pod deleted since must never land
  // on a pod re-created under the same name, whose kubelet status writes a real API server would
  // then refuse ("may not be transitioned to non-terminated state"; issue #27).
  const json patch = {{"metadata", {{"uid", uid}}}, {"status", status}};
  try {
    unlocked(mu_, [&] {
      client_->patch(kube::resources::kPods, ns, name, patch, kube::PatchType::kMerge,
                     /*status_subresource=*/true);
    });
  } catch (const kube::InvalidError& e) {
    if (std::string_view(e.what()).find("metadata.uid") == std::string_view::npos) throw;
    // Another pod holds the name now: this one is gone (the watch brings its DELETED event).
    throw kube::NotFoundError("pod " + ns + "/" + name + " (uid " + s.uid +
                              ") was re-created under a new uid: its status is not written");
  }
  s.last_status = status;
  notify();
  (void)pod;
}

void LocalKubelet::evict_lost_pods() {
  std::vector<std::pair<std::string, std::optional<int64_t>>> due;
  {
    MutexLock lock(mu_);
    const auto now = Clock::now();
    for (auto it = evictions_.begin(); it != evictions_.end();) {
      if (it->second.when <= now) {
        due.emplace_back(it->first, it->second.grace_seconds);
        it = evictions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [node, grace] : due) {
    for (const kube::ObjectPtr& o : informer_->store().list()) {
      const json& pod = *o;
      const json meta = pod.value("metadata", json::object());
      if (str(pod.value("spec", json::object()), "nodeName") != node ||
          meta.contains("deletionTimestamp")) {
        continue;
      }
      const std::string ns = str(meta, "namespace"), name = str(meta, "name");
      try {
        json conditions = pod.value("status", json::object()).value("conditions", json::array());
        conditions.push_back({{"type", "DisruptionTarget"},
                              {"status", "True"},
                              {"reason", "DeletionByTaintManager"},
                              {"message",
                               "Taint manager: deleting due to NoExecute taint "
                               "(node " +
                                   node + " is unreachable)"},
                              {"lastTransitionTime", now_rfc3339()}});
        client_->patch(
            kube::resources::kPods, ns, name,
            {{"metadata", {{"uid", str(meta, "uid")}}}, {"status", {{"conditions", conditions}}}},
            kube::PatchType::kMerge, true);
        kube::DeleteOptions d{.precondition_uid = str(meta, "uid")};
        if (grace) d.grace_period_seconds = std::max<int64_t>(1, *grace);
        client_->remove(kube::resources::kPods, ns, name, d);
        LH_LOG(INFO) << "local kubelet: evicted a pod of the lost node"
                     << kv("pod", ns + "/" + name) << kv("node", node);
      } catch (const Error& e) {
        LH_LOG(WARNING) << "local kubelet: eviction failed" << kv("pod", ns + "/" + name)
                        << kv("error", e.what());
      }
    }
  }
}

void LocalKubelet::pump_logs() {
  if (!options_.on_log_line) return;
  std::vector<std::pair<std::string, fs::path>> logs;
  {
    MutexLock lock(mu_);
    for (const auto& [uid, s] : pods_) logs.emplace_back(s->name, s->log);
  }
  for (const auto& [name, path] : logs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    uint64_t& offset = log_offsets_[path.string()];
    in.seekg(0, std::ios::end);
    const uint64_t size = static_cast<uint64_t>(in.tellg());
    if (size < offset) offset = 0;
    if (size == offset) continue;
    in.seekg(static_cast<std::streamoff>(offset));
    std::string chunk(size - offset, '\0');
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const size_t last_nl = chunk.rfind('\n');
    if (last_nl == std::string::npos) continue;  // wait for a whole line
    offset += last_nl + 1;
    size_t start = 0;
    while (start <= last_nl) {
      size_t end = chunk.find('\n', start);
      options_.on_log_line(name, chunk.substr(start, end - start));
      start = end + 1;
    }
  }
}

void LocalKubelet::preempt(const std::string& ns, const std::string& name,
                           const std::string& reason, std::optional<milliseconds> grace) {
  MutexLock lock(mu_);
  for (auto& [uid, s] : pods_) {
    if (s->ns == ns && s->name == name && s->alive() && !s->lost && !s->gone) {
      s->preempt_requested = true;
      s->preempt_reason = reason;
      s->preempt_grace = grace;
      notify();
      return;
    }
  }
  throw NotFound("local kubelet: no running process for pod " + ns + "/" + name +
                 " to preempt (not started yet, finished, or on a lost node)");
}

void LocalKubelet::lose_node(const std::string& node, LoseNodeOptions options) {
  MutexLock lock(mu_);
  auto it = std::find(live_nodes_.begin(), live_nodes_.end(), node);
  if (it == live_nodes_.end()) {
    throw NotFound("local kubelet: node " + node + " is not a live node of this kubelet");
  }
  live_nodes_.erase(it);
  lost_nodes_.insert(node);
  for (auto& [uid, s] : pods_) {
    if (s->node != node) continue;
    s->lost = true;
    if (s->alive()) ::kill(-s->proc->pid, SIGKILL);
  }
  if (options.evict_after) {
    evictions_[node] = {Clock::now() + *options.evict_after, options.eviction_grace_seconds};
  }
  LH_LOG(WARNING) << "local kubelet: node lost" << kv("node", node);
  notify();
}

void LocalKubelet::add_node(const std::string& node) {
  MutexLock lock(mu_);
  if (lost_nodes_.contains(node)) {
    throw InvalidArgument("local kubelet: node " + node + " was lost; add a node of a new name");
  }
  if (std::find(live_nodes_.begin(), live_nodes_.end(), node) == live_nodes_.end()) {
    live_nodes_.push_back(node);
  }
  notify();
}

std::vector<std::string> LocalKubelet::live_nodes() const {
  MutexLock lock(mu_);
  return live_nodes_;
}

LocalPodInfo LocalKubelet::info_of(const PodState& s) {
  LocalPodInfo i;
  i.ns = s.ns;
  i.name = s.name;
  i.uid = s.uid;
  i.node = s.node;
  i.pid = s.proc ? s.proc->pid : -1;
  i.running = s.alive();
  i.exit_code = s.proc ? s.proc->exit_code : std::nullopt;
  i.restart_count = s.restart_count;
  i.preempted = s.preempted;
  i.terminating = s.term_sent;
  i.lost = s.lost;
  i.log = s.log;
  return i;
}

std::optional<LocalPodInfo> LocalKubelet::pod(const std::string& ns,
                                              const std::string& name) const {
  MutexLock lock(mu_);
  const PodState* best = nullptr;
  for (const auto& [uid, s] : pods_) {
    if (s->ns == ns && s->name == name && (best == nullptr || !s->gone)) best = s.get();
  }
  if (best == nullptr) return std::nullopt;
  return info_of(*best);
}

std::vector<LocalPodInfo> LocalKubelet::pods() const {
  MutexLock lock(mu_);
  std::vector<LocalPodInfo> out;
  for (const auto& [uid, s] : pods_) out.push_back(info_of(*s));
  return out;
}

bool LocalKubelet::wait_for(const std::function<bool()>& predicate, milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(mu_);
  while (true) {
    const uint64_t seen = changes_;
    lock.Unlock();
    if (predicate()) return true;
    lock.Lock();
    if (!cv_.wait_until(mu_, deadline, [&]() REQUIRES(mu_) { return changes_ != seen; })) {
      lock.Unlock();
      return predicate();
    }
  }
}

std::pair<std::string, std::string> LocalKubelet::resolve_pod(
    const std::string& ns_slash_pod) const {
  if (const size_t slash = ns_slash_pod.find('/'); slash != std::string::npos) {
    return {ns_slash_pod.substr(0, slash), ns_slash_pod.substr(slash + 1)};
  }
  std::set<std::string> namespaces;
  {
    MutexLock lock(mu_);
    for (const auto& [uid, s] : pods_) {
      if (s->name == ns_slash_pod) namespaces.insert(s->ns);
    }
  }
  if (namespaces.empty()) {
    throw NotFound("local kubelet: no pod named " + ns_slash_pod +
                   " runs here; write NAMESPACE/POD");
  }
  if (namespaces.size() > 1) {
    std::string list;
    for (const std::string& ns : namespaces) list += (list.empty() ? "" : ", ") + ns;
    throw InvalidArgument("local kubelet: a pod named " + ns_slash_pod +
                          " runs in several namespaces (" + list + "); write NAMESPACE/POD");
  }
  return {*namespaces.begin(), ns_slash_pod};
}

std::string run_control_command(LocalKubelet& k, const std::string& line) {
  std::istringstream in(line);
  std::string verb, arg, extra;
  in >> verb >> arg >> extra;
  if (verb.empty() || verb[0] == '#') return "";
  if (verb == "preempt" && !arg.empty()) {
    const auto [ns, name] = k.resolve_pod(arg);
    k.preempt(ns, name, extra.empty() ? "PreemptionByScheduler" : extra);
    return "preempting " + ns + "/" + name;
  }
  if (verb == "lose-node" && !arg.empty()) {
    LoseNodeOptions o;
    if (!extra.empty()) {
      try {
        o.evict_after = std::chrono::milliseconds(std::stoll(extra) * 1000);
      } catch (const std::exception&) {
        throw InvalidArgument("control line '" + line + "': EVICT_SECONDS must be a number");
      }
    }
    k.lose_node(arg, o);
    return "lost node " + arg;
  }
  if (verb == "add-node" && !arg.empty()) {
    k.add_node(arg);
    return "added node " + arg;
  }
  throw InvalidArgument("control line '" + line +
                        "': expected preempt NS/POD [REASON] | lose-node NODE [EVICT_SECONDS] | "
                        "add-node NODE");
}

}  // namespace longhaul::kubelet
