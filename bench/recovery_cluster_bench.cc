// Recovery benchmark on the local cluster: a 3-replica TrainingJob (Chief + 2 Workers) run by the
// longhaul-operator binary against the fake API server (--api real: etcd + kube-apiserver +
// kube-controller-manager of tests/envtest), its pods run as longhaul-worker processes
// by the local kubelet (tests/kubelet), one replica lost per scenario, under restartScope Replica
// (survivors regroup in place, supervisor.on_peer_loss regroup) and Group (every pod re-created,
// on_peer_loss exit). bench/recovery_bench.sh builds and runs it; bench/README.md has the results.
//
//   build/<dir>/bench/recovery_cluster_bench [--api fake|real] [--scopes Replica,Group] [--faults
//   ...]
//       [--preset tiny] [--batch 4] [--seq 64] [--save-every 50] [--lose-at 120]
//
// Faults: worker-kill (SIGKILL to the process group of the pod of rank 2: the container dies),
// chief-kill (the same for the chief), preempt (the kubelet's preemption with notice:
// DisruptionTarget, then SIGTERM, for the pod of rank 2), delete (the pod of rank 2 deleted
// through the API with its grace period, as `kubectl delete pod` or a drain does: SIGTERM).
// Everything is timed on this process's steady clock by polling: every 10 ms the pods' log files
// (every incarnation of a pod is appended to one file; log.every_steps 1), every 2 ms the pods seen
// by a watch (a new uid: the pod was re-created; stamped when the watch delivered it) and the
// kubelet (the new pod's process started). Reported per scenario:
//   fault_to_step_s  fault -> the next step completed after the group resumed (a survivor's log;
//                    for Group, the restarted chief's);
//   pod_start_s      pod created -> its process started (on a real cluster: scheduling, image pull,
//                    container start); the largest over the re-created pods;
//   excl_start_s     fault_to_step_s - pod_start_s (the goal: < 5 s);
//   fault_to_pod_s   fault -> the last re-created pod exists (the operator noticing and acting,
//                    including the old pod's deletion);
//   start_to_join_s  the last re-created process started -> it printed "starting/resuming at step"
//                    (process start-up, rendezvous, state broadcast or checkpoint read);
//   steps_redone     the highest step any replica printed before the group resumed - the step it
//                    resumed from (the goal: 0);
//   pods_recreated, ckpt_read (a "restored checkpoint" log line after the fault), and for Replica
//   the operator's own status.lastRecoveryMilliseconds (fault observed -> every replica Running).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/mutex.h"
#include "longhaul/e2e/local_cluster.h"
#include "longhaul/kube/config.h"
#include "longhaul/kube/informer.h"
#ifdef LONGHAUL_BENCH_REAL
#include "longhaul/envtest/control_plane.h"
#endif

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
namespace res = longhaul::kube::resources;

