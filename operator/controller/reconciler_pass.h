// One reconcile pass over one job (Reconciler::Pass), shared by the files that hold its steps:
// reconciler.cc (reading, deciding, the status write), job_status.cc (the status summary and
// replica counts) and pod_writes.cc (the pod, Service and claim writes and their Events).
// Private to longhaul::controller: not installed, not included by anything outside it.
//
// A pass keeps what it read (the job, its spec, its pods) and the status it is deciding; the
// steps that decide something return it as a value the next step takes (Classification,
// RestartDecision, Children, WriteOutcome).
//
// Thread-safety: a Pass belongs to the thread running reconcile(), except Pass::call, which
// pod_writes.cc runs on helper threads it joins.
#pragma once

#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/reconciler.h"
#include "longhaul/controller/restart_policy.h"

namespace longhaul::controller {

// A pod as the pass sees it: the object and what the steps read off it.
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

// A write the pass will make after its status write.
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
  api::ReplicaType type = api::ReplicaType::kWorker;  // pods: the replica the pod belongs to
};

// Desired pods, in rank order (chief first).
struct Desired {
  api::ReplicaType type;
  int index;
  std::string pod;
};

// Container restarts in place that a pass counted on the current pods.
struct ContainerRestarts {
  int delta = 0;
  std::string last_pod;           // the last pod that restarted containers
  std::vector<std::string> pods;  // "ns/pod", for the Event: a few names, then "N more"
};

// What the current pods show (step 8).
struct Classification {
  ClassifiedPods pods;
  ContainerRestarts container_restarts;
};

// Whether the job's logdir claim and headless Service exist already (a create this pass plans
// does not count).
struct Children {
  bool claim_exists = false, service_exists = false;
};

// What acting did (step 13).
struct WriteOutcome {
  // Pods written per (kind, reason, why), for one Event each.
  struct Group {
    std::string type;
    std::vector<std::string> pods;
  };
  std::map<std::tuple<Action::Kind, std::string, std::string>, Group> done;
  // The claim and Service created, (reason, "created ..."), told in the pods' Event.
  std::vector<std::pair<std::string, std::string>> created_children;
  // The first refused create: to retry with backoff, or invalid (the job fails).
  std::optional<std::string> refused_transient, refused_invalid;
  bool created_any = false;
};

// A pod name's record when status keeps none for it (api::TrainingJobStatus::pods): a pod of
// the group's incarnation or newer carries its attempt and counted restarts itself; a name with
// no pod was seen created and is gone. A record that says "not seen created yet" is never
// settled: status keeps it until the pod is seen.
api::PodRecord settled_record(const ObservedPod* op, int64_t group_attempt);  // job_status.cc

// "a, b, c" or "a, b, c, d, e and 995 more"
std::string name_list(const std::vector<std::string>& names);

inline std::chrono::milliseconds until(api::Time now, api::Time when) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(when - now));
}

// One reconcile pass over one job: what it read, the status it decides, and what it will do.
// Its step methods run in the order reconcile() lists.
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

  // What the pass read (steps 1-3); not changed after.
  json job;
  std::string job_uid;
  api::TrainingJobStatus old_status;  // as last written
  api::TrainingJobSpec spec;
  std::string invalid;                       // why the spec cannot run; "" when it can
  std::map<std::string, ObservedPod> owned;  // the pods this job owns, by name
  std::set<std::string> occupied;            // every name some pod holds
  // The job's last refused create, and whether its backoff still holds creates back.
  std::optional<CreateFailure> create_failure;
  bool create_hold = false;
  std::vector<Desired> desired;

  // The status as this pass decides it (written once, step 12).
  api::TrainingJobStatus st;

  // What the pass will do: writes after the status commit, Events, the next requeue.
  std::vector<Action> actions;
  std::optional<std::chrono::milliseconds> requeue;
  struct PendingEvent {
    std::string type, reason, message;
  };
  std::vector<PendingEvent> events;

  // The steps, in the order reconcile() runs them (reconciler.cc unless said).
  bool fetch();
  ReconcileResult forget();
  void validate();
  void observe_pods();
  void plan_desired_pods();
  void clean_up_finished();
  void suspend();
  void resume_and_check_deadline();
  bool active() const { return !api::is_finished(st) && !policy().suspend; }
  Children ensure_claim_and_service();
  void delete_unwanted_pods();
  Classification classify_pods();
  void count_container_restarts(const ContainerRestarts& restarts);
  void decide(const ClassifiedPods& pods, const ContainerRestarts& restarts);
  void summarize_conditions();                                              // job_status.cc
  void delete_old_incarnations();                                           // pod_writes.cc
  void annotate_counted_restarts();                                         // pod_writes.cc
  void create_missing_pods();                                               // pod_writes.cc
  std::optional<api::Time> name_released_at(const std::string& pod) const;  // pod_writes.cc
  void update_created_condition(const Children& children);                  // job_status.cc
  void count_replicas();                                                    // job_status.cc
  void track_progress();
  void commit_status();
  WriteOutcome act();                                        // pod_writes.cc
  void record_action_events(WriteOutcome& outcome);          // pod_writes.cc
  void handle_refused_creates(const WriteOutcome& outcome);  // pod_writes.cc
  bool ttl_expired() const;
  ReconcileResult delete_job();

  // What the steps share.
  const api::RunPolicy& policy() const { return spec.run_policy; }
  void apply(const RestartDecision& decision);
  void restart_group(const std::string& reason, const std::string& message,
                     std::chrono::milliseconds delay);
  std::map<std::string, api::PodRecord> unsettled_pods() const;  // job_status.cc
  void write_status();                                           // job_status.cc
  void flush_events();
  std::exception_ptr call(const Action& a) const;                             // pod_writes.cc
  void settle(const Action& a, std::exception_ptr error, WriteOutcome& out);  // pod_writes.cc
  void settle_create(const Action& a, std::exception_ptr error, WriteOutcome& out);

  void requeue_in(std::chrono::milliseconds d) {
    d = std::max(d, std::chrono::milliseconds(1));
    if (!requeue || d < *requeue) requeue = d;
  }
  void event(std::string_view type, std::string_view reason, std::string message) {
    events.push_back({std::string(type), std::string(reason), std::move(message)});
  }
  std::string ref(const std::string& pod) const { return ns + "/" + pod; }
  void report_phase(const std::string& phase) const {
    if (r.options_.on_phase) r.options_.on_phase(key, phase);
  }
  // The committed failure budget to on_failure_budget; nullopt once the job is gone or finished.
  void report_failure_budget(bool gone) const {
    if (!r.options_.on_failure_budget) return;
    if (gone || api::is_finished(st)) {
      r.options_.on_failure_budget(key, std::nullopt);
    } else {
      r.options_.on_failure_budget(key, FailureBudget{st.failure_count, policy().backoff_limit});
    }
  }
  void finish(std::string_view phase, std::string_view reason, const std::string& message);
  void check_stuck(const ObservedPod& p);  // pod_writes.cc
  void delete_pod(const ObservedPod& p, std::string_view reason,
                  const std::string& why);  // pod_writes.cc
};

}  // namespace longhaul::controller
