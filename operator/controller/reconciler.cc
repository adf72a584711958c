// The TrainingJob reconciler (see reconciler.h for the contract and the order of the steps).
#include "longhaul/controller/reconciler.h"

#include <algorithm>
#include <random>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/controller/children.h"
#include "longhaul/controller/cleanup_policy.h"
#include "longhaul/controller/failure_policy.h"
#include "longhaul/controller/ownership.h"
#include "longhaul/controller/recovery_policy.h"
#include "longhaul/controller/restart_policy.h"
#include "longhaul/kube/stop.h"
#include "reconciler_pass.h"

namespace longhaul::controller {

namespace res = kube::resources;
using api::ReplicaType;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

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

}  // namespace

// "a, b, c" or "a, b, c, d, e and 995 more"
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

// Sets phase and conditions of a finished job and stamps completionTime.
void Reconciler::Pass::finish(std::string_view phase, std::string_view reason,
                              const std::string& message) {
  st.phase = std::string(phase);
  const bool ok = phase == api::phase::kSucceeded;
  api::set_condition(st, ok ? api::condition::kSucceeded : api::condition::kFailed, "True", reason,
                     message, now);
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
    const Children children = p.ensure_claim_and_service();  // 7
    p.delete_unwanted_pods();                                // 8: classify the current pods
    const Classification seen = p.classify_pods();
    p.count_container_restarts(seen.container_restarts);
    p.decide(seen.pods, seen.container_restarts);  // 9: succeed, fail or restart
    if (api::is_finished(p.st)) {
      p.clean_up_finished();
    } else {
      p.summarize_conditions();     // 10: Running, Restarting, phase
      p.delete_old_incarnations();  // 11: plan pod writes
      p.annotate_counted_restarts();
      p.create_missing_pods();
      p.update_created_condition(children);
    }
  }
  p.count_replicas();
  p.track_progress();
  p.commit_status();               // 12: one status write, only when something changed
  WriteOutcome written = p.act();  // 13: the writes the committed status asks for
  p.record_action_events(written);
  p.handle_refused_creates(written);
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
    r.names_.erase(key);
    for (const std::string& child : {service_name(name), name + "-logdir"}) {
      r.unlabelled_children_.erase(ns + "/" + child);
    }
  }
  report_phase("");
  report_failure_budget(/*gone=*/true);
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
    auto& names = r.names_[key];
    for (auto& [pod, freed_at] : names) {
      if (occupied.contains(pod)) {
        freed_at.reset();
      } else if (!freed_at) {
        freed_at = now;
      }
    }
    for (const std::string& pod : occupied) names.try_emplace(pod);
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
Children Reconciler::Pass::ensure_claim_and_service() {
  auto unlabelled = [&](const std::string& child) {
    MutexLock lock(r.create_mu_);
    return r.unlabelled_children_.contains(ns + "/" + child);
  };
  Children c;
  c.claim_exists = !spec.logdir.claim_name.empty() ||
                   r.view_->exists(res::kPersistentVolumeClaims, ns, claim_name(name, spec)) ||
                   unlabelled(claim_name(name, spec));
  c.service_exists =
      r.view_->exists(res::kServices, ns, service_name(name)) || unlabelled(service_name(name));
  if (!c.claim_exists && !create_hold) {
    actions.push_back({Action::Kind::kCreateClaim, claim_name(name, spec), "",
                       build_claim(job, spec), std::string(api::reason::kCreatedClaim),
                       "created logdir claim " + ns + "/" + claim_name(name, spec)});
  }
  if (!c.service_exists && !create_hold) {
    actions.push_back({Action::Kind::kCreateService, service_name(name), "",
                       build_service(job, spec), std::string(api::reason::kCreatedService),
                       "created headless Service " + ns + "/" + service_name(name)});
  }
  return c;
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
Classification Reconciler::Pass::classify_pods() {
  Classification out;
  ClassifiedPods& pods = out.pods;
  ContainerRestarts& restarts = out.container_restarts;
  for (const Desired& d : desired) {
    // A name without a record (a new job, or replicas scaled up) starts at the job's attempt;
    // group restarts and suspend rewrite every record, pod-scope restarts only their own.
    api::PodRecord& rec =
        st.pods.try_emplace(d.pod, api::PodRecord{st.restart_attempt, false, 0}).first->second;
    auto it = owned.find(d.pod);
    if (it == owned.end()) {
      if (rec.created) {
        // It existed in this incarnation and is gone: deleted from under us.
        pods.disrupted.push_back({d.pod,
                                  {PodOutcome::kDisrupted, std::string(api::reason::kPodDeleted),
                                   "pod " + ref(d.pod) + " was deleted", std::nullopt}});
        pods.outcomes[{d.type, d.index}] = PodOutcome::kDisrupted;
      }
      continue;
    }
    const ObservedPod& op = it->second;
    check_stuck(op);
    if (op.attempt < rec.restart_attempt) continue;  // an old incarnation: step 11 deletes it
    if (op.attempt > rec.restart_attempt) rec = api::PodRecord{op.attempt, false, 0};
    rec.created = true;
    const int32_t count = container_restarts(op.object);
    if (count > rec.container_restarts) {
      restarts.delta += count - rec.container_restarts;
      restarts.last_pod = d.pod;
      restarts.pods.push_back(ref(d.pod));
      rec.container_restarts = count;
    }
    PodClassification c = classify_pod(op.object, spec.replica_specs.at(d.type), policy());
    pods.outcomes[{d.type, d.index}] = c.outcome;
    switch (c.outcome) {
      case PodOutcome::kDisrupted:
        pods.disrupted.push_back({d.pod, std::move(c)});
        break;
      case PodOutcome::kRetryableFailure:
        pods.retryable.push_back({d.pod, std::move(c)});
        break;
      case PodOutcome::kPermanentFailure:
        pods.permanent.push_back({d.pod, std::move(c)});
        break;
      default:
        break;
    }
  }
  return out;
}

// Container restarts in place spend the failure budget; one Event names the pods.
void Reconciler::Pass::count_container_restarts(const ContainerRestarts& restarts) {
  if (restarts.delta <= 0) return;
  st.failure_count += restarts.delta;
  st.restart_count += restarts.delta;
  if (r.options_.on_restart) {
    for (int i = 0; i < restarts.delta; ++i) {
      r.options_.on_restart(api::reason::kContainerRestarted);
    }
  }
  event("Warning", api::reason::kContainerRestarted,
        (restarts.pods.size() == 1 ? "pod " : "pods ") + name_list(restarts.pods) + ": " +
            std::to_string(restarts.delta) + " container restart(s) in place, failures " +
            std::to_string(st.failure_count) + "/" + std::to_string(policy().backoff_limit));
}

// Step 9: decide (restart_policy.h): success of the chief wins; a permanent failure fails the
// job; restarts follow the scope; a failure past backoffLimit fails the job.
void Reconciler::Pass::decide(const ClassifiedPods& pods, const ContainerRestarts& restarts) {
  apply(decide_restart({spec, pods, ref(st.chief_pod), st.failure_count, ref(restarts.last_pod),
                        st.replica_failures, now}));
}

// Applies a restart decision to the status, in the order RestartDecision lists; Events and the
// on_restart hook say what was done.
void Reconciler::Pass::apply(const RestartDecision& d) {
  st.preemption_count += d.disruptions;
  st.failure_count += d.failures;
  st.replica_failures = d.replica_failures;
  if (d.abandoned_recovery) {
    abandon_recovery(st, d.abandoned_recovery->reason, d.abandoned_recovery->message, now);
  }
  // restartScope Replica: each replica is re-created alone under a new incarnation with the
  // group's LONGHAUL_RESTART_ATTEMPT, so it rejoins the survivors, which are left untouched.
  // The replicas of one pass share one new attempt, and each reason gets one Event naming them
  // (a mass preemption is one Event and one status record range).
  std::optional<int64_t> replacement_attempt;
  struct Replaced {
    std::string first_message;
    std::vector<std::string> pods;
  };
  std::map<std::string, Replaced> replaced;
  for (const RestartDecision::Replacement& rep : d.replacements) {
    if (!st.group_restart_attempt) st.group_restart_attempt = st.pods[rep.pod].restart_attempt;
    if (!replacement_attempt) replacement_attempt = ++st.restart_attempt;
    st.restart_count += 1;
    st.pods[rep.pod] = api::PodRecord{*replacement_attempt, false, 0};
    begin_recovery(st, rep.reason, rep.message + ": replacing pod " + ref(rep.pod) + " in place",
                   now);
    if (r.options_.on_restart) r.options_.on_restart(rep.reason);
    Replaced& group = replaced[rep.reason];
    if (group.pods.empty()) group.first_message = rep.message;
    group.pods.push_back(ref(rep.pod));
  }
  if (d.group_restart) {
    restart_group(d.group_restart->reason, d.group_restart->message,
                  d.group_restart->after_backoff
                      ? restart_backoff(policy().backoff, st.failure_count, r.options_.jitter01())
                      : milliseconds(0));
  }
  if (d.finish) finish(d.finish->phase, d.finish->reason, d.finish->message);
  // One Warning Event per reason for the replacements of this pass.
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

// The chief's training progress (progress.h): read off this path, applied rate-limited.
void Reconciler::Pass::track_progress() {
  if (!invalid.empty() || policy().suspend) return;  // finished: the chief's last word (progress.h)
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
  report_failure_budget(/*gone=*/false);
  flush_events();
}

void Reconciler::Pass::flush_events() {
  for (const auto& e : events) {
    LH_LOG(INFO) << e.message << kv("job", key) << kv("reason", e.reason) << kv("phase", st.phase);
    if (!kube::stop_requested()) r.events_->record(job, e.type, e.reason, e.message);
  }
  events.clear();
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