struct Options {
  std::string api = "fake";
  std::string ns = "default";
  std::string preset = "tiny";
  int batch = 4, seq = 64, save_every = 50, lose_at = 120;
  fs::path operator_binary = LONGHAUL_OPERATOR_BINARY;
  fs::path worker_dir = LONGHAUL_WORKER_DIR;
  fs::path root;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

json job_manifest(const std::string& name, const std::string& scope, const Options& o) {
  const int max_steps = o.lose_at + 3 * o.save_every;
  const std::string on_peer_loss = scope == "Group" ? "exit" : "regroup";
  json args = json::array({"train"});
  for (const std::string& s : {
           "model.preset=" + o.preset,
           "training.batch_size=" + std::to_string(o.batch),
           "training.seq_len=" + std::to_string(o.seq),
           "training.max_steps=" + std::to_string(max_steps),
           std::string("training.warmup_steps=2"),
           "checkpoint.save_model_steps=" + std::to_string(o.save_every),
           std::string("checkpoint.save_model_secs=0"),
           std::string("checkpoint.max_to_keep=2"),
           std::string("summaries.every_steps=0"),
           std::string("summaries.save_summaries_secs=0"),
           std::string("log.every_steps=1"),
           std::string("eval.every_steps=0"),
           "supervisor.on_peer_loss=" + on_peer_loss,
           std::string("grace_period_secs=25"),
       }) {
    args.push_back("--set=" + s);
  }
  const json container = {{"name", "worker"},
                          {"image", "ghcr.io/longhaul-dev/longhaul-worker:0.1.0"},
                          {"args", args},
                          {"env", {{{"name", "LONGHAUL_NUM_THREADS"}, {"value", "1"}}}}};
  const json tmpl = {
      {"spec", {{"terminationGracePeriodSeconds", 30}, {"containers", {container}}}}};
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", o.ns}}},
          {"spec",
           {{"successPolicy", "ChiefSucceeds"},
            {"logdir", {{"size", "1Gi"}, {"mountPath", "/logdir"}}},
            {"runPolicy", {{"restartScope", scope}, {"nodeLostTimeoutSeconds", 1}}},
            {"replicaSpecs",
             {{"Chief", {{"replicas", 1}, {"restartPolicy", "ExitCode"}, {"template", tmpl}}},
              {"Worker", {{"replicas", 2}, {"restartPolicy", "ExitCode"}, {"template", tmpl}}}}}}}};
}

// The lines the pods of one job wrote, each stamped when this process first saw it.
class PodLogs {
 public:
  struct Line {
    Clock::time_point seen;
    std::string pod, text;
  };
  PodLogs(longhaul::kubelet::LocalKubelet& kubelet, std::string ns, std::vector<std::string> pods)
      : kubelet_(kubelet), ns_(std::move(ns)), pods_(std::move(pods)) {}
  void poll() {
    const auto now = Clock::now();
    for (const std::string& pod : pods_) {
      std::ifstream in(kubelet_.log_path(ns_, pod), std::ios::binary);
      if (!in) continue;
      uint64_t& offset = offsets_[pod];
      in.seekg(0, std::ios::end);
      const auto size = static_cast<uint64_t>(in.tellg());
      if (size <= offset) continue;
      in.seekg(static_cast<std::streamoff>(offset));
      std::string chunk(size - offset, '\0');
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const size_t last = chunk.rfind('\n');
      if (last == std::string::npos) continue;  // a whole line only
      offset += last + 1;
      std::istringstream lines(chunk.substr(0, last));
      for (std::string text; std::getline(lines, text);) lines_.push_back({now, pod, text});
    }
  }
  const std::vector<Line>& lines() const { return lines_; }

 private:
  longhaul::kubelet::LocalKubelet& kubelet_;
  std::string ns_;
  std::vector<std::string> pods_;
  std::map<std::string, uint64_t> offsets_;
  std::vector<Line> lines_;
};

std::optional<int64_t> step_line(const std::string& text) {
  static const std::regex re(R"(^step +(\d+)/)");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return std::nullopt;
  return std::stoll(m[1].str());
}

std::optional<int64_t> start_line(const std::string& text) {
  static const std::regex re(R"((starting|resuming) at step (\d+)/)");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return std::nullopt;
  return std::stoll(m[2].str());
}

struct Fault {
  enum class Kind { kKill, kPreempt, kDelete };
  std::string name;
  bool chief = false;  // the victim is the chief (else the worker of rank 2)
  Kind kind = Kind::kKill;
};

struct Result {
  std::string scope, fault;
  bool ok = false;
  std::string why;  // when !ok
  double fault_to_step = 0, pod_start = 0, fault_to_pod = 0, start_to_join = 0;
  int64_t before = 0, resumed = 0, redone = 0;
  int recreated = 0;
  bool ckpt_read = false;
  std::optional<int64_t> operator_ms;
};

