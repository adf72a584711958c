// The TrainingJob reconciler: given a job key, drives the cluster towards what the job's spec
// and status say, in one pass, level-based and idempotent.
//
// reconcile() runs ordered steps: fetch (NotFound => done) -> validate (InvalidSpec, never a
// crash loop) -> finished jobs: clean-up and TTL -> suspend/resume -> deadline -> ensure the
// logdir claim and the headless Service -> observe owned pods -> classify finished and
// disrupted pods (failure_policy.h) -> decide success (success_policy.h), failure or restart ->
// compute status -> write status once, only if it changed -> act on pods (delete stale
// incarnations, force-delete pods stuck Terminating on a lost node, create missing pods) ->
// requeue after the nearest timer (backoff, deadline, TTL, force-delete, create retry). The
// chief's training progress (status.progress) joins the one status write, read off the reconcile
// path and rate-limited by progressIntervalSeconds (progress.h).
//
// Pod writes: a pass sends its pod creates (and deletes) in slow-start batches of 1, 2, 4, ...
// up to 16 requests in flight, like Kubernetes' Job controller.
//
// Refused creates: the first refused create of a pass stops that pass's creates (those of its
// batch already in flight complete). A 400/422
// (the API server found the object invalid) fails the job with InvalidSpec, naming the
// TrainingJob field the server's field path comes from. Any other refusal (a ResourceQuota 403,
// a namespace being deleted, an admission webhook, the API server unavailable) is retried with
// backoff by requeueing the job itself, and reported truthfully: condition Created=False with
// reason FailedCreate and the server's message, and a Warning Event FailedCreate. Both are
// written in a second status write of that pass (an error path only).
//
// Events: one per decision and kind of action per pass ("created pods j-worker-0 ... and 995
// more"), never one per pod; the EventRecorder counts repeats of the same Event.
//
// Stopping: before every write (status, pods, Service, claim, Events, the job's TTL delete)
// the pass checks the stop token bound to its thread (kube/stop.h) and throws Cancelled once a
// stop was requested: a deposed leader stops writing mid-pass.
//
// Durable state lives only in the cluster: the job's status (restartAttempt, counters,
// nextRestartTime, and status.unsettledPods: the per-pod decisions a pod does not show yet) and
// each pod's annotations (longhaul.dev/restart-attempt, set at creation; longhaul.dev/counted-
// restarts, patched on after the status write that counted its container restarts). A pod's
// record is derived from the pod unless status keeps one, so status does not grow with the job.
// The create backoff is the one exception, kept in memory like the work queue's rate limits in
// Kubernetes' own controllers: a restarted operator tries a refused create once more at once
// (Created=False already says why) and backs off again from the start.
// Decisions are committed by the status write *before* pods are deleted or created, so an
// operator killed at any point, or a failed write, re-derives the same decision and never
// counts a failure twice. Pods are named deterministically and a 409 AlreadyExists on create
// means "exists", so pods are never duplicated. The in-memory Expectations only avoid redundant
// writes while the pod view (an informer cache) lags behind the operator's own writes.
//
// Where: the decisions are pure functions in the policy files (failure_policy.h,
// restart_policy.h, recovery_policy.h, success_policy.h, cleanup_policy.h); the pass that reads,
// applies them and writes is Reconciler::Pass (reconciler_pass.h), its steps in reconciler.cc,
// its status summary in job_status.cc and its writes in pod_writes.cc.
//
// Thread-safety: reconcile() may run concurrently for different keys; the work queue never
// hands the same key to two workers at once.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"
#include "longhaul/base/mutex.h"
#include "longhaul/controller/cluster_view.h"
#include "longhaul/controller/event_sink.h"
#include "longhaul/controller/expectations.h"
#include "longhaul/controller/progress.h"
#include "longhaul/kube/client.h"
#include "longhaul/kube/events.h"

