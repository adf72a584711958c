// The TrainingJob reconciler (see reconciler.h for the contract and the order of the steps).
#include "longhaul/controller/reconciler.h"

#include <algorithm>
#include <exception>
#include <random>
#include <stop_token>
#include <thread>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/controller/children.h"
#include "longhaul/controller/cleanup_policy.h"
#include "longhaul/controller/failure_policy.h"
#include "longhaul/controller/ownership.h"
#include "longhaul/controller/recovery_policy.h"
#include "longhaul/controller/success_policy.h"
#include "longhaul/kube/stop.h"

namespace longhaul::controller {

namespace res = kube::resources;
using api::ReplicaType;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// One reconcile pass over one job.

namespace {

struct ObservedPod {
  json object;
  std::string name;
  std::string uid;
  int64_t attempt = 0;           // longhaul.dev/restart-attempt
  int32_t counted_restarts = 0;  // longhaul.dev/counted-restarts
  std::string phase;
  bool terminating = false;
  std::optional<api::Time> deletion_time;
  bool ready = false;
};

// An integer annotation; 0 when absent or not a number.
int64_t annotation_number(const json& md, std::string_view key) {
  if (!md.contains("annotations") || !md["annotations"].is_object()) return 0;
  const std::string a = md["annotations"].value(std::string(key), "");
  try {
    return a.empty() ? 0 : std::stoll(a);
  } catch (const std::exception&) {
    return 0;
  }
}

ObservedPod observe_pod(json pod) {
  ObservedPod p;
  const json& md = pod.at("metadata");
  p.name = md.value("name", std::string());
  p.uid = md.value("uid", std::string());
  p.attempt = annotation_number(md, api::kAnnotationRestartAttempt);
  p.counted_restarts = static_cast<int32_t>(annotation_number(md, api::kAnnotationCountedRestarts));
  if (md.contains("deletionTimestamp") && md["deletionTimestamp"].is_string()) {
    p.terminating = true;
    p.deletion_time = api::parse_time_or_null(md["deletionTimestamp"].get<std::string>());
  }
  const json status = pod.value("status", json::object());
  p.phase = status.value("phase", std::string());
  for (const json& c : status.value("conditions", json::array())) {
    if (c.value("type", "") == "Ready" && c.value("status", "") == "True") p.ready = true;
  }
  p.object = std::move(pod);
  return p;
}

bool owned_by(const json& obj, const std::string& uid, const std::string& name) {
  return controlled_by_job(obj, uid, name);
}

struct Action {
  enum class Kind {
    kCreatePod,
    kDeletePod,
    kForceDeletePod,
    kAnnotatePod,  // records counted container restarts on the pod (object: the merge patch)
    kCreateService,
    kCreateClaim
  };
  Kind kind;
  std::string name;
  std::string uid;
  json object;
  std::string reason;  // event reason ("": no event)
  // Pod actions: why, shared by every pod of one decision ("restart attempt 2"); the pass
  // records one Event per (kind, reason, message) naming the pods. Others: the Event message.
  std::string message;
  ReplicaType type = ReplicaType::kWorker;  // pods: the replica the pod belongs to
};

// "a, b, c" or "a, b, c, d, e and 995 more"
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

// The TrainingJob field an object's field comes from: a pod's "spec.containers[0].name" is
// "spec.replicaSpecs.Worker.template.spec.containers[0].name".
std::string template_field(ReplicaType type, const std::string& pod_field) {
  return "spec.replicaSpecs." + std::string(api::replica_type_name(type)) + ".template" +
         (pod_field.empty() ? "" : "." + pod_field);
}

// The TrainingJob field a logdir claim's field comes from (build_claim): its size, storage
// class, access modes, or its name (the job's name + "-logdir").
std::string claim_field(const std::string& field) {
  auto starts = [&](std::string_view prefix) { return field.rfind(prefix, 0) == 0; };
  if (starts("spec.resources")) return "spec.logdir.size";
  if (starts("spec.storageClassName")) return "spec.logdir.storageClassName";
  if (starts("spec.accessModes")) return "spec.logdir.accessModes";
  if (starts("metadata.name")) return "metadata.name";
  return "spec.logdir";
}

// The TrainingJob field a headless Service's field comes from (build_service): its name is the
// job's; its ports are the replicas' container ports.
std::string service_field(const std::string& field) {
  if (field.rfind("metadata.name", 0) == 0) return "metadata.name";
  if (field.rfind("spec.ports", 0) == 0) {
    return "spec.replicaSpecs.*.template.spec.containers[*].ports (the Service's " + field + ")";
  }
  return "spec.replicaSpecs";
}

// An InvalidSpec message for a create the API server refused as invalid: the TrainingJob
// field(s) first, the server's words, the object, and what to do.
std::string refused_as_invalid(const Action& a, const std::string& ns, const kube::ApiError& e) {
  std::string fields;
  for (const json& cause : e.causes()) {
    if (!cause.is_object()) continue;
    const std::string field = cause.value("field", std::string());
    const std::string what = cause.value("message", std::string());
    std::string mapped;
    if (a.kind == Action::Kind::kCreatePod) {
      mapped = template_field(a.type, field);
    } else if (a.kind == Action::Kind::kCreateClaim) {
      mapped = claim_field(field);
    } else {
      mapped = service_field(field);
    }
    fields += (fields.empty() ? "" : "; ") + mapped + ": " + what;
  }
  const std::string object = (a.kind == Action::Kind::kCreatePod     ? "pod "
                              : a.kind == Action::Kind::kCreateClaim ? "logdir claim "
                                                                     : "Service ") +
                             ns + "/" + a.name;
  if (fields.empty()) {
    fields = (a.kind == Action::Kind::kCreatePod     ? template_field(a.type, "")
              : a.kind == Action::Kind::kCreateClaim ? std::string("spec.logdir")
                                                     : std::string("spec.replicaSpecs")) +
             ": " + (e.status_message().empty() ? std::string(e.what()) : e.status_message());
  }
  return fields + " (the API server refused " + object + " with HTTP " +
         std::to_string(e.http_status()) + "; fix the TrainingJob and create it again)";
}

// A pod name's record when status keeps none for it (api::TrainingJobStatus::pods): a pod of
// the group's incarnation or newer carries its attempt and counted restarts itself; a name with
// no pod was seen created and is gone. A record that says "not seen created yet" is never
// settled: status keeps it until the pod is seen.
api::PodRecord settled_record(const ObservedPod* op, int64_t group_attempt) {
  if (op != nullptr && op->attempt >= group_attempt) {
    return {op->attempt, true, op->counted_restarts};
  }
  return {group_attempt, op == nullptr, 0};
}

// Why a pod is not simply running, in a word or two for status.podStatuses: Terminating, the
// pod's reason (Evicted), a container's waiting reason (ImagePullBackOff, CrashLoopBackOff), a
// terminated container ("Error (exit code 1)"), or why it is not scheduled (Unschedulable).
std::string pod_reason(const json& pod) {
  constexpr size_t kMaxReason = 128;
  auto shorten = [&](std::string r) {
    if (r.size() > kMaxReason) r.resize(kMaxReason);
    return r;
  };
  const json& md = pod.at("metadata");
  if (md.contains("deletionTimestamp") && md["deletionTimestamp"].is_string()) {
    return "Terminating";
  }
  const json status = pod.value("status", json::object());
  if (const std::string r = status.value("reason", std::string()); !r.empty()) return shorten(r);
  for (const char* which : {"initContainerStatuses", "containerStatuses"}) {
    for (const json& cs : status.value(which, json::array())) {
      const json state = cs.value("state", json::object());
      if (auto w = state.find("waiting"); w != state.end() && w->is_object()) {
        if (const std::string r = w->value("reason", std::string()); !r.empty()) {
          return shorten(r);
        }
      }
      if (auto t = state.find("terminated"); t != state.end() && t->is_object()) {
        const int code = t->value("exitCode", 0);
        if (code != 0 || status.value("phase", "") == "Failed") {
          return shorten(t->value("reason", std::string("Error")) + " (exit code " +
                         std::to_string(code) + ")");
        }
      }
    }
  }
  for (const json& c : status.value("conditions", json::array())) {
    if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False") {
      return shorten(c.value("reason", std::string("NotScheduled")));
    }
  }
  return "";
}

struct Candidate {  // a finished or disrupted current pod
  std::string name;
  PodClassification c;
};

// Pod creates or deletes of one pass in flight at once, at most (slow start up to it).
constexpr size_t kMaxParallelPodWrites = 16;

milliseconds until(api::Time now, api::Time when) {
  return std::max(milliseconds(0), duration_cast<milliseconds>(when - now));
}

bool is_create(Action::Kind k) {
  return k == Action::Kind::kCreatePod || k == Action::Kind::kCreateService ||
         k == Action::Kind::kCreateClaim;
}

// Pod writes, which go out in slow-start batches.
bool batchable(Action::Kind k) {
  return k == Action::Kind::kCreatePod || k == Action::Kind::kDeletePod ||
         k == Action::Kind::kForceDeletePod;
}

const kube::Resource& resource_of(const Action& a) {
  return a.kind == Action::Kind::kCreateService ? res::kServices
         : a.kind == Action::Kind::kCreateClaim ? res::kPersistentVolumeClaims
                                                : res::kPods;
}

// Desired pods, in rank order (chief first).
struct Desired {
  ReplicaType type;
  int index;
  std::string pod;
};

}  // namespace

