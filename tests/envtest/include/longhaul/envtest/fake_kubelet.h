// A kubelet stand-in for tests against the real API server (there is no kubelet in envtest):
// on a thread of its own it registers one Node and keeps its Ready heartbeat fresh, binds the
// Pending pods of one namespace to that node and reports them Running and Ready, and completes
// the graceful deletion of terminating pods (DELETE with grace 0, as a kubelet does once the
// containers stopped) unless the test marks a pod as stuck on a lost node. Tests report what
// happened to a container (exit codes, preemption) through the pods' status subresource, as a
// kubelet would: every status patch carries the pod's metadata.uid, so none reaches a pod
// re-created under the same name since (terminate() and preempt() aim at the pod they read).
//
// Its requests carry the User-Agent "longhaul-envtest-kubelet", so audit-based write counts can
// tell them from the operator's.
//
// Thread-safety: every method may be called from any thread; the settings are GUARDED_BY(mu_)
// (checked by clang -Wthread-safety), the rest belongs to the kubelet thread.
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "longhaul/base/mutex.h"
#include "longhaul/envtest/control_plane.h"

namespace longhaul::envtest {

class FakeKubelet {
 public:
  FakeKubelet(const ControlPlane& plane, std::string ns, std::string node = "envtest-node");
  ~FakeKubelet();  // stop()
  FakeKubelet(const FakeKubelet&) = delete;
  FakeKubelet& operator=(const FakeKubelet&) = delete;
  void stop() EXCLUDES(mu_);

  // New pods are bound and reported Running/Ready (default on).
  void set_auto_run(bool on) EXCLUDES(mu_);
  // A stuck pod's deletion is never completed (its node is gone).
  void set_stuck(const std::string& pod, bool stuck) EXCLUDES(mu_);

  // The container of `pod` exited with `exit_code`: phase Succeeded (0) or Failed. A non-empty
  // `message` is what it left at its terminationMessagePath (state.terminated.message).
  void terminate(const std::string& pod, int exit_code, const std::string& message = "");
  // The pod was preempted: phase Failed, reason Preempted, condition DisruptionTarget, exit 143.
  void preempt(const std::string& pod);

  const std::string& node() const { return node_; }

 private:
  void run() EXCLUDES(mu_);
  void sync_once() EXCLUDES(mu_);
  void heartbeat();
  // Merge-patches `status` into the incarnation `pod` (a pod object as read): its uid rides in the
  // patch, so the write is refused once a same-name successor replaced it.
  void patch_status(const json& pod, const json& status);
  static json container_statuses_of(const json& pod, const json& state, bool ready);

  const ControlPlane& plane_;
  const std::string ns_;
  const std::string node_;
  std::shared_ptr<kube::HttpClient> client_;
  longhaul::Mutex mu_;
  longhaul::CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool auto_run_ GUARDED_BY(mu_) = true;
  std::set<std::string> stuck_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_heartbeat_{};  // kubelet thread only
  std::thread thread_;
};

}  // namespace longhaul::envtest