namespace longhaul::controller {

using json = nlohmann::json;

struct ReconcileResult {
  // Reconcile again after this long even without a watch event (backoff, deadline, TTL, ...).
  std::optional<std::chrono::milliseconds> requeue_after;
};

// A job's failure budget as its committed status records it (ReconcilerOptions::on_failure_budget).
struct FailureBudget {
  int32_t failures = 0;       // status.failureCount: failures counted against the limit
  int32_t backoff_limit = 0;  // spec.runPolicy.backoffLimit; the job fails at failures > limit
  bool operator==(const FailureBudget&) const = default;
};

struct ReconcilerOptions {
  std::function<api::Time()> now = [] { return std::chrono::system_clock::now(); };
  std::function<double()> jitter01;  // uniform [0, 1); default: a seeded std::mt19937
  // Called once per restart decision, with the reason (for pod_restarts_total{reason}).
  std::function<void(std::string_view reason)> on_restart;
  // Called when a recovery in place (restartScope Replica) completes, with its duration from
  // the fault observed to every replica Running again (longhaul_operator_recovery_seconds).
  std::function<void(double seconds)> on_recovery;
  // Called after each reconcile with the job's phase ("" when the job is gone).
  std::function<void(const std::string& key, const std::string& phase)> on_phase;
  // Called after each committed status write (or a pass that found nothing to write) with the
  // failure budget the job's status now records: failures counted against
  // runPolicy.backoffLimit (status.failureCount) and the limit itself. nullopt when the job is
  // gone from the cache, being deleted, or finished (Succeeded/Failed: it spends no more budget),
  // so whoever exports it per job drops the job's series.
  std::function<void(const std::string& key, const std::optional<FailureBudget>& budget)>
      on_failure_budget;
  // Backoff after a refused create (quota, admission, API server unavailable): the n-th
  // consecutive failure of a job waits min(max, base * 2^(n-1)) before the next try.
  std::chrono::milliseconds create_retry_base{1000};
  std::chrono::milliseconds create_retry_max{60000};
  // A pod is re-created under the name of one that is gone no sooner than this after the
  // operator saw the name free. A kubelet (seen on 1.26.4) may still sync the deleted pod's
  // last status for a moment after removing it, by name: a successor created 20-40 ms after
  // the removal was given its predecessor's terminated container (exit 143), and every later
  // status update of the kubelet was then refused ("may not be transitioned to non-terminated
  // state"): the pod showed Error while it trained, the job Restarting. The kubelet drops a
  // removed pod's status in its housekeeping, every 2 s.
  std::chrono::milliseconds name_release_delay{3000};
  // How the chief's training progress is read (progress.h); the controller adds an on_update
  // that reconciles the job when a read brings new values.
  ProgressTrackerOptions progress;
};

class Reconciler {
 public:
  // `client` performs every write; `view` (nullable: ApiClusterView over client) serves reads;
  // `events` (nullable: a kube::EventRecorder over client). All must outlive the reconciler.
  Reconciler(kube::Client& client, ClusterView* view, EventSink* events,
             ReconcilerOptions options = {});
  ~Reconciler();

  // Throws on API errors (the caller requeues with rate-limited backoff); a kube::ConflictError
  // means the job changed under us.
  ReconcileResult reconcile(const std::string& ns, const std::string& name);

  // The reads of chiefs' metrics (tests wait on it).
  ProgressTracker& progress() { return *progress_; }

 private:
  struct Pass;  // one reconcile() over one job; its methods are the steps (reconciler.cc)
  kube::Client& client_;
  std::unique_ptr<ClusterView> own_view_;
  std::unique_ptr<EventSink> own_events_;
  ClusterView* view_;
  EventSink* events_;
  ReconcilerOptions options_;
  Expectations expectations_;
  std::mutex rng_mu_;
  // A job's creates that the API server refused, until one succeeds. In memory: after an
  // operator restart the first try comes at once.
  struct CreateFailure {
    int count = 0;
    api::Time retry_at;
    std::string message;  // for the Created condition
  };
  Mutex create_mu_;
  std::map<std::string, CreateFailure> create_failures_ GUARDED_BY(create_mu_);
  // "ns/name" of Services and claims whose create answered 409 although the cache has no such
  // object (one without the operator's label): they exist; not asked for again.
  std::set<std::string> unlabelled_children_ GUARDED_BY(create_mu_);
  // Per job, per pod name seen taken: nullopt while a pod holds it, else when the operator
  // first saw it free again (ReconcilerOptions::name_release_delay). In memory.
  std::map<std::string, std::map<std::string, std::optional<api::Time>>> names_
      GUARDED_BY(create_mu_);
  std::unique_ptr<ProgressTracker> progress_;  // last: its threads stop first
};

}  // namespace longhaul::controller
