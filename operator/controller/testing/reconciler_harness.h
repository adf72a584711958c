// ReconcilerHarness: the fixture the reconciler's unit tests share (test-only). A Reconciler
// over the fake API server's store as a kube::Client (longhaul/fakeapi/store_client.h) with a clock
// the test sets, Events kept in order, and the simulated kubelet: pods are moved to Running, Failed
// (with an exit code) or preempted by writing their status, as a kubelet would.
//
// Derived fixtures make the reconciler in their constructor from base_options(), adding the
// hooks they observe.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "longhaul/controller/reconciler.h"
#include "longhaul/fakeapi/store_client.h"

namespace longhaul::controller::testing {

// Keeps every Event: reasons in order, and messages as "<type> <reason>: <message>".
class RecordingEvents : public EventSink {
 public:
  void record(const nlohmann::json&, std::string_view type, std::string_view reason,
              std::string_view message) override {
    std::lock_guard lock(mu);
    reasons.push_back(std::string(reason));
    messages.push_back(std::string(type) + " " + std::string(reason) + ": " + std::string(message));
  }
  bool saw(std::string_view reason) { return count(reason) > 0; }
  int count(std::string_view reason) {
    std::lock_guard lock(mu);
    return static_cast<int>(std::count(reasons.begin(), reasons.end(), reason));
  }
  std::mutex mu;
  std::vector<std::string> reasons, messages;
};

class ReconcilerHarness : public ::testing::Test {
 protected:
  using json = nlohmann::json;

  // The clock is `now`; restart jitter is 0; a freed pod name is reused at once (the tests of
  // name_release_delay set it).
  ReconcilerOptions base_options() {
    ReconcilerOptions o;
    o.now = [this] { return now; };
    o.jitter01 = [] { return 0.0; };
    o.name_release_delay = std::chrono::milliseconds(0);
    return o;
  }

  // Creates TrainingJob ns/j with `spec`.
  void create_job(const json& spec) {
    client.create(kube::resources::kTrainingJobs, "ns",
                  {{"apiVersion", "longhaul.dev/v1alpha1"},
                   {"kind", "TrainingJob"},
                   {"metadata", {{"name", "j"}, {"namespace", "ns"}}},
                   {"spec", spec}});
  }

  ReconcileResult reconcile() { return reconciler->reconcile("ns", "j"); }

  // Reconciles until a pass writes nothing (at most 20 passes); returns the passes that wrote.
  int settle() {
    for (int i = 0; i < 20; ++i) {
      const int before = client.writes();
      reconcile();
      if (client.writes() == before) return i;
    }
    ADD_FAILURE() << "the reconciler did not converge in 20 passes";
    return 20;
  }

  api::TrainingJobStatus status() {
    return api::parse_status(
        client.get(kube::resources::kTrainingJobs, "ns", "j").value("status", json{}));
  }
  json pod(const std::string& name) { return client.get(kube::resources::kPods, "ns", name); }
  std::vector<std::string> pod_names() {
    std::vector<std::string> names;
    for (const json& p : client.all(kube::resources::kPods, "ns")) {
      names.push_back(p["metadata"]["name"]);
    }
    return names;
  }
  std::string uid(const std::string& name) { return pod(name)["metadata"]["uid"]; }
  std::string attempt(const std::string& name) {
    return pod(name)["metadata"]["annotations"]["longhaul.dev/restart-attempt"];
  }

  // The kubelet: `phase` (Running pods are Ready; Failed and Succeeded ones carry the trainer
  // container's exit code), with `extra` merged into the status.
  void set_phase(const std::string& name, const std::string& phase, int exit_code = 0,
                 const json& extra = json::object()) {
    json p = pod(name);
    p["status"] = {{"phase", phase}};
    if (phase == "Running") {
      p["status"]["conditions"] = {{{"type", "Ready"}, {"status", "True"}}};
    }
    if (phase == "Failed" || phase == "Succeeded") {
      p["status"]["containerStatuses"] = {
          {{"name", "trainer"}, {"state", {{"terminated", {{"exitCode", exit_code}}}}}}};
    }
    p["status"].merge_patch(extra);
    client.put(kube::resources::kPods, p);
  }
  void run_all() {
    for (const std::string& n : pod_names()) {
      if (pod(n).value("status", json::object()).value("phase", "") != "Running") {
        set_phase(n, "Running");
      }
    }
  }
  // Preempted by the scheduler: exit 143 with a DisruptionTarget condition.
  void preempt(const std::string& name) {
    set_phase(name, "Failed", 143,
              {{"conditions",
                {{{"type", "DisruptionTarget"},
                  {"status", "True"},
                  {"reason", "PreemptionByScheduler"}}}}});
  }

  fakeapi::StoreClient client;
  RecordingEvents events;
  api::Time now = api::parse_time("2026-11-21T13:00:00Z");
  std::unique_ptr<Reconciler> reconciler;
};

}  // namespace longhaul::controller::testing