// One reconcile pass over one job: what it read, what it decided and what it did. Its step
// methods run in the order reconcile() lists; each reads what the earlier ones left here.
struct Reconciler::Pass {
  Pass(Reconciler& reconciler, const std::string& job_ns, const std::string& job_name)
      : r(reconciler),
        ns(job_ns),
        name(job_name),
        key(job_ns + "/" + job_name),
        now(reconciler.options_.now()) {}

  Reconciler& r;
  const std::string ns, name, key;
  const api::Time now;

  // What the pass read (steps 1-3).
  json job;
  std::string job_uid;
  api::TrainingJobStatus old_status;  // as last written
  api::TrainingJobStatus st;          // as this pass decides it
  api::TrainingJobSpec spec;
  std::string invalid;                       // why the spec cannot run; "" when it can
  std::map<std::string, ObservedPod> owned;  // the pods this job owns, by name
  std::set<std::string> occupied;            // every name some pod holds
  // The job's last refused create, and whether its backoff still holds creates back.
  std::optional<CreateFailure> create_failure;
  bool create_hold = false;
  std::vector<Desired> desired;
  bool claim_exists = false, service_exists = false;

  // What the current pods show (step 8).
  PodOutcomes outcomes;
  std::vector<Candidate> disrupted, retryable, permanent;
  int container_restart_delta = 0;
  std::string container_restart_pod;                // the last pod that restarted containers
  std::vector<std::string> container_restart_pods;  // for the Event: a few names, then "N more"

  // What the pass will do: writes after the status commit, Events, the next requeue.
  std::vector<Action> actions;
  std::optional<milliseconds> requeue;
  struct PendingEvent {
    std::string type, reason, message;
  };
  std::vector<PendingEvent> events;
  // Replicas replaced in place by this pass: they share one new attempt, and each reason gets
  // one Event naming them (a mass preemption is one Event and one status record range).
  std::optional<int64_t> replacement_attempt;
  struct Replaced {
    std::string first_message;
    std::vector<std::string> pods;
  };
  std::map<std::string, Replaced> replaced;

  // What acting did (step 13): pods written per (kind, reason, why), for one Event each; the
  // claim and Service created, (reason, "created ..."), told in the pods' Event; the first
  // refused create.
  struct Group {
    std::string type;
    std::vector<std::string> pods;
  };
  std::map<std::tuple<Action::Kind, std::string, std::string>, Group> done;
  std::vector<std::pair<std::string, std::string>> created_children;
  std::optional<std::string> refused_transient, refused_invalid;
  bool created_any = false;

  // The steps, in the order reconcile() runs them.
  bool fetch();
  ReconcileResult forget();
  void validate();
  void observe_pods();
  void plan_desired_pods();
  void clean_up_finished();
  void suspend();
  void resume_and_check_deadline();
  bool active() const { return !api::is_finished(st) && !policy().suspend; }
  void ensure_claim_and_service();
  void delete_unwanted_pods();
  void classify_pods();
  void count_container_restarts();
  void decide();
  void summarize_conditions();
  void delete_old_incarnations();
  void annotate_counted_restarts();
  void create_missing_pods();
  void update_created_condition();
  void count_replicas();
  void track_progress();
  void commit_status();
  void act();
  void record_action_events();
  void handle_refused_creates();
  bool ttl_expired() const;
  ReconcileResult delete_job();

  // What the steps share.
  const api::RunPolicy& policy() const { return spec.run_policy; }
  void budget_exceeded(const std::string& what);
  void restart_group(const std::string& reason, const std::string& message, milliseconds delay);
  milliseconds backoff_for_failures() const;
  void restart_scope_group();
  void restart_scope_replica();
  const Candidate* group_restart_cause(std::string_view& reason);
  std::map<std::string, api::PodRecord> unsettled_pods() const;
  void write_status();
  void flush_events();
  std::exception_ptr call(const Action& a) const;
  void settle(const Action& a, std::exception_ptr error);
  void settle_create(const Action& a, std::exception_ptr error);

  void requeue_in(milliseconds d) {
    d = std::max(d, milliseconds(1));
    if (!requeue || d < *requeue) requeue = d;
  }
  void event(std::string_view type, std::string_view reason, std::string message) {
    events.push_back({std::string(type), std::string(reason), std::move(message)});
  }
  std::string ref(const std::string& pod) const { return ns + "/" + pod; }
  void report_phase(const std::string& phase) const {
    if (r.options_.on_phase) r.options_.on_phase(key, phase);
  }

  // Sets phase and conditions of a finished job and stamps completionTime.
  void finish(std::string_view phase, std::string_view reason, const std::string& message) {
    st.phase = std::string(phase);
    const bool ok = phase == api::phase::kSucceeded;
    api::set_condition(st, ok ? api::condition::kSucceeded : api::condition::kFailed, "True",
                       reason, message, now);
    if (api::find_condition(st, api::condition::kRunning)) {
      api::set_condition(st, api::condition::kRunning, "False", reason, message, now);
    }
    if (api::condition_true(st, api::condition::kRestarting)) {
      api::set_condition(st, api::condition::kRestarting, "False", reason, message, now);
    }
    abandon_recovery(st, reason, message, now);
    st.next_restart_time.clear();
    if (st.completion_time.empty()) st.completion_time = api::format_time(now);
    event(ok ? "Normal" : "Warning", reason, message);
  }