// When each pod uid was first seen, from a watch (an informer) on the namespace's pods: the
// pods' creation times on this process's clock, on either API server, without polling it.
class PodCreations {
 public:
  PodCreations(std::shared_ptr<longhaul::kube::Client> client, const std::string& ns)
      : informer_(std::move(client),
                  longhaul::kube::InformerOptions{.resource = res::kPods, .ns = ns}) {
    auto seen = [this](const json& pod) EXCLUDES(mu_) {
      const json& meta = pod.at("metadata");
      longhaul::MutexLock lock(mu_);
      const std::string uid = meta.value("uid", "");
      if (!first_seen_.count(uid)) {
        first_seen_[uid] = Clock::now();
        uid_of_[meta.value("name", "")] = uid;
      }
    };
    informer_.add_handlers({.on_add = seen,
                            .on_update = [seen](const json&, const json& p) { seen(p); },
                            .on_delete = {}});
    informer_.start();
    if (!informer_.wait_for_sync(60s)) {
      throw longhaul::Unavailable("the pods of namespace " + ns +
                                  " could not be listed within 60 s");
    }
  }
  ~PodCreations() { informer_.stop(); }
  // The newest uid seen for pod `name` and when it was first seen.
  std::optional<std::pair<std::string, Clock::time_point>> latest(const std::string& name) const
      EXCLUDES(mu_) {
    longhaul::MutexLock lock(mu_);
    auto it = uid_of_.find(name);
    if (it == uid_of_.end()) return std::nullopt;
    return std::make_pair(it->second, first_seen_.at(it->second));
  }

 private:
  mutable longhaul::Mutex mu_;
  std::map<std::string, Clock::time_point> first_seen_ GUARDED_BY(mu_);  // uid -> first seen
  std::map<std::string, std::string> uid_of_ GUARDED_BY(mu_);            // pod name -> newest uid
  // Last: destroyed (its watch thread stopped) before the members its handler uses, also when
  // the constructor throws and ~PodCreations does not run.
  longhaul::kube::Informer informer_;
};

class Bench {
 public:
  explicit Bench(Options o) : o_(std::move(o)) {
    longhaul::e2e::LocalClusterOptions co;
    co.root = o_.root;
    co.operator_binary = o_.operator_binary;
    co.bin_dirs = {o_.worker_dir};
    co.nodes = {"local-node-0", "local-node-1", "local-node-2"};
#ifdef LONGHAUL_BENCH_REAL
    if (o_.api == "real") {
      namespace envtest = longhaul::envtest;
      std::string why;
      const auto assets = envtest::find_assets(&why);
      if (!assets) throw longhaul::FailedPrecondition("--api real: " + why);
      envtest::ControlPlaneOptions po;
      po.crds = envtest::project_crds();
      plane_ = envtest::ControlPlane::start(*assets, po);
      o_.ns = "recovery-bench";
      plane_->ensure_namespace(o_.ns);
      co.external_api = plane_->admin_config();
      co.external_kubeconfig = plane_->admin_kubeconfig();
      co.watch_namespace = o_.ns;
    }
#endif
    cluster_ = std::make_unique<longhaul::e2e::LocalCluster>(co);
    cluster_->start();
    watch_client_ = o_.api == "real"
#ifdef LONGHAUL_BENCH_REAL
                        ? std::shared_ptr<longhaul::kube::Client>(plane_->admin_client())
#else
                        ? nullptr
#endif
                        : std::make_shared<longhaul::kube::HttpClient>(
                              longhaul::kube::load_kubeconfig(cluster_->kubeconfig().string()));
    creations_ = std::make_unique<PodCreations>(watch_client_, o_.ns);
  }
  ~Bench() {
    creations_.reset();
    cluster_->stop();
#ifdef LONGHAUL_BENCH_REAL
    if (plane_) plane_->stop();
#endif
  }
  const std::string& ns() const { return o_.ns; }

