// The controller loop: informers on TrainingJobs, their pods, Services and claims feed a
// rate-limited work queue of job keys; worker threads run the Reconciler on each key.
//
// Lifecycle: start() starts the informers (they run whether or not this replica leads, so
// /readyz can report sync and a new leader starts warm); start_workers() / stop_workers()
// start and stop reconciling (the leader elector calls them); stop() stops workers, then
// informers, and joins every thread.
//
// Stopping writes: each worker runs under a stop token (kube/stop.h) of the current leadership
// term. cancel_workers() requests that stop without waiting (safe from the elector's callback):
// from then on no reconcile starts a write; a write waiting for the rate limiter or in flight
// is aborted. A reconcile stopped this way leaves its key queued for the next term. Keys:
// "namespace/name" of the job; a pod, Service or claim event enqueues its job (the controller
// ownerReference, else the job-name label).
//
// Reads: pods, Services and claims come from the informer caches; the job itself is read from
// the API on every reconcile, so a status this operator just wrote is never read stale (see
// reconciler.h). A key whose reconcile throws is retried with per-key exponential backoff; a
// result with requeue_after is re-added after that delay.
//
// Thread-safety: start/stop methods are for one owning thread; everything else is internal.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/controller/cluster_view.h"
#include "longhaul/controller/event_sink.h"
#include "longhaul/controller/reconciler.h"
#include "longhaul/kube/client.h"
#include "longhaul/kube/informer.h"
#include "longhaul/kube/workqueue.h"

namespace longhaul::controller {

// The transform of the controller's pod cache (kube::Informer's transform): kube::strip_for_cache,
// then the parts of the pod spec that nothing of the operator reads from a cached pod: volumes,
// tolerations, affinity, topologySpreadConstraints, and each container's env, envFrom,
// volumeMounts, volumeDevices, command, args, probes and lifecycle. Readers of cached pods
// (reconciler, failure/clean-up/recovery policies, expectations, ownership, progress) read
// metadata, status (kept whole: progress reads containerStatuses[].state.terminated.message), and
// spec.containers[].name/ports; cache_transform_test checks they decide
// the same on a trimmed pod. Reading another pod spec field from the cache means keeping it here.
void trim_cached_pod(json& pod);

struct ControllerOptions {
  std::vector<std::string> namespaces;  // empty: all namespaces
  int workers = 2;
  std::chrono::seconds watch_timeout{300};
  std::chrono::milliseconds retry_base_delay{50};
  std::chrono::milliseconds retry_max_delay{60000};
  // Every job is reconciled again this often even without events (0: never).
  std::chrono::seconds resync_period{0};
  ReconcilerOptions reconciler;
  // Metrics hooks.
  std::function<void(std::string_view result, double seconds)>
      on_reconcile;  // success|error|requeue
  // CPU time the worker thread spent in one reconcile (the operator's own time: wall time less
  // waiting for the API server, the client rate limit and other processes).
  std::function<void(double cpu_seconds)> on_reconcile_cpu;
  std::function<void(size_t depth)> on_queue_depth;
  std::function<void(double seconds)> on_queue_latency;
};

class Controller {
 public:
  // `events` may be null: Events go through a kube::EventRecorder over `client`.
  Controller(std::shared_ptr<kube::Client> client, EventSink* events, ControllerOptions options);
  ~Controller();  // stop()
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  void start();
  bool synced() const;
  bool wait_for_sync(std::chrono::milliseconds timeout) const;
  void start_workers();
  // Requests the stop of every write of the running workers; returns at once.
  void cancel_workers();
  void stop_workers();  // cancel_workers(), then returns once no reconcile is running
  void stop();
  bool workers_running() const { return workers_running_.load(); }
  // Running and not cancelled.
  bool workers_active();

  // Enqueues a job key by hand (tests, resync).
  void enqueue(const std::string& key);

 private:
  void worker_loop();
  void enqueue_owner(const json& object);
  void resync_loop();

  std::shared_ptr<kube::Client> client_;
  ControllerOptions options_;
  std::vector<std::unique_ptr<kube::Informer>> job_informers_;
  std::vector<std::unique_ptr<kube::Informer>> pod_informers_;
  std::vector<std::unique_ptr<kube::Informer>> child_informers_;  // services, claims
  std::unique_ptr<InformerClusterView> view_;
  std::unique_ptr<EventSink> own_events_;
  std::unique_ptr<Reconciler> reconciler_;
  std::unique_ptr<kube::WorkQueue> queue_;
  std::vector<std::thread> workers_;
  std::thread resync_;
  std::atomic<bool> workers_running_{false};
  Mutex term_mu_;
  std::stop_source term_ GUARDED_BY(term_mu_);  // the stop of the current leadership term
  std::mutex resync_mu_;
  std::condition_variable resync_cv_;
  bool started_ = false;
};

}  // namespace longhaul::controller