  // Force-deletes `p` when it has been Terminating past nodeLostTimeoutSeconds; else a timer.
  void check_stuck(const ObservedPod& p) {
    if (!p.terminating || !p.deletion_time) return;
    const api::Time limit =
        *p.deletion_time + std::chrono::seconds(policy().node_lost_timeout_seconds);
    if (now >= limit) {
      actions.push_back({Action::Kind::kForceDeletePod,
                         p.name,
                         p.uid,
                         {},
                         std::string(api::reason::kForceDeletedPod),
                         "stuck Terminating for more than " +
                             std::to_string(policy().node_lost_timeout_seconds) +
                             "s past the deletion deadline (node lost?)"});
    } else {
      requeue_in(until(now, limit));
    }
  }

  // restartScope Replica: re-creates `pod` alone under a new incarnation with the group's
  // LONGHAUL_RESTART_ATTEMPT, so it rejoins the survivors, which are left untouched.
  void replace_in_place(const std::string& pod, const std::string& reason,
                        const std::string& message) {
    if (!st.group_restart_attempt) st.group_restart_attempt = st.pods[pod].restart_attempt;
    if (!replacement_attempt) replacement_attempt = ++st.restart_attempt;
    st.restart_count += 1;
    st.pods[pod] = api::PodRecord{*replacement_attempt, false, 0};
    begin_recovery(st, reason, message + ": replacing pod " + ref(pod) + " in place", now);
    if (r.options_.on_restart) r.options_.on_restart(reason);
    Replaced& group = replaced[reason];
    if (group.pods.empty()) group.first_message = message;
    group.pods.push_back(ref(pod));
  }

  // One Warning Event per reason for the replacements of this pass.
  void record_replacements() {
    for (const auto& [reason, group] : replaced) {
      const size_t n = group.pods.size();
      event("Warning", reason,
            group.first_message +
                (n == 1 ? ": replacing pod " + group.pods.front()
                        : " (and " + std::to_string(n - 1) + " more): replacing pods " +
                              name_list(group.pods)) +
                " in place (recovery " + std::to_string(st.recoveries) + ", restart attempt " +
                std::to_string(*replacement_attempt) + ")");
    }
    replaced.clear();
  }

  void delete_pod(const ObservedPod& p, std::string_view reason, const std::string& why) {
    if (p.terminating || r.expectations_.deletion_pending(key, p.name)) return;
    actions.push_back({Action::Kind::kDeletePod, p.name, p.uid, {}, std::string(reason), why});
  }
};

Reconciler::Reconciler(kube::Client& client, ClusterView* view, EventSink* events,
                       ReconcilerOptions options)
    : client_(client), options_(std::move(options)) {
  if (view == nullptr) {
    own_view_ = std::make_unique<ApiClusterView>(client);
    view = own_view_.get();
  }
  if (events == nullptr) {
    // Not owned: the client outlives the reconciler.
    own_events_ = std::make_unique<RecorderEventSink>(std::make_shared<kube::EventRecorder>(
        std::shared_ptr<kube::Client>(std::shared_ptr<kube::Client>(), &client)));
    events = own_events_.get();
  }
  view_ = view;
  events_ = events;
  progress_ = std::make_unique<ProgressTracker>(options_.progress);
  if (!options_.jitter01) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    options_.jitter01 = [this, rng] {
      std::lock_guard lock(rng_mu_);
      return std::uniform_real_distribution<double>(0.0, 1.0)(*rng);
    };
  }
}

Reconciler::~Reconciler() = default;

// The steps, in order (reconciler.h says why in this order). Every decision goes into the one
// status write of step 12 before step 13 touches a pod.
ReconcileResult Reconciler::reconcile(const std::string& ns, const std::string& name) {
  Pass p(*this, ns, name);
  if (!p.fetch()) return p.forget();  // 1: gone (or going): nothing to do
  p.validate();                       // 2: a spec that cannot run fails the job once
  p.observe_pods();                   // 3: the pods this job owns; the desired ones
  p.plan_desired_pods();
  if (api::is_finished(p.st)) {
    p.clean_up_finished();  // 4: clean-up by policy, stuck pods, TTL
  } else if (p.policy().suspend) {
    p.suspend();  // 5: pods go, the deadline clock stops
  } else {
    p.resume_and_check_deadline();  // 6: resume, start time, activeDeadlineSeconds
  }
  if (p.active()) {
    p.ensure_claim_and_service();  // 7
    p.delete_unwanted_pods();      // 8: classify the current pods
    p.classify_pods();
    p.count_container_restarts();
    p.decide();  // 9: succeed, fail or restart
    if (api::is_finished(p.st)) {
      p.clean_up_finished();
    } else {
      p.summarize_conditions();     // 10: Running, Restarting, phase
      p.delete_old_incarnations();  // 11: plan pod writes
      p.annotate_counted_restarts();
      p.create_missing_pods();
      p.update_created_condition();
    }
  }
  p.count_replicas();
  p.track_progress();
  p.commit_status();  // 12: one status write, only when something changed
  p.act();            // 13: the writes the committed status asks for
  p.record_action_events();
  p.handle_refused_creates();
  p.write_status();  // a second write only when a create was refused
  p.flush_events();
  if (p.ttl_expired()) return p.delete_job();  // the job goes last, after its status
  return ReconcileResult{p.requeue};
}

// Step 1: fetch. False when the job is gone or being deleted: owner references let the garbage
// collector remove its pods, Service and an owned claim.
bool Reconciler::Pass::fetch() {
  try {
    job = r.view_->get_job(ns, name);
  } catch (const kube::NotFoundError&) {
    return false;
  }
  const json& md = job.at("metadata");
  if (md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null()) return false;
  job_uid = md.value("uid", std::string());
  old_status = api::parse_status(job.value("status", json::object()));
  st = old_status;
  st.observed_generation = md.value("generation", int64_t{0});
  return true;
}

// Drops what the reconciler remembers of a job that is gone, and reports no phase.
ReconcileResult Reconciler::Pass::forget() {
  r.expectations_.forget(key);
  r.view_->forget_job(ns, name);
  r.progress_->forget(key);
  {
    MutexLock lock(r.create_mu_);
    r.create_failures_.erase(key);
    for (const std::string& child : {service_name(name), name + "-logdir"}) {
      r.unlabelled_children_.erase(ns + "/" + child);
    }
  }
  report_phase("");
  return {};
}

// Step 2: validate. A spec the operator cannot run fails the job once, with InvalidSpec.
void Reconciler::Pass::validate() {
  try {
    spec = api::parse_spec(job.value("spec", json::object()));
    api::validate_runnable(spec, name);
  } catch (const InvalidArgument& e) {
    invalid = e.what();
  }
  if (!invalid.empty() && !api::is_finished(st)) {
    finish(api::phase::kFailed, api::reason::kInvalidSpec, invalid);
  }
}

// Step 3: observe the pods this job owns. Pods with our label but another owner (a previous
// job of the same name) only block their names. A job whose last create was refused waits out
// its backoff before creating anything again.
void Reconciler::Pass::observe_pods() {
  std::vector<json> listed = r.view_->list_pods(ns, name);
  r.expectations_.observe(key, listed);
  for (json& obj : listed) {
    ObservedPod op = observe_pod(std::move(obj));
    occupied.insert(op.name);
    if (owned_by(op.object, job_uid, name)) owned.emplace(op.name, std::move(op));
  }
  {
    MutexLock lock(r.create_mu_);
    if (auto it = r.create_failures_.find(key); it != r.create_failures_.end()) {
      create_failure = it->second;
    }
  }
  create_hold = create_failure && now < create_failure->retry_at;
}