  Result run(const std::string& scope, const Fault& fault) {
    Result r;
    r.scope = scope;
    r.fault = fault.name;
    const std::string name = "rb" + std::to_string(++jobs_);
    const std::string chief = name + "-chief-0";
    const std::vector<std::string> pods = {chief, name + "-worker-0", name + "-worker-1"};
    const std::string victim = fault.chief ? chief : pods[2];
    // A survivor's log shows when training goes on; with Group every pod restarts, and the chief
    // is the one that restores.
    const std::string watch = scope == "Group" ? chief : (fault.chief ? pods[1] : chief);
    auto& kubelet = cluster_->kubelet();
    const std::string& ns = o_.ns;
    cluster_->apply(job_manifest(name, scope, o_));
    PodLogs logs(kubelet, ns, pods);
    auto last_step = [&](const std::string& pod) {
      int64_t step = -1;
      for (const auto& l : logs.lines()) {
        if (l.pod != pod) continue;
        if (auto s = step_line(l.text)) step = *s;
      }
      return step;
    };
    auto deadline = Clock::now() + 300s;
    while (last_step(watch) < o_.lose_at) {
      if (Clock::now() > deadline) {
        r.why = "no step " + std::to_string(o_.lose_at) + " within 300 s";
        finish(name, pods);
        return r;
      }
      std::this_thread::sleep_for(10ms);
      logs.poll();
    }
    std::map<std::string, std::string> old_uid, new_uid;
    std::map<std::string, Clock::time_point> created, started;
    for (const std::string& p : pods) {
      auto info = kubelet.pod(ns, p);
      old_uid[p] = info ? info->uid : "";
    }
    const auto victim_info = kubelet.pod(ns, victim);
    const auto fault_at = Clock::now();
    switch (fault.kind) {
      case Fault::Kind::kPreempt:
        kubelet.preempt(ns, victim);
        break;
      case Fault::Kind::kDelete:
        cluster_->client().remove(res::kPods, ns, victim);  // the pod's own grace period
        break;
      case Fault::Kind::kKill:
        // The pod's process group: the container dies.
        if (victim_info && victim_info->pid > 0) ::kill(-victim_info->pid, SIGKILL);
        break;
    }
    const size_t first_after_fault = logs.lines().size();

    std::optional<Clock::time_point> resumed_at, next_step_at;
    deadline = Clock::now() + 300s;
    // Pods (from the watch) and processes are checked every 2 ms, the log files every 10 ms.
    for (int tick = 0; !next_step_at && Clock::now() < deadline; ++tick) {
      std::this_thread::sleep_for(2ms);
      const auto now = Clock::now();
      for (const std::string& p : pods) {
        if (!created.count(p)) {
          auto latest = creations_->latest(p);
          if (latest && latest->first != old_uid[p]) {
            created[p] = latest->second;
            new_uid[p] = latest->first;
          }
        }
        if (created.count(p) && !started.count(p)) {
          auto info = kubelet.pod(ns, p);
          if (info && info->uid == new_uid[p] && info->pid > 0) started[p] = now;
        }
      }
      if (tick % 5 != 0) continue;
      logs.poll();
      // The group resumed: the re-created victim (Replica) or the restarted chief (Group) said
      // from which step.
      const std::string resumer = scope == "Group" ? chief : victim;
      const auto& lines = logs.lines();
      for (size_t i = first_after_fault; i < lines.size(); ++i) {
        const auto& l = lines[i];
        if (!resumed_at && l.pod == resumer) {
          if (auto s = start_line(l.text)) {
            resumed_at = l.seen;
            r.resumed = *s;
          }
        } else if (resumed_at && l.pod == watch && l.seen >= *resumed_at) {
          if (auto s = step_line(l.text); s && *s > r.resumed) {
            next_step_at = l.seen;
            break;
          }
        }
      }
    }
    if (!next_step_at) {
      r.why = resumed_at ? "no step after the resume within 300 s" : "never resumed within 300 s";
      finish(name, pods);
      return r;
    }
    r.ok = true;
    r.fault_to_step = seconds(*next_step_at - fault_at);
    for (const auto& l : logs.lines()) {
      if (l.seen > *resumed_at) break;
      if (auto s = step_line(l.text)) r.before = std::max(r.before, *s);
    }
    for (size_t i = first_after_fault; i < logs.lines().size(); ++i) {
      if (logs.lines()[i].text.find("restored checkpoint") != std::string::npos) r.ckpt_read = true;
    }
    r.redone = std::max<int64_t>(0, r.before - r.resumed);
    r.recreated = static_cast<int>(created.size());
    Clock::time_point last_created = fault_at, last_started = fault_at;
    for (const auto& [p, t] : created) {
      last_created = std::max(last_created, t);
      if (started.count(p)) {
        r.pod_start = std::max(r.pod_start, seconds(started[p] - t));
        last_started = std::max(last_started, started[p]);
      }
    }
    r.fault_to_pod = seconds(last_created - fault_at);
    // The last re-created process to say where it starts.
    Clock::time_point joined = last_started;
    for (const auto& [p, t] : started) {
      for (size_t i = first_after_fault; i < logs.lines().size(); ++i) {
        const auto& l = logs.lines()[i];
        if (l.pod == p && l.seen >= t && start_line(l.text)) {
          joined = std::max(joined, l.seen);
          break;
        }
      }
    }
    r.start_to_join = seconds(joined - last_started);
    if (scope != "Group") {
      // The operator writes its own measure once every replica is Running again.
      const auto until = Clock::now() + 10s;
      while (Clock::now() < until) {
        json st = json::object();
        try {
          st = cluster_->client().get(res::kTrainingJobs, ns, name).value("status", json::object());
        } catch (const longhaul::kube::ApiError&) {
        }
        if (st.value("recoveries", 0) >= 1 && st.value("recoveringSince", "").empty() &&
            st.contains("lastRecoveryMilliseconds")) {
          r.operator_ms = st["lastRecoveryMilliseconds"].get<int64_t>();
          break;
        }
        std::this_thread::sleep_for(20ms);
      }
    }
    finish(name, pods);
    return r;
  }

