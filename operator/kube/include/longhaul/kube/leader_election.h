// Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics, so that of
// several operator replicas exactly one reconciles at a time.
//
//  - A candidate takes the Lease when it does not exist, has no holder (released), or has not
//    changed for leaseDurationSeconds as measured by the candidate's own clock since it last saw
//    the record change (the remote renewTime is never compared with the local clock).
//  - The leader renews every retry_period; when no renewal has succeeded for renew_deadline it
//    stops leading (on_stopped_leading) and becomes a candidate again.
//  - stop() releases the Lease (holderIdentity cleared, leaseDurationSeconds 1) when leading and
//    release_on_stop is set, so a successor takes over at once.
//  - Every write is an update carrying the resourceVersion just read (optimistic concurrency):
//    of two candidates racing for an expired Lease, one gets 409 and stays a candidate.
//
// The client given should have a retry budget below renew_deadline (a renewal stuck in retries
// must not outlive the lease).
//
// Callbacks run on the elector's thread and must return promptly (start or stop workers
// elsewhere). Thread-safety: is_leader()/leader()/stop() are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/client.h"

namespace longhaul::kube {

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;  // e.g. "longhaul-operator"
  std::string identity;    // unique per candidate; default_identity() when empty
  std::chrono::milliseconds lease_duration{15000};  // rounded up to whole seconds on the Lease
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  bool release_on_stop = true;
  std::function<void()> on_started_leading;
  std::function<void()> on_stopped_leading;
  std::function<void(const std::string& identity)> on_new_leader;  // any observed holder change
};

// "<hostname>_<random hex>"
std::string default_identity();

// RFC 3339 with microseconds, UTC: "2026-11-21T13:20:39.123456Z" (metav1.MicroTime).
std::string format_micro_time(std::chrono::system_clock::time_point t);
// RFC 3339 seconds, UTC: "2026-11-21T13:20:39Z" (metav1.Time).
std::string format_time(std::chrono::system_clock::time_point t);

class LeaderElector {
 public:
  // Throws InvalidArgument unless lease_duration > renew_deadline > retry_period > 0 and the
  // lease name and namespace are set.
  LeaderElector(std::shared_ptr<Client> client, LeaderElectionConfig config);
  ~LeaderElector();  // stop()
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  void start();
  // Stops campaigning; releases the Lease if leading (and release_on_stop), calls
  // on_stopped_leading if it was leading, and joins the thread. Idempotent.
  void stop();

  bool is_leader() const { return leading_.load(); }
  std::string leader() const;  // the holder last observed ("" when none)
  const std::string& identity() const { return config_.identity; }

 private:
  void run();
  bool try_acquire_or_renew();
  void release();
  bool wait(std::chrono::milliseconds d);  // false when stopping
  json lease_spec(const std::string& holder, const std::string& acquire_time, int64_t transitions,
                  int64_t duration_seconds) const;
  void observe(const json& spec);

  const std::shared_ptr<Client> client_;
  LeaderElectionConfig config_;
  std::thread thread_;
  std::atomic<bool> leading_{false};

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  // Elector-thread state (also read under mu_ by leader()).
  json observed_spec_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point observed_time_ GUARDED_BY(mu_);
};

}  // namespace longhaul::kube