// The desired pods, in rank order, and every desired pod's record: status keeps only the
// unsettled ones (api::TrainingJobStatus::pods); the others come from the pods
// (settled_record). Names at or past the replicas a type had at the last write are new:
// classify_pods starts them at the job's attempt. A status of an earlier operator
// (legacy_pods) has a record for every name it knew.
void Reconciler::Pass::plan_desired_pods() {
  if (invalid.empty()) {
    for (ReplicaType t : api::kAllReplicaTypes) {
      auto it = spec.replica_specs.find(t);
      if (it == spec.replica_specs.end()) continue;
      for (int i = 0; i < it->second.replicas; ++i) desired.push_back({t, i, pod_name(name, t, i)});
    }
    if (auto c = spec.chief()) st.chief_pod = pod_name(name, c->first, c->second);
  }
  if (!st.legacy_pods) {
    const int64_t group_attempt = st.group_restart_attempt.value_or(0);
    for (const Desired& d : desired) {
      if (st.pods.contains(d.pod)) continue;
      const auto known =
          old_status.replica_statuses.find(std::string(api::replica_type_name(d.type)));
      if (known == old_status.replica_statuses.end() || d.index >= known->second.replicas) {
        continue;
      }
      const auto it = owned.find(d.pod);
      st.pods[d.pod] = settled_record(it == owned.end() ? nullptr : &it->second, group_attempt);
    }
  }
  st.legacy_pods = false;
}

// Step 4: a finished job: clean up pods by policy, force-delete stuck ones, apply the TTL.
void Reconciler::Pass::clean_up_finished() {
  const bool deadline =
      api::find_condition(st, api::condition::kFailed) &&
      api::find_condition(st, api::condition::kFailed)->reason == api::reason::kDeadlineExceeded;
  int cleaned = 0;
  for (const auto& [pod, op] : owned) {
    if (invalid.empty() && should_clean_pod(policy().clean_pod_policy, deadline, op.object) &&
        !r.expectations_.deletion_pending(key, pod)) {
      actions.push_back({Action::Kind::kDeletePod, pod, op.uid, {}, "", ""});
      ++cleaned;
    }
    check_stuck(op);
  }
  if (cleaned > 0) {
    event("Normal", api::reason::kCleanedUpPods,
          "deleted " + std::to_string(cleaned) + " pod(s) by cleanPodPolicy");
  }
  if (invalid.empty()) {
    if (auto left = ttl_remaining(policy(), st, now)) {
      if (*left <= std::chrono::system_clock::duration::zero()) {
        event("Normal", api::reason::kTtlExpired,
              "deleting the job: ttlSecondsAfterFinished=" +
                  std::to_string(*policy().ttl_seconds_after_finished) + " passed");
      } else {
        requeue_in(duration_cast<milliseconds>(*left) + milliseconds(1));
      }
    }
  }
}

// Step 5: suspend. Pods go; the next incarnation starts on resume; the deadline clock stops.
void Reconciler::Pass::suspend() {
  if (!api::condition_true(st, api::condition::kSuspended)) {
    api::set_condition(st, api::condition::kSuspended, "True", api::reason::kSuspended,
                       "runPolicy.suspend is true: pods deleted", now);
    if (api::find_condition(st, api::condition::kRunning)) {
      api::set_condition(st, api::condition::kRunning, "False", api::reason::kSuspended,
                         "the job is suspended", now);
    }
    if (api::condition_true(st, api::condition::kRestarting)) {
      api::set_condition(st, api::condition::kRestarting, "False", api::reason::kSuspended,
                         "the job is suspended", now);
    }
    st.restart_attempt += 1;
    st.group_restart_attempt = st.restart_attempt;
    abandon_recovery(st, api::reason::kSuspended, "the job is suspended", now);
    for (const Desired& d : desired) st.pods[d.pod] = api::PodRecord{st.restart_attempt, false, 0};
    st.start_time.clear();
    st.next_restart_time.clear();
    event("Normal", api::reason::kSuspended, "suspended: deleting the job's pods");
  }
  st.phase = std::string(api::phase::kSuspended);
  for (const auto& [pod, op] : owned) {
    delete_pod(op, api::reason::kDeletedPod, "the job is suspended");
    check_stuck(op);
  }
}

// Step 6: resume a suspended job; the start time and activeDeadlineSeconds.
void Reconciler::Pass::resume_and_check_deadline() {
  if (api::condition_true(st, api::condition::kSuspended)) {
    api::set_condition(st, api::condition::kSuspended, "False", api::reason::kResumed,
                       "runPolicy.suspend is false: pods re-created", now);
    event("Normal", api::reason::kResumed, "resumed: re-creating the job's pods");
  }
  if (st.start_time.empty()) st.start_time = api::format_time(now);
  if (!policy().active_deadline_seconds) return;
  const api::Time deadline = api::parse_time_or_null(st.start_time).value_or(now) +
                             std::chrono::seconds(*policy().active_deadline_seconds);
  if (now >= deadline) {
    finish(api::phase::kFailed, api::reason::kDeadlineExceeded,
           "the job was active longer than activeDeadlineSeconds=" +
               std::to_string(*policy().active_deadline_seconds));
    clean_up_finished();
  } else {
    requeue_in(until(now, deadline));
  }
}

// Step 7: the logdir claim (unless an existing one is named) and the headless Service. The
// claim is never waited on to be Bound: pods wait for it in the scheduler.
void Reconciler::Pass::ensure_claim_and_service() {
  auto unlabelled = [&](const std::string& child) {
    MutexLock lock(r.create_mu_);
    return r.unlabelled_children_.contains(ns + "/" + child);
  };
  claim_exists = !spec.logdir.claim_name.empty() ||
                 r.view_->exists(res::kPersistentVolumeClaims, ns, claim_name(name, spec)) ||
                 unlabelled(claim_name(name, spec));
  service_exists =
      r.view_->exists(res::kServices, ns, service_name(name)) || unlabelled(service_name(name));
  if (!claim_exists && !create_hold) {
    actions.push_back({Action::Kind::kCreateClaim, claim_name(name, spec), "",
                       build_claim(job, spec), std::string(api::reason::kCreatedClaim),
                       "created logdir claim " + ns + "/" + claim_name(name, spec)});
  }
  if (!service_exists && !create_hold) {
    actions.push_back({Action::Kind::kCreateService, service_name(name), "",
                       build_service(job, spec), std::string(api::reason::kCreatedService),
                       "created headless Service " + ns + "/" + service_name(name)});
  }
}

// Step 8, first: pods no longer in the replicaSpecs go, with their records.
void Reconciler::Pass::delete_unwanted_pods() {
  std::set<std::string> desired_names;
  for (const Desired& d : desired) desired_names.insert(d.pod);
  for (const auto& [pod, op] : owned) {
    if (!desired_names.contains(pod)) {
      delete_pod(op, api::reason::kDeletedPod, "no longer in the job's replicaSpecs");
      check_stuck(op);
    }
  }
  std::erase_if(st.pods, [&](const auto& e) { return !desired_names.contains(e.first); });
}