 private:
  // Deletes the job (its pods go with it) and waits until none of its processes runs.
  void finish(const std::string& name, const std::vector<std::string>& pods) {
    try {
      cluster_->client().remove(res::kTrainingJobs, o_.ns, name);
    } catch (const longhaul::Error& e) {
      std::fprintf(stderr, "deleting %s: %s\n", name.c_str(), e.what());
    }
    cluster_->kubelet().wait_for(
        [&] {
          for (const std::string& p : pods) {
            auto info = cluster_->kubelet().pod(o_.ns, p);
            if (info && info->running) return false;
          }
          return true;
        },
        120s);
  }

  Options o_;
#ifdef LONGHAUL_BENCH_REAL
  std::unique_ptr<longhaul::envtest::ControlPlane> plane_;
#endif
  std::unique_ptr<longhaul::e2e::LocalCluster> cluster_;
  std::shared_ptr<longhaul::kube::Client> watch_client_;
  std::unique_ptr<PodCreations> creations_;
  int jobs_ = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string scopes = "Replica,Group", faults = "worker-kill,chief-kill,preempt,delete";
  CLI::App app{
      "Recovery from a lost replica on the local cluster (fake API server, operator, "
      "local kubelet): see bench/README.md"};
  app.add_option("--api", o.api,
                 "fake (the in-process fake API server) or real (etcd + kube-apiserver + "
                 "kube-controller-manager of tests/envtest, LONGHAUL_KUBE_ASSETS)")
      ->check(CLI::IsMember({"fake", "real"}));
  app.add_option("--scopes", scopes, "restartScope values, comma-separated (Replica, Group)");
  app.add_option("--faults", faults, "worker-kill, chief-kill, preempt, delete (comma-separated)");
  app.add_option("--preset", o.preset, "model preset");
  app.add_option("--batch", o.batch, "micro-batch per replica")->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--save-every", o.save_every, "checkpoint every N steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--lose-at", o.lose_at, "the fault comes once a survivor printed this step")
      ->check(CLI::PositiveNumber);
  app.add_option("--operator-binary", o.operator_binary, "longhaul-operator")
      ->check(CLI::ExistingFile);
  app.add_option("--worker-dir", o.worker_dir, "folder holding longhaul-worker")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
#ifndef LONGHAUL_BENCH_REAL
  if (o.api == "real") {
    std::fprintf(stderr,
                 "--api real: this build has no tests/envtest (configure with the tests on)\n");
    return 2;
  }
#endif

