// The pass's writes to the job's children: planning them (step 11: old incarnations go,
// counted container restarts go onto the pods, missing pods are created) and making them after
// the status write (step 13): pod creates and deletes in slow-start batches, annotations, the
// claim and Service; one Event per decision and kind of action; refused creates backed off or
// failing the job (see reconciler.h). Part of Reconciler::Pass (reconciler_pass.h).
#include <algorithm>
#include <exception>
#include <stop_token>
#include <thread>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/controller/children.h"
#include "longhaul/kube/stop.h"
#include "reconciler_pass.h"

namespace longhaul::controller {

namespace res = kube::resources;
using api::ReplicaType;
using std::chrono::milliseconds;

namespace {

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

// Pod creates or deletes of one pass in flight at once, at most (slow start up to it).
constexpr size_t kMaxParallelPodWrites = 16;

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

}  // namespace

// Force-deletes `p` when it has been Terminating past nodeLostTimeoutSeconds; else a timer.
void Reconciler::Pass::check_stuck(const ObservedPod& p) {
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

// Deletes `p` (by uid) unless it is going already.
void Reconciler::Pass::delete_pod(const ObservedPod& p, std::string_view reason,
                                  const std::string& why) {
  if (p.terminating || r.expectations_.deletion_pending(key, p.name)) return;
  actions.push_back({Action::Kind::kDeletePod, p.name, p.uid, {}, std::string(reason), why});
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

// When a pod may be created under `pod`, a name an earlier pod held
// (ReconcilerOptions::name_release_delay); nullopt for a name no pod was seen holding.
std::optional<api::Time> Reconciler::Pass::name_released_at(const std::string& pod) const {
  MutexLock lock(r.create_mu_);
  auto job = r.names_.find(key);
  if (job == r.names_.end()) return std::nullopt;
  auto it = job->second.find(pod);
  if (it == job->second.end() || !it->second) return std::nullopt;
  return *it->second + r.options_.name_release_delay;
}

// Step 11: plan the pods of the current incarnation that do not exist, once their name is free
// (and released: name_released_at), after the restart backoff and the create backoff.
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
    if (const auto released = name_released_at(d.pod); released && now < *released) {
      requeue_in(until(now, *released));
      continue;
    }
    actions.push_back(
        {Action::Kind::kCreatePod, d.pod, "",
         build_pod(job, spec, d.type, d.index, rec.restart_attempt, st.group_restart_attempt),
         std::string(api::reason::kCreatedPod),
         "restart attempt " + std::to_string(rec.restart_attempt), d.type});
  }
}

// Step 13: act on the children the committed status asks for. The first refused create stops
// this pass's creates (see reconciler.h); deletes go on. Pod creates and deletes go out in
// slow-start batches (1, 2, 4, ... up to kMaxParallelPodWrites at once), as Kubernetes' Job
// controller does: a large job starts in a fraction of the time, and a refused create costs at
// most one batch.
WriteOutcome Reconciler::Pass::act() {
  WriteOutcome out;
  size_t batch_size = 1;
  for (size_t i = 0; i < actions.size();) {
    const Action& first = actions[i];
    if (is_create(first.kind) && (out.refused_transient || out.refused_invalid)) {
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
        settle(*run[j], errors[j], out);
      } catch (const Cancelled&) {
        if (!cancelled) cancelled = std::current_exception();
      }
    }
    if (cancelled) std::rethrow_exception(cancelled);
    if (batchable(first.kind)) batch_size = std::min(batch_size * 2, kMaxParallelPodWrites);
  }
  return out;
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
void Reconciler::Pass::settle(const Action& a, std::exception_ptr error, WriteOutcome& out) {
  if (is_create(a.kind)) {
    settle_create(a, std::move(error), out);
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
      if (!a.reason.empty()) out.done[{a.kind, a.reason, a.message}].pods.push_back(a.name);
    } catch (const kube::NotFoundError&) {
    } catch (const kube::ConflictError&) {
      // The uid precondition failed: a newer pod holds the name; leave it.
    }
  }
}