// Step 8: classify each current pod (failure_policy.h): disrupted, failed (retryable or
// permanent), or fine; count its container restarts. Older incarnations are left for step 11.
void Reconciler::Pass::classify_pods() {
  for (const Desired& d : desired) {
    // A name without a record (a new job, or replicas scaled up) starts at the job's attempt;
    // group restarts and suspend rewrite every record, pod-scope restarts only their own.
    api::PodRecord& rec =
        st.pods.try_emplace(d.pod, api::PodRecord{st.restart_attempt, false, 0}).first->second;
    auto it = owned.find(d.pod);
    if (it == owned.end()) {
      if (rec.created) {
        // It existed in this incarnation and is gone: deleted from under us.
        disrupted.push_back({d.pod,
                             {PodOutcome::kDisrupted, std::string(api::reason::kPodDeleted),
                              "pod " + ref(d.pod) + " was deleted", std::nullopt}});
        outcomes[{d.type, d.index}] = PodOutcome::kDisrupted;
      }
      continue;
    }
    const ObservedPod& op = it->second;
    check_stuck(op);
    if (op.attempt < rec.restart_attempt) continue;  // an old incarnation: step 11 deletes it
    if (op.attempt > rec.restart_attempt) rec = api::PodRecord{op.attempt, false, 0};
    rec.created = true;
    const int32_t restarts = container_restarts(op.object);
    if (restarts > rec.container_restarts) {
      container_restart_delta += restarts - rec.container_restarts;
      container_restart_pod = d.pod;
      container_restart_pods.push_back(ref(d.pod));
      rec.container_restarts = restarts;
    }
    PodClassification c = classify_pod(op.object, spec.replica_specs.at(d.type), policy());
    outcomes[{d.type, d.index}] = c.outcome;
    switch (c.outcome) {
      case PodOutcome::kDisrupted:
        disrupted.push_back({d.pod, std::move(c)});
        break;
      case PodOutcome::kRetryableFailure:
        retryable.push_back({d.pod, std::move(c)});
        break;
      case PodOutcome::kPermanentFailure:
        permanent.push_back({d.pod, std::move(c)});
        break;
      default:
        break;
    }
  }
}

// Container restarts in place spend the failure budget; one Event names the pods.
void Reconciler::Pass::count_container_restarts() {
  if (container_restart_delta <= 0) return;
  st.failure_count += container_restart_delta;
  st.restart_count += container_restart_delta;
  if (r.options_.on_restart) {
    for (int i = 0; i < container_restart_delta; ++i) {
      r.options_.on_restart(api::reason::kContainerRestarted);
    }
  }
  event("Warning", api::reason::kContainerRestarted,
        (container_restart_pods.size() == 1 ? "pod " : "pods ") +
            name_list(container_restart_pods) + ": " + std::to_string(container_restart_delta) +
            " container restart(s) in place, failures " + std::to_string(st.failure_count) + "/" +
            std::to_string(policy().backoff_limit));
}

// Step 9: decide. Success of the chief wins; a permanent failure fails the job; restarts
// follow the scope; a failure past backoffLimit fails the job.
void Reconciler::Pass::decide() {
  const bool lost = !disrupted.empty() || !retryable.empty();
  const auto success = job_succeeded(spec, outcomes, ref(st.chief_pod));
  if (success) {
    finish(api::phase::kSucceeded, success->reason, success->message);
  } else if (!permanent.empty()) {
    const Candidate& first = permanent.front();
    finish(api::phase::kFailed, first.c.reason, first.c.message);
  } else if (st.failure_count > policy().backoff_limit) {
    budget_exceeded("pod " + ref(container_restart_pod) + " restarted its containers");
  } else if (policy().restart_scope == api::RestartScope::kGroup && lost) {
    restart_scope_group();
  } else if (policy().restart_scope == api::RestartScope::kReplica && lost) {
    restart_scope_replica();
  }
  record_replacements();
}

void Reconciler::Pass::budget_exceeded(const std::string& what) {
  finish(api::phase::kFailed, api::reason::kBackoffLimitExceeded,
         "backoffLimit " + std::to_string(policy().backoff_limit) + " exceeded (" +
             std::to_string(st.failure_count) + " failures): " + what);
}

milliseconds Reconciler::Pass::backoff_for_failures() const {
  return restart_backoff(policy().backoff, st.failure_count, r.options_.jitter01());
}

// A new attempt for the whole group: every pod is re-created, and the replicas meet under the
// new LONGHAUL_RESTART_ATTEMPT, after `delay` (nextRestartTime).
void Reconciler::Pass::restart_group(const std::string& reason, const std::string& message,
                                     milliseconds delay) {
  st.restart_attempt += 1;
  st.restart_count += 1;
  st.group_restart_attempt = st.restart_attempt;
  for (const Desired& d : desired) st.pods[d.pod] = api::PodRecord{st.restart_attempt, false, 0};
  if (delay > milliseconds(0)) {
    const api::Time at = now + delay;
    const auto prev = api::parse_time_or_null(st.next_restart_time);
    // Round up to the next second: status times have second precision.
    const api::Time rounded =
        std::chrono::time_point_cast<std::chrono::seconds>(at) +
        (at == std::chrono::time_point_cast<std::chrono::seconds>(at) ? std::chrono::seconds(0)
                                                                      : std::chrono::seconds(1));
    if (!prev || *prev < rounded) st.next_restart_time = api::format_time(rounded);
  }
  api::set_condition(st, api::condition::kRestarting, "True", reason, message, now);
  if (api::find_condition(st, api::condition::kRunning)) {
    api::set_condition(st, api::condition::kRunning, "False", reason, message, now);
  }
  if (r.options_.on_restart) r.options_.on_restart(reason);
  event("Warning", reason,
        message + ": restart attempt " + std::to_string(st.restart_attempt) +
            (delay > milliseconds(0) ? " after " + std::to_string(delay.count()) + "ms backoff"
                                     : std::string()));
}

// restartScope Group: disrupted pods restart the group at once, without spending the failure
// budget; a retryable failure spends one and restarts it after the failure backoff.
void Reconciler::Pass::restart_scope_group() {
  if (!disrupted.empty()) {
    st.preemption_count += static_cast<int32_t>(disrupted.size());
    std::string msg = disrupted.front().c.message;
    if (disrupted.size() > 1) msg += " and " + std::to_string(disrupted.size() - 1) + " more";
    restart_group(disrupted.front().c.reason, msg + " (no failure budget spent)", milliseconds(0));
    return;
  }
  st.failure_count += 1;
  if (st.failure_count > policy().backoff_limit) {
    budget_exceeded(retryable.front().c.message);
  } else {
    restart_group(retryable.front().c.reason,
                  retryable.front().c.message + ", failures " + std::to_string(st.failure_count) +
                      "/" + std::to_string(policy().backoff_limit),
                  backoff_for_failures());
  }
}

// restartScope Replica: the retryable failure that asks for a new group attempt (exit 138), or
// else the first of a replica that keeps failing (each failure looked at is recorded in
// status.replicaFailures); nullptr when none does. Sets `reason` to why.
const Candidate* Reconciler::Pass::group_restart_cause(std::string_view& reason) {
  for (const Candidate& f : retryable) {
    if (f.c.exit_code == kGroupRestartExitCode) {
      reason = api::reason::kGroupRestartRequested;
      return &f;
    }
  }
  for (const Candidate& f : retryable) {
    if (replica_keeps_failing(st, f.name, now)) {
      reason = api::reason::kReplicaKeepsFailing;
      return &f;
    }
  }
  return nullptr;
}