  const std::map<std::string, Fault> known = {
      {"worker-kill", {"worker SIGKILL", false, Fault::Kind::kKill}},
      {"chief-kill", {"chief SIGKILL", true, Fault::Kind::kKill}},
      {"preempt", {"worker preempted (SIGTERM notice)", false, Fault::Kind::kPreempt}},
      {"delete", {"worker pod deleted (grace, SIGTERM)", false, Fault::Kind::kDelete}},
  };
  std::vector<Fault> chosen;
  for (const std::string& f : split(faults)) {
    auto it = known.find(f);
    if (it == known.end()) {
      std::fprintf(stderr,
                   "--faults: unknown fault '%s' (worker-kill, chief-kill, preempt, delete)\n",
                   f.c_str());
      return 2;
    }
    chosen.push_back(it->second);
  }
  for (const std::string& s : split(scopes)) {
    if (s != "Replica" && s != "Group") {
      std::fprintf(stderr, "--scopes: unknown restartScope '%s' (Replica, Group)\n", s.c_str());
      return 2;
    }
  }

  char tmpl[] = "/tmp/recovery_cluster_bench.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  o.root = tmpl;
  std::printf(
      "== recovery on the local cluster: %s API server + longhaul-operator + local kubelet, "
      "3 replicas (Chief + 2 Workers, one node each), %s, per replica batch %dx%d, checkpoint "
      "every %d steps, fault after step %d, %ld CPUs\n",
      o.api == "real" ? "real (envtest)" : "fake", o.preset.c_str(), o.batch, o.seq, o.save_every,
      o.lose_at, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-8s %-36s %8s %8s %8s %8s %8s %7s %6s %5s %11s %9s\n", "scope", "fault", "fault_to",
              "pod", "excl", "fault_to", "start_to", "steps", "pods", "ckpt", "step", "operator");
  std::printf("%-8s %-36s %8s %8s %8s %8s %8s %7s %6s %5s %11s %9s\n", "", "", "step_s", "start_s",
              "start_s", "pod_s", "join_s", "redone", "new", "read", "before->from", "recov_ms");
  std::fflush(stdout);
  int failures = 0;
  try {
    Bench bench(o);
    for (const std::string& scope : split(scopes)) {
      for (const Fault& f : chosen) {
        const Result r = bench.run(scope, f);
        if (!r.ok) {
          std::printf("%-8s %-36s FAILED: %s\n", r.scope.c_str(), r.fault.c_str(), r.why.c_str());
          ++failures;
          std::fflush(stdout);
          continue;
        }
        const std::string steps = std::to_string(r.before) + "->" + std::to_string(r.resumed);
        std::printf("%-8s %-36s %8.3f %8.3f %8.3f %8.3f %8.3f %7lld %6d %5s %11s %9s\n",
                    r.scope.c_str(), r.fault.c_str(), r.fault_to_step, r.pod_start,
                    r.fault_to_step - r.pod_start, r.fault_to_pod, r.start_to_join,
                    static_cast<long long>(r.redone), r.recreated, r.ckpt_read ? "yes" : "no",
                    steps.c_str(), r.operator_ms ? std::to_string(*r.operator_ms).c_str() : "-");
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recovery_cluster_bench: %s\n", e.what());
    return 1;
  }
  if (failures == 0)
    fs::remove_all(o.root);
  else
    std::fprintf(stderr, "kept %s (logs/) for the failed scenarios\n", o.root.c_str());
  return failures == 0 ? 0 : 1;
}
