// The chief's training progress in TrainingJob status (status.progress: the STEP and LAST-CKPT
// columns of `kubectl get tj`).
//
// Where it comes from: the chief's Prometheus metrics. The worker exports
// longhaul_train_global_step, longhaul_train_max_steps, longhaul_checkpoint_last_step and
// longhaul_checkpoint_last_timestamp_seconds; the operator reads them with a plain HTTP GET of
// http://<chief podIP>:<the container port named "metrics">/metrics. The operator cannot mount
// the logdir claim, and the metrics port is already how Prometheus watches the job. A chief
// without a port named "metrics" has no progress (nothing is read, nothing written).
//
// Off the reconcile path: ProgressTracker::track() never waits for the network. It hands a read
// to a small pool of scrape threads (one read in flight per job, each bounded by a total
// deadline) and applies the newest sample it already holds. When a read returns values that
// differ from the previous read, the tracker calls `on_update(job key)` so the controller
// reconciles the job promptly. A failed read (pod unreachable, slow, not serving yet, garbage)
// keeps the last sample and is no error: the status keeps the last progress.
//
// Which pod is the chief: the worker's chief role can move. When the chief replica is lost and
// the survivors recover in place, the lowest surviving rank takes over the chief's writes and the
// re-created chief pod joins as a worker (worker/distributed/README.md, "Chief promotion"). Every
// worker exports longhaul_worker_is_chief (1 on the replica that holds the role); the tracker
// reads the pod that last said 1 (at first the TF_CONFIG chief pod) and, when it says 0 or does
// not answer, the other pods of the group in rank order until one says 1 (a pod that does not
// export the gauge counts as the chief only when it is the TF_CONFIG chief: older workers). So a
// steady job costs one read per interval; a hand-over costs at most one read per pod, once.
//
// Rate: the tracker derives the training rate from two reads of the same pod (steps over the
// time between the reads, smoothed: half the previous rate plus half the new one; 3 significant
// digits), and from it the time left to max_steps (status.progress.eta, the ETA column) and the
// estimated completion time. A read that shows the same step as the previous one says 0 (the
// chief is not advancing): no rate, no ETA. status.progress.lastStepTime is the time of the first
// read that showed the current step.
//
// The end: a read of the metrics comes at most every interval and none comes once the chief has
// exited, so the last one may be far behind the step the chief ended at. The worker writes its
// final progress into its container's termination message (worker/cli/termination_message.h);
// the tracker applies it at once when it sees the chief's container terminated, so the final
// status of a finished job is exact, however short the job.
//
// Failed reads: a read that fails (a chief that has just started and does not listen yet, an
// unreachable pod) is retried after retry_initial, doubled per consecutive failure, at most one
// interval: at the first failure of a streak the tracker calls `on_update` to have the job
// reconciled, and track() asks to come back after the retry delay. A failure changes nothing in
// the status (no write). A chief that answers step 0 without a checkpoint (it has not started
// training yet) is read again on the same schedule, and the first real step replaces a recorded
// step 0 at once (apply_progress), so a job shorter than one interval shows its progress while
// it runs too.
//
// Writes: apply_progress() changes status.progress at most once per progressIntervalSeconds
// (judged from status.progress.observedTime, so it survives operator restarts) and only when a
// value changed; a job whose progress is unchanged costs no write, only a read of the chief's
// /metrics every interval.
//
// Thread-safety: ProgressTracker's methods are safe to call concurrently (one mutex guards the
// per-job entries); `fetch` runs on the scrape threads; `on_update` on a scrape thread too, and
// must not call back into the tracker's destructor. The destructor stops and joins every thread,
// abandoning queued reads (a read in flight finishes within its deadline).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"
#include "longhaul/base/mutex.h"