// restartScope Replica (recovery_policy.h): lost replicas are re-created alone and the
// survivors keep running; a replica that keeps failing, or one that asks for it (exit 138),
// restarts the whole group with the failure backoff.
void Reconciler::Pass::restart_scope_replica() {
  std::string_view group_reason;
  if (const Candidate* group_cause = group_restart_cause(group_reason)) {
    st.preemption_count += static_cast<int32_t>(disrupted.size());
    st.failure_count += 1;
    const std::string why =
        group_cause->c.message +
        (group_reason == api::reason::kGroupRestartRequested
             ? std::string(" (a new group attempt was asked for)")
             : " (replaced in place " + std::to_string(kReplicaFailuresBeforeGroupRestart) +
                   " times within " + std::to_string(kReplicaFailureWindow.count()) + "s)");
    abandon_recovery(st, group_reason, why + ": restarting the whole group", now);
    if (st.failure_count > policy().backoff_limit) {
      budget_exceeded(why);
    } else {
      restart_group(std::string(group_reason),
                    why + ", failures " + std::to_string(st.failure_count) + "/" +
                        std::to_string(policy().backoff_limit),
                    backoff_for_failures());
    }
    return;
  }
  for (const Candidate& d : disrupted) {
    st.preemption_count += 1;
    replace_in_place(d.name, d.c.reason, d.c.message + " (no failure budget spent)");
  }
  for (const Candidate& f : retryable) {
    st.failure_count += 1;
    if (st.failure_count > policy().backoff_limit) {
      budget_exceeded(f.c.message);
      break;
    }
    replace_in_place(f.name, f.c.reason,
                     f.c.message + ", failures " + std::to_string(st.failure_count) + "/" +
                         std::to_string(policy().backoff_limit));
  }
}

// Step 10: summarise; the Running and Restarting conditions follow the pods, the phase the
// conditions.
void Reconciler::Pass::summarize_conditions() {
  bool all_running = !desired.empty();
  for (const Desired& d : desired) {
    auto it = owned.find(d.pod);
    const api::PodRecord& rec = st.pods[d.pod];
    all_running &= it != owned.end() && it->second.attempt >= rec.restart_attempt &&
                   !it->second.terminating && it->second.phase == "Running";
  }
  if (all_running) {
    if (auto seconds = end_recovery(st, static_cast<int>(desired.size()), now)) {
      if (r.options_.on_recovery) r.options_.on_recovery(*seconds);
      event("Normal", api::reason::kReplicasRecovered,
            api::find_condition(st, api::condition::kRecovering)->message);
    }
    if (api::condition_true(st, api::condition::kRestarting)) {
      api::set_condition(st, api::condition::kRestarting, "False", api::reason::kRestartDone,
                         "all replicas running again", now);
      event("Normal", api::reason::kRestartDone,
            "restart attempt " + std::to_string(st.restart_attempt) + ": all replicas running");
    }
    if (!api::condition_true(st, api::condition::kRunning)) {
      api::set_condition(st, api::condition::kRunning, "True", api::reason::kAllReplicasRunning,
                         "all replicas are running", now);
      event("Normal", api::reason::kAllReplicasRunning, "all replicas are running");
    }
    st.next_restart_time.clear();
  }
  if (api::condition_true(st, api::condition::kRestarting)) {
    st.phase = std::string(api::phase::kRestarting);
  } else if (api::condition_true(st, api::condition::kRunning)) {
    st.phase = std::string(api::phase::kRunning);
  } else {
    st.phase = std::string(api::phase::kPending);
  }
}

// Step 11, first: delete old incarnations (including those the decision just replaced).
void Reconciler::Pass::delete_old_incarnations() {
  for (const Desired& d : desired) {
    auto it = owned.find(d.pod);
    if (it != owned.end() && it->second.attempt < st.pods[d.pod].restart_attempt) {
      delete_pod(it->second, api::reason::kDeletedPod,
                 "replaced by restart attempt " + std::to_string(st.pods[d.pod].restart_attempt));
    }
  }
}

// Container restarts counted by this or an earlier pass go onto the pod (after the status
// write that counted them), so status can forget them: the uid makes it this pod or none.
void Reconciler::Pass::annotate_counted_restarts() {
  for (const Desired& d : desired) {
    auto it = owned.find(d.pod);
    const api::PodRecord& rec = st.pods[d.pod];
    if (it == owned.end() || it->second.terminating || it->second.attempt != rec.restart_attempt ||
        rec.container_restarts <= it->second.counted_restarts) {
      continue;
    }
    json patch = {{"metadata",
                   {{"uid", it->second.uid},
                    {"annotations",
                     {{std::string(api::kAnnotationCountedRestarts),
                       std::to_string(rec.container_restarts)}}}}}};
    actions.push_back(
        {Action::Kind::kAnnotatePod, d.pod, it->second.uid, std::move(patch), "", "", d.type});
  }
}

// Step 11: plan the pods of the current incarnation that do not exist, once their name is free,
// after the restart backoff and the create backoff.
void Reconciler::Pass::create_missing_pods() {
  const auto not_before = api::parse_time_or_null(st.next_restart_time);
  for (const Desired& d : desired) {
    const api::PodRecord& rec = st.pods[d.pod];
    if (rec.created) continue;
    if (occupied.contains(d.pod) && owned.contains(d.pod) &&
        owned.at(d.pod).attempt >= rec.restart_attempt) {
      continue;  // the pod of this incarnation exists
    }
    if (occupied.contains(d.pod)) continue;  // wait until the old pod is gone
    if (r.expectations_.creation_pending(key, d.pod) ||
        r.expectations_.deletion_pending(key, d.pod)) {
      continue;
    }
    if (not_before && now < *not_before) {
      requeue_in(until(now, *not_before));
      continue;
    }
    if (create_hold) {
      requeue_in(until(now, create_failure->retry_at));
      continue;
    }
    actions.push_back(
        {Action::Kind::kCreatePod, d.pod, "",
         build_pod(job, spec, d.type, d.index, rec.restart_attempt, st.group_restart_attempt),
         std::string(api::reason::kCreatedPod),
         "restart attempt " + std::to_string(rec.restart_attempt), d.type});
  }
}

// Created: True once the claim, the Service and every pod of the current incarnation exist;
// False with the API server's words while creates are refused.
void Reconciler::Pass::update_created_condition() {
  bool all_created = claim_exists && service_exists;
  for (const Desired& d : desired) {
    auto it = owned.find(d.pod);
    all_created &= st.pods[d.pod].created ||
                   (it != owned.end() && it->second.attempt >= st.pods[d.pod].restart_attempt);
  }
  if (create_failure) {
    api::set_condition(st, api::condition::kCreated, "False", api::reason::kFailedCreate,
                       create_failure->message, now);
  } else if (all_created && !api::condition_true(st, api::condition::kCreated)) {
    api::set_condition(
        st, api::condition::kCreated, "True", api::reason::kJobCreated,
        "created its claim, Service and " + std::to_string(desired.size()) + " pod(s)", now);
  }
  if (create_failure && all_created) {
    MutexLock lock(r.create_mu_);
    r.create_failures_.erase(key);  // what was refused exists now (created by a retry)
  }
}

