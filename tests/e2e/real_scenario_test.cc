// The end-to-end scenarios on the REAL API server (tests/envtest: etcd + kube-apiserver +
// kube-controller-manager): the real backend of the shared scenarios (e2e_scenarios.cc, also run
// on the fake server by e2e_scenario_test). The longhaul-operator binary talks to the server
// through the admin kubeconfig, the local kubelet registers and heartbeats its Nodes and runs the
// longhaul-worker pods. Each test gets a fresh namespace, nodes named after it, and an operator
// and kubelet that watch only that namespace.
//
// What a real server does that the fake one does not, and how this copes: the logdir claim stays
// Pending (no provisioner; the operator does not wait for Bound and the kubelet maps the claim to
// a local folder: the scenarios assert it stays Pending here); pods need the namespace's default
// ServiceAccount (fresh_namespace() waits for it); the controller manager's garbage collector
// removes what the job owns; the pod garbage collector deletes pods bound to unknown nodes (the
// kubelet registers its Nodes). Reads go over the network to a server that also runs etcd on
// this machine: waits look every 250 ms, not on every kubelet change.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include <longhaul/e2e/local_cluster.h>
#include <longhaul/envtest/gtest.h>

#include "e2e_scenario.h"

namespace longhaul::e2e::testing {
namespace {

using namespace std::chrono_literals;

class RealBackend : public E2eBackend {
 public:
  explicit RealBackend(envtest::ControlPlane& plane)
      : plane_(plane), ns_(envtest::fresh_namespace(plane)) {}

  const std::string& ns() const override { return ns_; }
  void configure(LocalClusterOptions& o) override {
    o.nodes = {ns_ + "-node-0", ns_ + "-node-1", ns_ + "-node-2"};
    o.external_api = plane_.admin_config();
    o.external_kubeconfig = plane_.admin_kubeconfig();
    o.watch_namespace = ns_;
  }
  std::chrono::milliseconds poll_interval() const override { return 250ms; }
  bool recheck_on_kubelet_change() const override { return false; }
  bool claims_stay_pending() const override { return true; }
  bool compares_with_uninterrupted_run() const override { return false; }

 private:
  envtest::ControlPlane& plane_;
  const std::string ns_;
};

}  // namespace

std::unique_ptr<E2eBackend> make_e2e_backend(std::string* why) {
  envtest::ControlPlane* plane = envtest::shared_control_plane(why);
  if (plane == nullptr) return nullptr;
  return std::make_unique<RealBackend>(*plane);
}

}  // namespace longhaul::e2e::testing