namespace longhaul::controller {

// What one read of the chief's /metrics says.
struct ProgressSample {
  int64_t step = 0;
  int64_t max_steps = 0;             // 0: not exported
  int64_t last_checkpoint_step = 0;  // meaningful only with last_checkpoint_unix > 0
  int64_t last_checkpoint_unix = 0;  // seconds since the epoch; 0: no checkpoint yet
  int is_chief = -1;                 // longhaul_worker_is_chief: 1, 0, or -1 when not exported
  std::string pod;                   // the pod that answered (set by the tracker)
  // Set by the tracker from this read and the previous one of the same pod (see "Rate" above),
  // or by the worker's termination message: 0 when not known.
  double steps_per_second = 0;  // 3 significant digits
  int64_t eta_seconds = 0;      // to max_steps at that rate, from the read
  int64_t completion_unix = 0;  // the read's time + eta_seconds
  int64_t last_step_unix = 0;   // when the step last moved (the first read that showed it)
  bool operator==(const ProgressSample&) const = default;
};

// Reads the sample from a Prometheus text exposition (prometheus_text.h). nullopt when it has no
// longhaul_train_global_step sample (not a longhaul worker, or not started). Labels are ignored
// (the chief's series carry rank="0"); comments, other metrics, timestamps, NaN and malformed
// lines are skipped; negative values count as absent.
std::optional<ProgressSample> parse_progress_metrics(std::string_view exposition);

// Where the chief serves its metrics.
struct MetricsEndpoint {
  std::string host;  // the pod IP (IPv4 or IPv6)
  int port = 0;
  std::string pod;  // the pod's name
  bool operator==(const MetricsEndpoint&) const = default;
};

// The chief pod's metrics endpoint: phase Running, a status.podIP, and a container port named
// "metrics". nullopt otherwise.
std::optional<MetricsEndpoint> metrics_endpoint(const nlohmann::json& pod);

// GET http://host:port/metrics through the operator's HTTP client (kube::CpprestTransport, the
// one that speaks to the API server), `timeout` bounding each step of the exchange (connecting,
// sending, each wait for more of the answer). Returns the body of a 200 answer. Throws
// Unavailable naming the endpoint on any failure (refused, unreachable, silent, another status).
std::string fetch_metrics(const MetricsEndpoint& endpoint, std::chrono::milliseconds timeout);

// The rate limit. Makes `status.progress` say `sample`, unless it already does (values equal:
// returns nullopt, changes nothing) or it changed less than `interval` ago: then it changes
// nothing and returns how long until it may (status times have second precision, so that is
// observedTime + interval + 1 s, which keeps two writes at least `interval` apart). A change
// stamps observedTime = now. A sample of step 0 without a checkpoint (a restarted chief that has
// not restored yet) never replaces a recorded progress; it is shown only for a new job, and such
// a recorded step 0 holds nothing back (the first real step shows at once). A sample of the
// recorded step keeps the recorded lastStepTime (a fresh tracker sees that step for the first
// time, the status knows better). An observedTime more than `interval` ahead of `now` (a skewed
// clock) holds nothing back.
std::optional<std::chrono::milliseconds> apply_progress(api::TrainingJobStatus& status,
                                                        const ProgressSample& sample,
                                                        std::chrono::seconds interval,
                                                        api::Time now);

// The progress a terminated container left in its termination message (the worker writes it:
// worker/cli/termination_message.h): a JSON object with an integer "step" >= 0, and optionally
// maxSteps, lastCheckpointStep + lastCheckpointTime, lastStepTime, stepsPerSecond and chief
// (is_chief 1/0; -1 when absent). nullopt for any other text (another program's message).
std::optional<ProgressSample> parse_termination_message(std::string_view message);

// The first container of `pod` whose state.terminated.message is such a message, and which
// termination it was (pod name, container name, finishedAt: the same termination seen twice has
// the same `termination`). nullopt when the pod has none.
struct TerminatedProgress {
  ProgressSample sample;  // sample.pod is the pod's name
  std::string termination;
  bool operator==(const TerminatedProgress&) const = default;
};
std::optional<TerminatedProgress> terminated_progress(const nlohmann::json& pod);

// Makes `status.progress` say what a terminated chief container wrote, at once (no rate limit:
// one change per container termination, and the values are exact: the step the chief ended at
// and its last committed checkpoint). The rate and ETA of a read are replaced by the message's
// own (the mean rate of its session; no ETA). A message of step 0 without a checkpoint never
// replaces a recorded progress (a chief that failed before restoring). Returns true when
// status.progress changed (observedTime = now).
bool apply_final_progress(api::TrainingJobStatus& status, const ProgressSample& sample,
                          api::Time now);

struct ProgressTrackerOptions {
  // Reads one endpoint; throws on failure. Default: fetch_metrics.
  std::function<std::string(const MetricsEndpoint&, std::chrono::milliseconds timeout)> fetch;
  // The job should be reconciled: a read returned values different from its previous read, or
  // a read failed and is to be retried soon (see "Failed reads" above).
  std::function<void(const std::string& job_key)> on_update;
  int threads = 2;
  std::chrono::milliseconds timeout{2000};
  // The first retry after a failed read; doubled per consecutive failure, at most the interval.
  std::chrono::milliseconds retry_initial{1000};
};

class ProgressTracker {
 public:
  explicit ProgressTracker(ProgressTrackerOptions options = {});
  ~ProgressTracker();
  ProgressTracker(const ProgressTracker&) = delete;
  ProgressTracker& operator=(const ProgressTracker&) = delete;

