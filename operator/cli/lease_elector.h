// Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics: a candidate
// takes the Lease when it is absent, released (empty holderIdentity) or not renewed for
// leaseDurationSeconds as observed on this replica's own clock (so clock skew between replicas
// does not matter); the leader renews every retry_period and steps down when it could not renew
// for renew_deadline; stop(release) gives the Lease up so a successor need not wait.
//
// Writes are guarded by resourceVersion, so two candidates never both succeed.
// (A stand-in in operator/cli until operator/kube provides its LeaderElector.)
//
// Thread-safety: start()/stop() from the owning thread; callbacks run on the elector thread,
// one at a time; leading() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "longhaul/kube/client.h"

namespace longhaul::operator_cli {

struct LeaseElectorOptions {
  std::string lease_namespace;
  std::string lease_name = "longhaul-operator";
  std::string identity;  // unique per replica: "<hostname>_<pid>"
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  std::function<void()> on_started_leading;
  std::function<void()> on_stopped_leading;
};

class LeaseElector {
 public:
  LeaseElector(std::shared_ptr<kube::Client> client, LeaseElectorOptions options);
  ~LeaseElector();  // stop(false)
  void start();
  // Stops campaigning; when leading, calls on_stopped_leading and, with `release`, writes the
  // Lease back with an empty holder. Joins the thread.
  void stop(bool release);
  bool leading() const { return leading_.load(); }

 private:
  void run();
  bool try_acquire_or_renew();
  void release_lease();

  std::shared_ptr<kube::Client> client_;
  LeaseElectorOptions options_;
  std::thread thread_;
  std::atomic<bool> leading_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  // The last record seen from another holder and when this replica first saw it.
  std::string observed_record_;
  std::chrono::steady_clock::time_point observed_at_{};
};

}  // namespace longhaul::operator_cli