// Replica counts of the current incarnation, the pods that matter, and the printer columns.
// A finished job has no active or ready replicas (READY 0/N); its counts and pods stay as they
// were when it finished.
void Reconciler::Pass::count_replicas() {
  if (!api::is_finished(old_status) && invalid.empty()) {
    std::map<std::string, api::ReplicaStatus> counts;
    struct Notable {
      int rank;  // 0 the chief, 1 failed, 2 any other pod not running
      api::TrainingJobStatus::PodStatus pod;
    };
    std::vector<Notable> notable;
    int ready = 0;
    for (const Desired& d : desired) {
      api::ReplicaStatus& c = counts[std::string(api::replica_type_name(d.type))];
      ++c.replicas;
      auto it = owned.find(d.pod);
      const auto rec = st.pods.find(d.pod);
      const bool chief = d.pod == st.chief_pod;
      if (it == owned.end() || rec == st.pods.end() ||
          it->second.attempt < rec->second.restart_attempt) {
        notable.push_back(
            {chief ? 0 : 2, {d.pod, "Pending", it == owned.end() ? "NotCreated" : "Replacing"}});
        continue;
      }
      const ObservedPod& op = it->second;
      api::TrainingJobStatus::PodStatus ps{d.pod, op.phase.empty() ? "Unknown" : op.phase,
                                           pod_reason(op.object)};
      if (chief || ps.phase != "Running" || !ps.reason.empty()) {
        notable.push_back({chief ? 0 : ps.phase == "Failed" ? 1 : 2, std::move(ps)});
      }
      if (op.phase == "Succeeded") {
        ++c.succeeded;
      } else if (op.phase == "Failed") {
        ++c.failed;
      } else if (!op.terminating) {
        ++c.active;
        if (op.ready) {
          ++c.ready;
          ++ready;
        }
      }
    }
    st.replica_statuses = std::move(counts);
    st.ready = std::to_string(ready) + "/" + std::to_string(desired.size());
    std::stable_sort(notable.begin(), notable.end(),
                     [](const Notable& a, const Notable& b) { return a.rank < b.rank; });
    st.pod_statuses.clear();
    for (size_t i = 0; i < notable.size() && i < api::kMaxPodStatuses; ++i) {
      st.pod_statuses.push_back(std::move(notable[i].pod));
    }
    st.pod_statuses_omitted = static_cast<int32_t>(notable.size() - st.pod_statuses.size());
  }
  if (api::is_finished(st) && invalid.empty()) {
    for (auto& [_, c] : st.replica_statuses) c.active = c.ready = 0;
    st.ready = "0/" + std::to_string(desired.size());
  }
  st.failure_budget =
      std::to_string(st.failure_count) + "/" + std::to_string(policy().backoff_limit);
}

// The chief's training progress (progress.h): read off this path, applied rate-limited.
void Reconciler::Pass::track_progress() {
  if (!invalid.empty() || !active()) return;
  const auto chief = owned.find(st.chief_pod);
  const auto rec = st.pods.find(st.chief_pod);
  const bool current = chief != owned.end() && rec != st.pods.end() &&
                       chief->second.attempt >= rec->second.restart_attempt &&
                       !chief->second.terminating;
  // The chief role may have moved to a worker pod (a promoted chief): progress.h.
  std::vector<const json*> workers;
  for (const Desired& d : desired) {
    if (d.type != ReplicaType::kWorker || d.pod == st.chief_pod) continue;
    const auto pod = owned.find(d.pod);
    const auto rp = st.pods.find(d.pod);
    if (pod != owned.end() && rp != st.pods.end() &&
        pod->second.attempt >= rp->second.restart_attempt && !pod->second.terminating) {
      workers.push_back(&pod->second.object);
    }
  }
  if (auto next = r.progress_->track(key, current ? &chief->second.object : nullptr,
                                     std::chrono::seconds(spec.progress_interval_seconds), st, now,
                                     workers)) {
    requeue_in(*next);
  }
}

// Step 12: one status write, only when something changed; it commits every decision above
// before any pod is touched.
void Reconciler::Pass::commit_status() {
  write_status();
  report_phase(st.phase);
  flush_events();
}

// Status keeps the records of unsettled pods only; a finished job keeps none.
std::map<std::string, api::PodRecord> Reconciler::Pass::unsettled_pods() const {
  std::map<std::string, api::PodRecord> out;
  if (api::is_finished(st)) return out;
  const int64_t group_attempt = st.group_restart_attempt.value_or(0);
  for (const Desired& d : desired) {
    const auto rec = st.pods.find(d.pod);
    if (rec == st.pods.end()) continue;
    const auto it = owned.find(d.pod);
    if (!rec->second.created ||
        rec->second != settled_record(it == owned.end() ? nullptr : &it->second, group_attempt)) {
      out.insert(*rec);
    }
  }
  return out;
}

void Reconciler::Pass::write_status() {
  api::TrainingJobStatus out = st;
  out.pods = unsettled_pods();
  const json new_status = api::to_json(out);
  if (new_status == api::to_json(old_status)) return;
  kube::throw_if_stop_requested("update status of TrainingJob " + key);
  json updated = job;
  updated["status"] = new_status;
  try {
    job = r.client_.update_status(res::kTrainingJobs, ns, updated);
  } catch (const kube::ConflictError&) {
    r.view_->job_write_conflicted(ns, name);  // the job changed: the next pass reads it fresh
    throw;
  }
  r.view_->wrote_job(job);  // the next pass must not decide on an older status than this
  old_status = std::move(out);
}

void Reconciler::Pass::flush_events() {
  for (const auto& e : events) {
    LH_LOG(INFO) << e.message << kv("job", key) << kv("reason", e.reason) << kv("phase", st.phase);
    if (!kube::stop_requested()) r.events_->record(job, e.type, e.reason, e.message);
  }
  events.clear();
}

// Step 13: act on the children the committed status asks for. The first refused create stops
// this pass's creates (see reconciler.h); deletes go on. Pod creates and deletes go out in
// slow-start batches (1, 2, 4, ... up to kMaxParallelPodWrites at once), as Kubernetes' Job
// controller does: a large job starts in a fraction of the time, and a refused create costs at
// most one batch.
void Reconciler::Pass::act() {
  size_t batch_size = 1;
  for (size_t i = 0; i < actions.size();) {
    const Action& first = actions[i];
    if (is_create(first.kind) && (refused_transient || refused_invalid)) {
      ++i;
      continue;
    }
    kube::throw_if_stop_requested("TrainingJob " + key);
    // The next run of pod writes of the same kind, up to the batch size; other actions alone.
    std::vector<const Action*> run{&first};
    for (++i; batchable(first.kind) && i < actions.size() && run.size() < batch_size &&
              actions[i].kind == first.kind;
         ++i) {
      run.push_back(&actions[i]);
    }
    for (const Action* a : run) {
      if (a->kind == Action::Kind::kCreatePod) r.expectations_.expect_creation(key, a->name);
      if (a->kind == Action::Kind::kDeletePod || a->kind == Action::Kind::kForceDeletePod) {
        r.expectations_.expect_deletion(key, a->name, a->uid);
      }
    }
    std::vector<std::exception_ptr> errors(run.size());
    {
      // Helpers carry this thread's stop token, and are joined on every path.
      std::vector<std::thread> helpers;
      struct JoinAll {
        std::vector<std::thread>& threads;
        ~JoinAll() {
          for (std::thread& t : threads) t.join();
        }
      } join_all{helpers};
      const std::stop_token token = kube::current_stop_token();
      for (size_t j = 1; j < run.size(); ++j) {
        helpers.emplace_back([&, j, token] {
          kube::ScopedStopToken bound(token);
          errors[j] = call(*run[j]);
        });
      }
      errors[0] = call(*run[0]);
    }
    std::exception_ptr cancelled;
    for (size_t j = 0; j < run.size(); ++j) {
      try {
        settle(*run[j], errors[j]);
      } catch (const Cancelled&) {
        if (!cancelled) cancelled = std::current_exception();
      }
    }
    if (cancelled) std::rethrow_exception(cancelled);
    if (batchable(first.kind)) batch_size = std::min(batch_size * 2, kMaxParallelPodWrites);
  }
}