// A create's outcome: done, exists already, or refused (the first refusal of the pass is kept:
// invalid fails the job, anything else backs off; handle_refused_creates).
void Reconciler::Pass::settle_create(const Action& a, std::exception_ptr error, WriteOutcome& out) {
  const std::string what = (a.kind == Action::Kind::kCreatePod       ? "pod "
                            : a.kind == Action::Kind::kCreateService ? "Service "
                                                                     : "logdir claim ") +
                           ns + "/" + a.name;
  try {
    if (error) std::rethrow_exception(error);
    out.created_any = true;
    if (a.kind == Action::Kind::kCreatePod) {
      out.done[{a.kind, a.reason, a.message}].pods.push_back(a.name);
    } else {
      out.created_children.emplace_back(a.reason, a.message);
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
    if (out.refused_invalid) return;  // one message: the first refusal of the batch
    out.refused_invalid = refused_as_invalid(a, ns, e);
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
    if (out.refused_transient || out.refused_invalid) return;
    const auto* api_error = dynamic_cast<const kube::ApiError*>(&e);
    const std::string server = api_error && !api_error->status_message().empty()
                                   ? api_error->status_message() + " (HTTP " +
                                         std::to_string(api_error->http_status()) + " " +
                                         api_error->reason() + ")"
                                   : std::string(e.what());
    out.refused_transient = "could not create " + what + ": " + server + "; retrying with backoff";
    LH_LOG(WARNING) << "a create was refused; retrying with backoff" << kv("job", key)
                    << kv("object", what) << kv("error", e.what());
    event("Warning", api::reason::kFailedCreate, *out.refused_transient);
  }
}

// One Event per decision and kind of action, naming the pods; the claim and Service made in
// the same pass join the first pods' Event ("created logdir claim ns/j-logdir, headless
// Service ns/j and pods ..."), so a new job costs one Event, not three.
void Reconciler::Pass::record_action_events(WriteOutcome& out) {
  std::string children;
  for (const auto& [reason, message] : out.created_children) {
    const std::string what = message.rfind("created ", 0) == 0 ? message.substr(8) : message;
    children += (children.empty() ? "" : ", ") + what;
  }
  for (const auto& [k, group] : out.done) {
    const auto& [kind, reason, why] = k;
    const char* verb = kind == Action::Kind::kCreatePod   ? "created "
                       : kind == Action::Kind::kDeletePod ? "deleted "
                                                          : "force-deleted ";
    std::string what = (group.pods.size() == 1 ? "pod " : "pods ") + name_list(group.pods);
    if (kind == Action::Kind::kCreatePod && !children.empty()) {
      what = children + " and " + what;
      children.clear();
      out.created_children.clear();
    }
    event(kind == Action::Kind::kForceDeletePod ? "Warning" : "Normal", reason,
          verb + what + " (" + why + ")");
  }
  if (!out.created_children.empty()) {  // no pod created with them
    event("Normal", out.created_children.front().first, "created " + children);
  }
}

// Refused creates: back off and say so, or fail the job when the spec is at fault.
void Reconciler::Pass::handle_refused_creates(const WriteOutcome& out) {
  if (out.refused_invalid) {
    {
      MutexLock lock(r.create_mu_);
      r.create_failures_.erase(key);
    }
    finish(api::phase::kFailed, api::reason::kInvalidSpec, *out.refused_invalid);
    for (auto& [_, c] : st.replica_statuses) c.active = c.ready = 0;
    st.ready = "0/" + std::to_string(desired.size());
    requeue_in(milliseconds(1));  // clean up what was created, by cleanPodPolicy
  } else if (out.refused_transient) {
    CreateFailure f;
    {
      MutexLock lock(r.create_mu_);
      CreateFailure& entry = r.create_failures_[key];
      entry.count += 1;
      const int shift = std::min(entry.count - 1, 20);
      const milliseconds delay = std::min(r.options_.create_retry_max,
                                          r.options_.create_retry_base * (int64_t{1} << shift));
      entry.retry_at = now + delay;
      entry.message = *out.refused_transient;
      f = entry;
    }
    requeue_in(until(now, f.retry_at));
    api::set_condition(st, api::condition::kCreated, "False", api::reason::kFailedCreate, f.message,
                       now);
  } else if (out.created_any) {
    MutexLock lock(r.create_mu_);
    r.create_failures_.erase(key);
  }
}

}  // namespace longhaul::controller
