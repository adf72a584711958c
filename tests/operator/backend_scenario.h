// The operator's scenarios written once for both API servers: ScenarioBackend is what a scenario
// needs of the server it runs against (a namespace, a client of the test's own, a kubelet to
// report exits and preemptions, the operator's writes), and BackendScenario the fixture that
// runs the in-process controller over it. backend_scenarios.cc holds the scenarios that tell the
// same story on either server; it is compiled into two binaries, each of which defines
// make_scenario_backend(): operator_scenario_test with the fake API server (scenario_test.cc,
// fast, every ctest run) and operator_real_test with the real kube-apiserver of tests/envtest
// (real_scenario_test.cc, labelled real;slow). What only one server can do (fault injection on
// the fake; the audit log, the garbage collector, the binary on the real) stays in those files.
//
// Thread-safety: used from the test thread; the reconcile counter is atomic.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/controller.h"
#include "longhaul/kube/http_client.h"
#include "scenario.h"

namespace longhaul::testing {

class ScenarioBackend {
 public:
  virtual ~ScenarioBackend() = default;

  // The namespace the scenario's jobs live in.
  virtual const std::string& ns() const = 0;
  // A client of the test's own (not the operator's), for creating jobs and reading state.
  virtual std::shared_ptr<kube::HttpClient> admin() = 0;
  // A new client for an operator (one per start, closed by the fixture).
  virtual std::shared_ptr<kube::HttpClient> operator_client() = 0;
  // What the controller needs to run on this server (the namespaces it watches).
  virtual void configure(controller::ControllerOptions& options) = 0;

  // The kubelet: the trainer container of `pod` exited with `exit_code` (0: Succeeded).
  virtual void terminate(const std::string& pod, int exit_code) = 0;
  // The scheduler preempted `pod`: Failed, DisruptionTarget, exit 143.
  virtual void preempt(const std::string& pod) = 0;
  // A stuck pod's deletion is never completed (its node is gone).
  virtual void set_stuck(const std::string& pod, bool stuck) = 0;

  // The operator's writes since the last call, one line each.
  virtual std::vector<std::string> take_operator_writes() = 0;

  // The deadline of a wait when the scenario names none, and how often a wait looks again.
  virtual std::chrono::milliseconds default_timeout() const = 0;
  virtual std::chrono::milliseconds poll_interval() const = 0;
  // How coarse the server's creationTimestamp is (a real server stamps whole seconds).
  virtual std::chrono::seconds timestamp_precision() const = 0;
  // How many preemptions RepeatedPreemptions... makes: each costs the real server seconds.
  virtual int preemption_rounds() const = 0;

  // Stops the kubelet and whatever else runs; called once, by the fixture's TearDown.
  virtual void stop() = 0;
};

// Defined by each binary: the backend of the running test, or nullptr with `*why` set when this
// machine cannot provide it (the test is then skipped with that reason).
std::unique_ptr<ScenarioBackend> make_scenario_backend(std::string* why);

// A fixture with the backend up and the controller started on demand (in-process, as the binary
// wires it), stopped and joined in TearDown on every path.
class BackendScenario : public ::testing::Test {
 protected:
  using json = nlohmann::json;

  void SetUp() override {
    std::string why;
    backend = make_scenario_backend(&why);
    if (backend == nullptr) GTEST_SKIP() << why;
    ns = backend->ns();
    admin = backend->admin();
  }
  void TearDown() override {
    if (ctl) ctl->stop();
    if (operator_client) operator_client->close();
    if (backend) backend->stop();
  }

  // Starts the controller with scenario_controller_options, changed by `tweak`, and its workers
  // once its caches are in sync.
  void start_operator(const std::function<void(controller::ControllerOptions&)>& tweak = {}) {
    if (operator_client) operator_client->close();
    operator_client = backend->operator_client();
    controller::ControllerOptions o = scenario_controller_options(reconciles);
    backend->configure(o);
    if (tweak) tweak(o);
    ctl = std::make_unique<controller::Controller>(operator_client, nullptr, o);
    ctl->start();
    ASSERT_TRUE(ctl->wait_for_sync(std::chrono::seconds(30)));
    ctl->start_workers();
  }

  // Polls `pred` (reading the server) until it holds or the deadline passes.
  bool wait(const std::function<bool()>& pred,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    return eventually_on_server(pred, timeout.value_or(backend->default_timeout()),
                                backend->poll_interval());
  }

  // A TrainingJob "name" of one Chief and `workers` Workers (image registry.example.com/lh:1).
  static json job_manifest(const std::string& name, int workers = 2) {
    return training_job_manifest(name, workers,
                                 {{"name", "trainer"}, {"image", "registry.example.com/lh:1"}});
  }
  void create(const json& job) { admin->create(kube::resources::kTrainingJobs, ns, job); }
  std::optional<json> try_get(const kube::Resource& r, const std::string& name) {
    try {
      return admin->get(r, ns, name);
    } catch (const kube::NotFoundError&) {
      return std::nullopt;
    }
  }
  api::TrainingJobStatus status(const std::string& name = "j") {
    auto job = try_get(kube::resources::kTrainingJobs, name);
    return job ? api::parse_status(job->value("status", json::object())) : api::TrainingJobStatus{};
  }
  std::vector<json> job_pods(const std::string& job) {
    kube::ListOptions o;
    o.label_selector = std::string(api::kLabelJobName) + "=" + job;
    return admin->list(kube::resources::kPods, ns, o)["items"].get<std::vector<json>>();
  }
  static std::string attempt_of(const json& pod) {
    return pod["metadata"]["annotations"].value(std::string(api::kAnnotationRestartAttempt), "");
  }
  // All `n` pods of the job exist, are Running, not terminating, and carry restart attempt `a`.
  bool pods_running_at(const std::string& job, size_t n, int64_t attempt) {
    const auto pods = job_pods(job);
    if (pods.size() != n) return false;
    for (const json& p : pods) {
      if (p["metadata"].contains("deletionTimestamp")) return false;
      if (p.value(json::json_pointer("/status/phase"), std::string()) != "Running") return false;
      if (attempt_of(p) != std::to_string(attempt)) return false;
    }
    return true;
  }
  bool running(const std::string& name, size_t pods, int64_t attempt) {
    return pods_running_at(name, pods, attempt) && status(name).phase == "Running";
  }
  std::vector<std::string> event_reasons() {
    std::vector<std::string> out;
    const json events = admin->list(kube::resources::kEvents, ns, {});
    for (const json& e : events["items"]) out.push_back(e.value("reason", ""));
    return out;
  }
  bool saw_event(const std::string& reason) {
    const auto r = event_reasons();
    return std::find(r.begin(), r.end(), reason) != r.end();
  }

  std::unique_ptr<ScenarioBackend> backend;
  std::string ns;
  std::shared_ptr<kube::HttpClient> admin;
  std::shared_ptr<kube::HttpClient> operator_client;
  std::unique_ptr<controller::Controller> ctl;
  std::atomic<int> reconciles{0};
};

}  // namespace longhaul::testing
