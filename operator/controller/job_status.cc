// The status a pass reports: the Running, Restarting and Created conditions and the phase
// (steps 10-11); replica counts, the pods that matter and the printer columns; the status write
// itself (step 12), which keeps only the records of unsettled pods. Part of Reconciler::Pass
// (reconciler_pass.h).
#include <algorithm>

#include "longhaul/controller/recovery_policy.h"
#include "longhaul/kube/stop.h"
#include "reconciler_pass.h"

namespace longhaul::controller {

namespace res = kube::resources;

namespace {

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

}  // namespace

api::PodRecord settled_record(const ObservedPod* op, int64_t group_attempt) {
  if (op != nullptr && op->attempt >= group_attempt) {
    return {op->attempt, true, op->counted_restarts};
  }
  return {group_attempt, op == nullptr, 0};
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

// Created: True once the claim, the Service and every pod of the current incarnation exist;
// False with the API server's words while creates are refused.
void Reconciler::Pass::update_created_condition(const Children& children) {
  bool all_created = children.claim_exists && children.service_exists;
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

// The one status write of a pass (and a second one only when a create was refused): only when
// the status changed; a conflict makes the next pass read the job afresh.
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

}  // namespace longhaul::controller