  // One reconcile's share, never blocking on the network: `chief_pod` is the TF_CONFIG chief pod
  // of the current incarnation (nullptr when there is none), `other_pods` the group's other
  // current pods in rank order (where the chief role may have moved, see above).
  // First, a termination message of the chief role's container among these pods is applied at
  // once (apply_final_progress), each termination once; a finished job (status phase Succeeded
  // or Failed) then stops here: its entry is dropped and nothing is read again.
  // Otherwise starts a read when none is in flight and the last one started `interval` (after a
  // failed read: the retry delay) or more before `now` (or the endpoints changed), then applies
  // the newest sample to `status` (apply_progress). Returns when to reconcile again for the next
  // read or a rate-limited change; nullopt when no pod has a metrics endpoint (the pods' own
  // events bring the next reconcile).
  std::optional<std::chrono::milliseconds> track(
      const std::string& job_key, const nlohmann::json* chief_pod, std::chrono::seconds interval,
      api::TrainingJobStatus& status, api::Time now,
      const std::vector<const nlohmann::json*>& other_pods = {});
  // The job is gone: drop its entry (a read in flight is discarded).
  void forget(const std::string& job_key);
  // Tests: waits until no read is queued or in flight (its on_update call included); false
  // after `timeout`.
  bool wait_idle(std::chrono::milliseconds timeout);

 private:
  struct Entry {
    uint64_t id = 0;  // distinguishes an entry from a re-created one of the same key
    std::vector<MetricsEndpoint> endpoints;  // the TF_CONFIG chief's first (when it has one)
    bool first_is_tf_config_chief = false;
    std::optional<MetricsEndpoint> chief;  // the endpoint that last said longhaul_worker_is_chief 1
    std::optional<api::Time> last_attempt;
    bool in_flight = false;
    std::optional<ProgressSample> sample;
    std::optional<api::Time> sample_time;  // when `sample` was read (the rate's other end)
    int failures = 0;                      // consecutive failed reads (logged once per streak)
    std::string termination;  // the last termination message applied (TerminatedProgress)
  };
  struct Read {
    std::string key;
    uint64_t id;
    api::Time when;                          // the `now` of the track() that started it
    std::vector<MetricsEndpoint> endpoints;  // tried in order until one is the chief
    std::optional<MetricsEndpoint> tf_config_chief;
  };
  void scrape_loop();
  // The rate, ETA and last-step time of `s`, read at `when`, from the entry's previous sample.
  static void derive_rate(const Entry& e, api::Time when, ProgressSample& s);

  ProgressTrackerOptions options_;
  Mutex mu_;
  CondVar work_cv_;  // a read was queued, or stopping
  CondVar idle_cv_;  // a read finished
  std::map<std::string, Entry> entries_ GUARDED_BY(mu_);
  std::deque<Read> queue_ GUARDED_BY(mu_);
  int busy_ GUARDED_BY(mu_) = 0;  // reads in flight
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace longhaul::controller