// The API call of one action, on any thread: nullptr when it succeeded, else what it threw.
std::exception_ptr Reconciler::Pass::call(const Action& a) const {
  try {
    kube::throw_if_stop_requested("TrainingJob " + key);
    switch (a.kind) {
      case Action::Kind::kCreatePod:
      case Action::Kind::kCreateService:
      case Action::Kind::kCreateClaim:
        r.client_.create(resource_of(a), ns, a.object);
        break;
      case Action::Kind::kAnnotatePod:
        r.client_.patch(res::kPods, ns, a.name, a.object, kube::PatchType::kMerge);
        break;
      case Action::Kind::kDeletePod:
      case Action::Kind::kForceDeletePod: {
        kube::DeleteOptions opts;
        if (!a.uid.empty()) opts.precondition_uid = a.uid;
        if (a.kind == Action::Kind::kForceDeletePod) opts.grace_period_seconds = 0;
        r.client_.remove(res::kPods, ns, a.name, opts);
        break;
      }
    }
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

// Records the outcome of one action (on the reconcile thread); rethrows Cancelled.
void Reconciler::Pass::settle(const Action& a, std::exception_ptr error) {
  if (is_create(a.kind)) {
    settle_create(a, std::move(error));
  } else if (a.kind == Action::Kind::kAnnotatePod) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const kube::ApiError& e) {
      // Gone or replaced (uid): nothing to record. Else status keeps the count; retried.
      LH_LOG(WARNING) << "could not annotate a pod with its counted restarts" << kv("job", key)
                      << kv("pod", a.name) << kv("error", e.what());
    }
  } else {
    try {
      if (error) std::rethrow_exception(error);
      if (!a.reason.empty()) done[{a.kind, a.reason, a.message}].pods.push_back(a.name);
    } catch (const kube::NotFoundError&) {
    } catch (const kube::ConflictError&) {
      // The uid precondition failed: a newer pod holds the name; leave it.
    }
  }
}

// A create's outcome: done, exists already, or refused (the first refusal of the pass is kept:
// invalid fails the job, anything else backs off; handle_refused_creates).
void Reconciler::Pass::settle_create(const Action& a, std::exception_ptr error) {
  const std::string what = (a.kind == Action::Kind::kCreatePod       ? "pod "
                            : a.kind == Action::Kind::kCreateService ? "Service "
                                                                     : "logdir claim ") +
                           ns + "/" + a.name;
  try {
    if (error) std::rethrow_exception(error);
    created_any = true;
    if (a.kind == Action::Kind::kCreatePod) {
      done[{a.kind, a.reason, a.message}].pods.push_back(a.name);
    } else {
      created_children.emplace_back(a.reason, a.message);
    }
  } catch (const kube::AlreadyExistsError&) {
    // Exists already (a previous pass or another operator made it): nothing to do. A Service
    // or claim the cache lacks has no label of ours: remember it exists.
    if (a.kind != Action::Kind::kCreatePod && !r.view_->exists(resource_of(a), ns, a.name)) {
      MutexLock lock(r.create_mu_);
      r.unlabelled_children_.insert(ns + "/" + a.name);
    }
  } catch (const kube::InvalidError& e) {
    if (a.kind == Action::Kind::kCreatePod) r.expectations_.creation_failed(key, a.name);
    if (refused_invalid) return;  // one message: the first refusal of the batch
    refused_invalid = refused_as_invalid(a, ns, e);
    LH_LOG(WARNING) << "the API server refused a create as invalid" << kv("job", key)
                    << kv("object", what) << kv("error", e.what());
    event("Warning", api::reason::kFailedCreate,
          "could not create " + what + ": " +
              (e.status_message().empty() ? std::string(e.what()) : e.status_message()));
  } catch (const Cancelled&) {
    if (a.kind == Action::Kind::kCreatePod) r.expectations_.creation_failed(key, a.name);
    throw;
  } catch (const Error& e) {
    // kube::ApiError (403 quota, namespace terminating, webhook, ...) or Unavailable.
    if (a.kind == Action::Kind::kCreatePod) r.expectations_.creation_failed(key, a.name);
    if (refused_transient || refused_invalid) return;
    const auto* api_error = dynamic_cast<const kube::ApiError*>(&e);
    const std::string server = api_error && !api_error->status_message().empty()
                                   ? api_error->status_message() + " (HTTP " +
                                         std::to_string(api_error->http_status()) + " " +
                                         api_error->reason() + ")"
                                   : std::string(e.what());
    refused_transient = "could not create " + what + ": " + server + "; retrying with backoff";
    LH_LOG(WARNING) << "a create was refused; retrying with backoff" << kv("job", key)
                    << kv("object", what) << kv("error", e.what());
    event("Warning", api::reason::kFailedCreate, *refused_transient);
  }
}

// One Event per decision and kind of action, naming the pods; the claim and Service made in
// the same pass join the first pods' Event ("created logdir claim ns/j-logdir, headless
// Service ns/j and pods ..."), so a new job costs one Event, not three.
void Reconciler::Pass::record_action_events() {
  std::string children;
  for (const auto& [reason, message] : created_children) {
    const std::string what = message.rfind("created ", 0) == 0 ? message.substr(8) : message;
    children += (children.empty() ? "" : ", ") + what;
  }
  for (const auto& [k, group] : done) {
    const auto& [kind, reason, why] = k;
    const char* verb = kind == Action::Kind::kCreatePod   ? "created "
                       : kind == Action::Kind::kDeletePod ? "deleted "
                                                          : "force-deleted ";
    std::string what = (group.pods.size() == 1 ? "pod " : "pods ") + name_list(group.pods);
    if (kind == Action::Kind::kCreatePod && !children.empty()) {
      what = children + " and " + what;
      children.clear();
      created_children.clear();
    }
    event(kind == Action::Kind::kForceDeletePod ? "Warning" : "Normal", reason,
          verb + what + " (" + why + ")");
  }
  if (!created_children.empty()) {  // no pod created with them
    event("Normal", created_children.front().first, "created " + children);
  }
}

// Refused creates: back off and say so, or fail the job when the spec is at fault.
void Reconciler::Pass::handle_refused_creates() {
  if (refused_invalid) {
    {
      MutexLock lock(r.create_mu_);
      r.create_failures_.erase(key);
    }
    finish(api::phase::kFailed, api::reason::kInvalidSpec, *refused_invalid);
    for (auto& [_, c] : st.replica_statuses) c.active = c.ready = 0;
    st.ready = "0/" + std::to_string(desired.size());
    requeue_in(milliseconds(1));  // clean up what was created, by cleanPodPolicy
  } else if (refused_transient) {
    CreateFailure f;
    {
      MutexLock lock(r.create_mu_);
      CreateFailure& entry = r.create_failures_[key];
      entry.count += 1;
      const int shift = std::min(entry.count - 1, 20);
      const milliseconds delay = std::min(r.options_.create_retry_max,
                                          r.options_.create_retry_base * (int64_t{1} << shift));
      entry.retry_at = now + delay;
      entry.message = *refused_transient;
      f = entry;
    }
    requeue_in(until(now, f.retry_at));
    api::set_condition(st, api::condition::kCreated, "False", api::reason::kFailedCreate, f.message,
                       now);
  } else if (created_any) {
    MutexLock lock(r.create_mu_);
    r.create_failures_.erase(key);
  }
}

// A finished job whose ttlSecondsAfterFinished has passed.
bool Reconciler::Pass::ttl_expired() const {
  if (!invalid.empty() || !api::is_finished(st)) return false;
  const auto left = ttl_remaining(policy(), st, now);
  return left && *left <= std::chrono::system_clock::duration::zero();
}

// TTL: the job itself goes last, after its status recorded why.
ReconcileResult Reconciler::Pass::delete_job() {
  kube::DeleteOptions opts;
  opts.propagation_policy = "Background";
  kube::throw_if_stop_requested("delete TrainingJob " + key);
  try {
    r.client_.remove(res::kTrainingJobs, ns, name, opts);
  } catch (const kube::NotFoundError&) {
  }
  return forget();
}

}  // namespace longhaul::controller
