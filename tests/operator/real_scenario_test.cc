// The operator's scenarios against a REAL kube-apiserver + etcd + kube-controller-manager
// (tests/envtest): the judge of what Kubernetes accepts and how it behaves. This file is the
// real backend of the shared scenarios (backend_scenarios.cc, also run on the fake server) and
// the scenarios only a real server can judge (the audit log's write counts, the CRD's schema,
// the garbage collector, the longhaul-operator binary). The fake server keeps the
// fault-injection scenarios (5xx, 429, dropped watches, 410), which a real server cannot be
// made to produce.
//
// What differs from the fake server, and how the tests handle it:
// - There is no kubelet: envtest::FakeKubelet binds the pods of the test's namespace to a Node it
//   keeps Ready, reports them Running, and completes their graceful deletion; tests report exits
//   and preemptions through the status subresource.
// - A pod on a lost node is a bound pod whose deletion the kubelet never completes (it stays
//   Terminating with its grace period); the API server removes a pod at once when it is unbound
//   or already finished.
// - Request counts come from the API server's audit log (writes only, by User-Agent): the
//   operator's requests say "longhaul-operator/...", the test's "longhaul-envtest...".
// - Owned objects are removed by the controller manager's garbage collector, which starts
//   watching a new kind only at its periodic rediscovery (30 s): deadlines allow for that.
// - Every test runs in its own namespace with its own operator watching only that namespace.
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "backend_scenario.h"
#include "longhaul/api/trainingjob.h"
#include "longhaul/base/http_server.h"
#include "longhaul/controller/controller.h"
#include "longhaul/envtest/fake_kubelet.h"
#include "longhaul/envtest/gtest.h"
#include "longhaul/testing/loopback.h"
#include "operator_process.h"
#include "scenario.h"

namespace longhaul::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using controller::Controller;
using controller::ControllerOptions;
using envtest::FakeKubelet;

const kube::Resource& kJobs = kube::resources::kTrainingJobs;

// The real server offers no change hook to wait on: polled every 25 ms.
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 60s) {
  return eventually_on_server(pred, timeout, 25ms);
}

// The real API server as a scenario backend: a fresh namespace per test, the admin client, the
// envtest kubelet of that namespace, and the operator's writes from the audit log.
class RealBackend : public ScenarioBackend {
 public:
  explicit RealBackend(envtest::ControlPlane& plane)
      : plane_(plane),
        ns_(envtest::fresh_namespace(plane)),
        admin_(plane.admin_client()),
        kubelet_(std::make_unique<FakeKubelet>(plane, ns_)),
        audit_offset_(plane.audit_barrier(ns_)) {}

  const std::string& ns() const override { return ns_; }
  std::shared_ptr<kube::HttpClient> admin() override { return admin_; }
  std::shared_ptr<kube::HttpClient> operator_client() override {
    kube::HttpClientOptions co;
    co.qps = 0;
    co.initial_backoff = 20ms;
    co.max_backoff = 500ms;
    co.max_retries = 20;
    return std::make_shared<kube::HttpClient>(plane_.admin_config(), co);
  }
  void configure(ControllerOptions& o) override { o.namespaces = {ns_}; }
  void terminate(const std::string& pod, int exit_code) override {
    kubelet_->terminate(pod, exit_code);
  }
  void preempt(const std::string& pod) override { kubelet_->preempt(pod); }
  void set_stuck(const std::string& pod, bool stuck) override { kubelet_->set_stuck(pod, stuck); }
  std::vector<std::string> take_operator_writes() override { return operator_writes(); }
  std::chrono::milliseconds default_timeout() const override { return 60s; }
  std::chrono::milliseconds poll_interval() const override { return 25ms; }
  std::chrono::seconds timestamp_precision() const override { return 1s; }
  int preemption_rounds() const override { return 3; }
  void stop() override { kubelet_->stop(); }

  // The operator's writes in this namespace since the last call ("VERB resource/name CODE").
  std::vector<std::string> operator_writes(const std::string& resource = "") {
    plane_.audit_barrier(ns_);
    std::vector<std::string> out;
    for (const json& e : plane_.audit_events(&audit_offset_)) {
      if (e.value("userAgent", "").rfind("longhaul-operator", 0) != 0) continue;
      const json& ref = e.value("objectRef", json::object());
      if (ref.value("namespace", "") != ns_) continue;
      if (!resource.empty() && ref.value("resource", "") != resource) continue;
      out.push_back(e.value("verb", "") + " " + ref.value("resource", "") +
                    (ref.contains("subresource") ? "/" + ref.value("subresource", "") : "") + "/" +
                    ref.value("name", "") + " " +
                    std::to_string(e.value(json::json_pointer("/responseStatus/code"), 0)));
    }
    return out;
  }

  envtest::ControlPlane& plane() const { return plane_; }
  FakeKubelet& kubelet() { return *kubelet_; }

 private:
  envtest::ControlPlane& plane_;
  const std::string ns_;
  std::shared_ptr<kube::HttpClient> admin_;
  std::unique_ptr<FakeKubelet> kubelet_;
  size_t audit_offset_ = 0;
};

}  // namespace

std::unique_ptr<ScenarioBackend> make_scenario_backend(std::string* why) {
  envtest::ControlPlane* plane = envtest::shared_control_plane(why);
  if (plane == nullptr) return nullptr;
  return std::make_unique<RealBackend>(*plane);
}

namespace {

// The real-only scenarios' fixture: the shared one (backend_scenario.h) on the real backend,
// with the control plane, the kubelet and the audit log at hand.
class RealScenario : public BackendScenario {
 protected:
  void SetUp() override {
    BackendScenario::SetUp();
    if (IsSkipped()) return;
    kubelet = &real().kubelet();
  }
  RealBackend& real() { return static_cast<RealBackend&>(*backend); }
  envtest::ControlPlane& plane() { return real().plane(); }
  // The operator's writes in this namespace since the last call ("VERB resource/name CODE").
  std::vector<std::string> operator_writes(const std::string& resource = "") {
    return real().operator_writes(resource);
  }
  // No pod churn: the operator deleted no pod, and no pod name was created twice. (A create cut
  // off by a SIGKILLed client may be audited with an error code although the pod was made, so
  // successful creates are bounded, not counted.)
  void expect_each_pod_created_once(const std::vector<std::string>& writes) {
    std::map<std::string, int> created;
    for (const std::string& w : writes) {
      EXPECT_NE(w.rfind("delete pods/", 0), 0u) << "the operator deleted a pod: " << w;
      if (w.rfind("create pods/", 0) == 0 && w.size() > 4 && w.substr(w.size() - 4) == " 201") {
        ++created[w.substr(12, w.size() - 16)];
      }
    }
    for (const auto& [name, n] : created)
      EXPECT_EQ(n, 1) << name << " was created " << n << " times";
  }
  // What a kubelet reports when the trainer container of `pod` restarted in place: restart count
  // 1, running and ready again.
  void restart_container_in_place(const std::string& pod) {
    admin->patch(kube::resources::kPods, ns, pod,
                 {{"status",
                   {{"containerStatuses",
                     {{{"name", "trainer"},
                       {"image", "registry.example.com/lh:1"},
                       {"imageID", ""},
                       {"ready", true},
                       {"restartCount", 1},
                       {"state", {{"running", json::object()}}},
                       {"lastState", json::object()}}}}}}},
                 kube::PatchType::kMerge, /*status_subresource=*/true);
  }
  // Starts the operator and job "j" (a chief and a worker, progress read every 5 s) whose chief
  // serves its metrics on 127.0.0.1:<metrics_port>, and waits for its pods to run; the chief
  // pod's status then reports 127.0.0.1 as its IP, as a kubelet would.
  void run_job_with_chief_metrics_at(int metrics_port) {
    start_operator();
    json job = job_manifest("j", 1);
    job["spec"]["progressIntervalSeconds"] = 5;
    job["spec"]["replicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["ports"] = {
        {{"name", "metrics"}, {"containerPort", metrics_port}}};
    create(job);
    ASSERT_TRUE(eventually([&] { return running("j", 2, 0); }));
    admin->patch(kube::resources::kPods, ns, "j-chief-0",
                 {{"status", {{"podIP", "127.0.0.1"}, {"podIPs", {{{"ip", "127.0.0.1"}}}}}}},
                 kube::PatchType::kMerge, /*status_subresource=*/true);
  }
  static size_t count(const std::vector<std::string>& writes, const std::string& prefix,
                      const std::string& suffix) {
    return std::count_if(writes.begin(), writes.end(), [&](const std::string& w) {
      return w.rfind(prefix, 0) == 0 && w.size() >= suffix.size() &&
             w.compare(w.size() - suffix.size(), suffix.size(), suffix) == 0;
    });
  }

  FakeKubelet* kubelet = nullptr;
};

// restartScope Replica (the default) on the real API server: a preempted worker is replaced
// alone with the group's LONGHAUL_RESTART_ATTEMPT; the survivors are never deleted; the recovery
// fields survive the CRD's structural schema (an undeclared status field would be pruned, and
// the recovery state lost); once whole, the job is written no more.
TEST_F(RealScenario, PreemptedWorkerIsReplacedAloneUnderReplicaScope) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"].erase("restartScope");
  create(job);
  ASSERT_TRUE(eventually([&] { return running("j", 3, 0); }));
  EXPECT_EQ(admin->get(kJobs, ns, "j")["spec"]["runPolicy"]["restartScope"], "Replica");
  std::map<std::string, std::string> uids;
  for (const json& p : job_pods("j")) uids[p["metadata"]["name"]] = p["metadata"]["uid"];
  operator_writes();
  kubelet->preempt("j-worker-1");
  auto recovered = [&] {
    const auto s = status();
    const auto* c = api::find_condition(s, api::condition::kRecovering);
    if (c == nullptr || c->status != "False" || s.recoveries != 1) return false;
    for (const json& p : job_pods("j")) {
      if (p["metadata"].contains("deletionTimestamp")) return false;
      if (p.value("status", json::object()).value("phase", "") != "Running") return false;
    }
    return job_pods("j").size() == 3;
  };
  ASSERT_TRUE(eventually(recovered)) << ::testing::PrintToString(event_reasons());
  const auto s = status();
  EXPECT_EQ(api::find_condition(s, api::condition::kRecovering)->reason,
            api::reason::kReplicasRecovered);
  EXPECT_TRUE(s.last_recovery_milliseconds.has_value());
  EXPECT_TRUE(s.recovering_since.empty());
  EXPECT_EQ(s.preemption_count, 1);
  EXPECT_EQ(s.failure_count, 0);
  EXPECT_EQ(s.phase, "Running");
  for (const json& p : job_pods("j")) {
    const std::string name = p["metadata"]["name"];
    std::map<std::string, std::string> env;
    for (const json& e : p["spec"]["containers"][0]["env"]) env[e["name"]] = e.value("value", "");
    EXPECT_EQ(env.at("LONGHAUL_RESTART_ATTEMPT"), "0") << name;
    if (name == "j-worker-1") {
      EXPECT_NE(p["metadata"]["uid"], uids.at(name));
      EXPECT_EQ(attempt_of(p), "1");
    } else {
      EXPECT_EQ(p["metadata"]["uid"], uids.at(name)) << name << " was re-created";
    }
  }
  const auto writes = operator_writes("pods");
  EXPECT_EQ(count(writes, "delete pods/j-worker-1", ""), 1u) << ::testing::PrintToString(writes);
  EXPECT_EQ(count(writes, "delete pods/", ""), 1u) << ::testing::PrintToString(writes);
  EXPECT_EQ(count(writes, "create pods/j-worker-1", " 201"), 1u)
      << ::testing::PrintToString(writes);
  EXPECT_TRUE(eventually([&] { return saw_event("ReplicasRecovered"); }));

  // Converged: a reconcile triggered by a change that needs nothing writes nothing.
  operator_writes();
  const int before = reconciles.load();
  admin->patch(kJobs, ns, "j", {{"metadata", {{"labels", {{"touched", "yes"}}}}}},
               kube::PatchType::kMerge);
  ASSERT_TRUE(eventually([&] { return reconciles.load() > before; }));
  std::vector<std::string> after;
  for (const std::string& w : operator_writes()) {
    if (w.find(" events/") == std::string::npos) after.push_back(w);
  }
  EXPECT_TRUE(after.empty()) << ::testing::PrintToString(after);
}

TEST_F(RealScenario, OperatorRestartedMidFlightMakesNoDuplicatesAndLosesNoJobs) {
  start_operator();
  for (int i = 0; i < 5; ++i) create(job_manifest("j" + std::to_string(i)));
  // Stop as soon as some pods exist: some jobs are half-created.
  ASSERT_TRUE(eventually([&] {
    kube::ListOptions o;
    o.label_selector = std::string(api::kLabelJobName);
    return admin->list(kube::resources::kPods, ns, o)["items"].size() >= 4;
  }));
  ctl->stop();
  ctl.reset();
  start_operator();
  for (int i = 0; i < 5; ++i) {
    const std::string n = "j" + std::to_string(i);
    ASSERT_TRUE(eventually([&] { return running(n, 3, 0); })) << n;
  }
  // Every pod name was created once, whatever was refused as a duplicate (409) along the way,
  // and no pod deleted. A create the stop cancelled in flight may have made its pod although the
  // audit log gives it 504 (the client went away): the new operator must then find that pod, not
  // create it again, so such a name has no 201 at all.
  const auto writes = operator_writes("pods");
  expect_each_pod_created_once(writes);
  EXPECT_LE(count(writes, "create pods/", " 201"), 15u) << ::testing::PrintToString(writes);
  for (int i = 0; i < 5; ++i) {
    for (const char* pod : {"-chief-0", "-worker-0", "-worker-1"}) {
      const std::string name = "j" + std::to_string(i) + pod;
      EXPECT_GE(count(writes, "create pods/" + name + " ", ""), 1u)
          << name
          << " exists but the operator never asked for it: " << ::testing::PrintToString(writes);
    }
  }
}

// The largest supported job (1000 Workers and a Chief) on the real API server, with pods in
// differing states: its status stays a few KB (the CRD's bounds hold: the server accepts every
// write), operator restarts mid-creation and mid-recovery lose nothing and create nothing twice,
// and once converged nothing is written.
TEST_F(RealScenario, ThousandReplicasKeepStatusBoundedAcrossOperatorRestarts) {
  constexpr int kWorkers = api::kMaxReplicasPerType;
  constexpr size_t kPods = kWorkers + 1;
  const auto worker = [](int i) { return "big-worker-" + std::to_string(i); };
  size_t largest_status = 0;
  auto status_when = [&](const std::function<bool(const api::TrainingJobStatus&)>& pred) {
    return eventually(
        [&] {
          const auto job = try_get(kJobs, "big");
          if (!job) return false;
          const json st = job->value("status", json::object());
          largest_status = std::max(largest_status, st.dump().size());
          return pred(api::parse_status(st));
        },
        300s);
  };
  start_operator();
  json job = job_manifest("big", kWorkers);
  job["spec"]["runPolicy"]["restartScope"] = "Replica";
  job["spec"]["runPolicy"]["backoffLimit"] = 100;
  create(job);
  ASSERT_TRUE(eventually([&] { return job_pods("big").size() >= 200; }, 300s));
  ctl->stop();  // mid-creation
  ctl.reset();
  start_operator();
  ASSERT_TRUE(status_when([](const auto& s) { return s.ready == "1001/1001"; }))
      << status("big").ready;
  ASSERT_EQ(job_pods("big").size(), kPods);

  // Differing states: 10 preempted, 10 failed (exit 137), 10 with a container restarted in
  // place, 20 reported Pending again, the rest running.
  kubelet->set_auto_run(false);
  for (int i = 100; i < 110; ++i) kubelet->preempt(worker(i));
  for (int i = 200; i < 210; ++i) kubelet->terminate(worker(i), 137);
  for (int i = 300; i < 310; ++i) restart_container_in_place(worker(i));
  for (int i = 400; i < 420; ++i) {
    admin->patch(kube::resources::kPods, ns, worker(i),
                 {{"status",
                   {{"phase", "Pending"},
                    {"conditions", {{{"type", "Ready"}, {"status", "False"}}}},
                    {"containerStatuses",
                     {{{"name", "trainer"},
                       {"image", "registry.example.com/lh:1"},
                       {"imageID", ""},
                       {"ready", false},
                       {"restartCount", 0},
                       {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}}}}}}},
                 kube::PatchType::kMerge, true);
  }
  ASSERT_TRUE(status_when([](const auto& s) {
    return s.preemption_count == 10 && s.failure_count == 20;
  })) << status("big").failure_count;
  {
    const auto s = status("big");
    EXPECT_LE(s.pod_statuses.size(), api::kMaxPodStatuses);
    EXPECT_EQ(s.pod_statuses.front().name, "big-chief-0");
    EXPECT_EQ(s.replica_statuses.at("Worker").replicas, kWorkers);
  }
  ctl->stop();  // mid-recovery: the failures are counted, the replacements not all made
  ctl.reset();
  start_operator();
  kubelet->set_auto_run(true);  // runs the replacements and the 20 Pending pods
  ASSERT_TRUE(status_when([](const auto& s) {
    return s.ready == "1001/1001" && s.recoveries == 20 &&
           !api::condition_true(s, api::condition::kRecovering) && s.pods.empty();
  })) << status("big").ready;
  const auto s = status("big");
  EXPECT_EQ(s.preemption_count, 10) << "nothing counted twice across the restart";
  EXPECT_EQ(s.failure_count, 20);
  ASSERT_EQ(s.pod_statuses.size(), 1u);
  EXPECT_EQ(s.pod_statuses_omitted, 0);
  EXPECT_EQ(job_pods("big").size(), kPods);
  for (int i = 300; i < 310; ++i) {
    const json p = admin->get(kube::resources::kPods, ns, worker(i));
    EXPECT_EQ(p["metadata"]["annotations"].value(std::string(api::kAnnotationCountedRestarts), ""),
              "1")
        << worker(i);
  }
  // Each pod name made once, the 20 failed ones once more; only those 20 deleted.
  const auto writes = operator_writes("pods");
  std::map<std::string, int> created;
  for (const std::string& w : writes) {
    if (w.rfind("create pods/", 0) == 0 && w.substr(w.size() - 4) == " 201") {
      ++created[w.substr(12, w.size() - 16)];
    }
  }
  for (const auto& [name, n] : created) {
    const int index = name.rfind("big-worker-", 0) == 0 ? std::stoi(name.substr(11)) : -1;
    const bool replaced = (index >= 100 && index < 110) || (index >= 200 && index < 210);
    EXPECT_LE(n, replaced ? 2 : 1) << name;
  }
  EXPECT_EQ(count(writes, "delete pods/", ""), 20u);
  EXPECT_LT(largest_status, 16u * 1024) << "largest status seen";
  RecordProperty("largest_status_bytes", static_cast<int>(largest_status));
  const json events = admin->list(kube::resources::kEvents, ns, {});
  EXPECT_LT(events["items"].size(), 60u);
  for (const json& e : events["items"]) EXPECT_LT(e.value("message", "").size(), 600u);

  // Converged: forced reconciles write nothing.
  ASSERT_NO_FATAL_FAILURE(expect_forced_reconciles_write_nothing(
      *ctl, reconciles, [&] { return operator_writes(); }, ns + "/big", /*max_rounds=*/4,
      /*quiet_rounds=*/2));
}

// An operator upgraded in place finds status written by its previous version (status.pods: a
// record per pod, container restarts counted there). The CRD keeps that field (the server would
// prune an undeclared one, and the records with it); the new operator reads it, touches no pod,
// counts nothing twice, moves the counted restarts onto the pod and drops status.pods.
TEST_F(RealScenario, StatusOfThePreviousOperatorVersionIsReadOnUpgrade) {
  start_operator();
  json manifest = job_manifest("j");
  manifest["spec"]["runPolicy"]["restartScope"] = "Replica";
  create(manifest);
  ASSERT_TRUE(eventually([&] { return running("j", 3, 0) && status().ready == "3/3"; }));
  ctl->stop();
  ctl.reset();
  restart_container_in_place("j-worker-1");
  json job = admin->get(kJobs, ns, "j");
  json& st = job["status"];
  st.erase("unsettledPods");
  st.erase("podStatuses");
  for (auto& [_, c] : st["replicaStatuses"].items()) c.erase("replicas");
  st["failureCount"] = 1;
  st["restartCount"] = 1;
  st["pods"] = json::parse(R"({
      "j-chief-[0]": {"restartAttempt": 0, "created": true, "containerRestarts": 0},
      "j-worker-[0]": {"restartAttempt": 0, "created": true, "containerRestarts": 0},
      "j-worker-1": {"restartAttempt": 0, "created": true, "containerRestarts": 1}})");
  admin->update_status(kJobs, ns, job);
  ASSERT_TRUE(admin->get(kJobs, ns, "j")["status"].contains("pods")) << "pruned by the server";
  operator_writes();
  start_operator();
  ASSERT_TRUE(eventually([&] {
    const json now = admin->get(kJobs, ns, "j")["status"];
    return !now.contains("pods") && now.contains("podStatuses");
  }));
  ASSERT_TRUE(eventually([&] {
    return admin->get(kube::resources::kPods, ns, "j-worker-1")["metadata"]["annotations"].value(
               std::string(api::kAnnotationCountedRestarts), "") == "1";
  }));
  const auto s = status();
  EXPECT_EQ(s.failure_count, 1) << "the counted restart is not counted again";
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(s.ready, "3/3");
  const auto writes = operator_writes("pods");
  EXPECT_EQ(count(writes, "create pods/", ""), 0u) << ::testing::PrintToString(writes);
  EXPECT_EQ(count(writes, "delete pods/", ""), 0u) << ::testing::PrintToString(writes);
  EXPECT_EQ(count(writes, "patch pods/j-worker-1", " 200"), 1u) << ::testing::PrintToString(writes);
}

// The chief's progress as the operator writes it (read from a loopback server standing in for
// longhaul-worker's /metrics): the real server accepts it, keeps the pod it was read from, and
// serves the STEP and LAST-CKPT columns of `kubectl get tj` from it.
TEST_F(RealScenario, ChiefProgressFromItsMetricsShowsInKubectlGet) {
  const int64_t checkpoint_unix =
      std::chrono::duration_cast<std::chrono::seconds>(
          (std::chrono::system_clock::now() - std::chrono::hours(72)).time_since_epoch())
          .count();
  http::Server chief("chief metrics", "127.0.0.1", 0, [&](std::string_view, std::string_view) {
    return http::Response{200, "text/plain; version=0.0.4",
                          "longhaul_train_global_step{rank=\"0\"} 1200\n"
                          "longhaul_train_max_steps{rank=\"0\"} 5000\n"
                          "longhaul_checkpoint_last_step{rank=\"0\"} 1000\n"
                          "longhaul_checkpoint_last_timestamp_seconds{rank=\"0\"} " +
                              std::to_string(checkpoint_unix) + "\n"};
  });
  chief.start();
  ASSERT_NO_FATAL_FAILURE(run_job_with_chief_metrics_at(chief.port()));
  ASSERT_TRUE(eventually([&] {
    const auto p = status().progress;
    return p && p->steps == "1200/5000";
  })) << api::to_json(status()).dump();
  EXPECT_EQ(status().progress->pod, "j-chief-0")
      << "the server keeps status.progress.pod (the pod read from) in its schema";
  // Refused as invalid, never (a 409 from a concurrent write is ordinary and retried).
  for (const std::string& w : operator_writes("trainingjobs")) {
    EXPECT_NE(w.substr(w.size() - 4), " 422") << "a status write the server refused: " << w;
    EXPECT_NE(w.substr(w.size() - 4), " 400") << "a status write the server refused: " << w;
  }

  const auto r =
      plane().request("GET", "/apis/longhaul.dev/v1alpha1/namespaces/" + ns + "/trainingjobs/j", "",
                      "", "application/json;as=Table;v=v1;g=meta.k8s.io");
  ASSERT_EQ(r.status, 200) << r.body;
  const json table = json::parse(r.body);
  std::map<std::string, json> cells;
  for (size_t i = 0; i < table["columnDefinitions"].size(); ++i) {
    cells[table["columnDefinitions"][i]["name"]] = table["rows"][0]["cells"][i];
  }
  EXPECT_EQ(cells["Step"], "1200/5000");
  EXPECT_EQ(cells["Last-Ckpt"], "3d");
  EXPECT_EQ(cells["Phase"], "Running");
}

// The rate, the ETA and the exact end on the real server: a chief whose step moves 10 per second
// shows RATE and ETA in `kubectl get tj`; when its container ends with the worker's termination
// message, the job's final status says exactly where it ended (it once kept the last read).
TEST_F(RealScenario, RateEtaAndTheExactEndOfAChiefShowInKubectlGet) {
  const auto started = std::chrono::steady_clock::now();
  http::Server chief("chief metrics", "127.0.0.1", 0, [&](std::string_view, std::string_view) {
    const auto seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return http::Response{200, "text/plain; version=0.0.4",
                          "longhaul_train_global_step{rank=\"0\"} " +
                              std::to_string(1000 + static_cast<int64_t>(10 * seconds)) +
                              "\nlonghaul_train_max_steps{rank=\"0\"} 5000\n"};
  });
  chief.start();
  ASSERT_NO_FATAL_FAILURE(run_job_with_chief_metrics_at(chief.port()));
  ASSERT_TRUE(eventually([&] {
    const auto p = status().progress;
    return p && p->steps_per_second > 0 && !p->eta.empty();
  })) << api::to_json(status()).dump();
  const auto running_progress = *status().progress;
  EXPECT_NEAR(running_progress.steps_per_second, 10, 3) << api::to_json(status()).dump();
  auto table_cells = [&] {
    const auto r =
        plane().request("GET", "/apis/longhaul.dev/v1alpha1/namespaces/" + ns + "/trainingjobs/j",
                        "", "", "application/json;as=Table;v=v1;g=meta.k8s.io");
    EXPECT_EQ(r.status, 200) << r.body;
    const json table = json::parse(r.body);
    std::map<std::string, json> cells;
    for (size_t i = 0; i < table["columnDefinitions"].size(); ++i) {
      cells[table["columnDefinitions"][i]["name"]] = table["rows"][0]["cells"][i];
    }
    return cells;
  };
  auto cells = table_cells();
  EXPECT_TRUE(cells["ETA"].is_string() && !cells["ETA"].get<std::string>().empty()) << cells["ETA"];
  EXPECT_TRUE(cells["Rate"].is_number() && cells["Rate"].get<double>() > 0) << cells["Rate"];

  // The chief's container ends: the worker's termination message is the job's last word.
  const std::string at = api::format_time(std::chrono::system_clock::now());
  kubelet->terminate("j-chief-0", 0,
                     R"({"chief":true,"lastCheckpointStep":5000,"lastCheckpointTime":")" + at +
                         R"(","lastStepTime":")" + at +
                         R"(","maxSteps":5000,"step":5000,"stepsPerSecond":9.5})");
  ASSERT_TRUE(eventually([&] { return status().phase == "Succeeded"; }))
      << api::to_json(status()).dump();
  const auto done = *status().progress;
  EXPECT_EQ(done.steps, "5000/5000");
  EXPECT_EQ(done.last_checkpoint_step, 5000);
  EXPECT_EQ(done.last_checkpoint_time, at);
  EXPECT_EQ(done.last_step_time, at) << "the server keeps lastStepTime";
  EXPECT_EQ(done.steps_per_second, 9.5);
  EXPECT_EQ(done.eta, "");
  cells = table_cells();
  EXPECT_EQ(cells["Step"], "5000/5000");
  EXPECT_TRUE(cells["ETA"].is_null() || cells["ETA"] == "") << cells["ETA"];
  for (const std::string& w : operator_writes("trainingjobs")) {
    EXPECT_NE(w.substr(w.size() - 4), " 422") << "a status write the server refused: " << w;
  }
}

// ---- the longhaul-operator binary on the real server ----

class RealBinary : public RealScenario {
 protected:
  void SetUp() override {
    RealScenario::SetUp();
    if (IsSkipped()) return;
    dir = plane().work_dir() / ns;
    fs::create_directories(dir);
    // The operator authenticates as a ServiceAccount with every right in this namespace
    // only: the chart's exact RBAC is chart_real_test's business.
    plane().ensure_service_account(ns, "operator");
    plane().apply(
        {{"apiVersion", "rbac.authorization.k8s.io/v1"},
         {"kind", "RoleBinding"},
         {"metadata", {{"name", "operator"}, {"namespace", ns}}},
         {"roleRef",
          {{"apiGroup", "rbac.authorization.k8s.io"},
           {"kind", "ClusterRole"},
           {"name", "cluster-admin"}}},
         {"subjects", {{{"kind", "ServiceAccount"}, {"name", "operator"}, {"namespace", ns}}}}});
    plane().write_kubeconfig(dir / "kubeconfig", plane().mint_token(ns, "operator"), ns);
  }
  std::unique_ptr<OperatorProcess> run(const std::string& identity,
                                       std::vector<std::string> extra) {
    extra.push_back("--namespace=" + ns);
    extra.push_back("--lease-namespace=" + ns);
    return std::make_unique<OperatorProcess>(dir, identity, extra);
  }
  std::string lease_holder() {
    const kube::Resource leases{"coordination.k8s.io", "v1", "leases", true, "Lease"};
    auto lease = try_get(leases, "longhaul-operator");
    return lease ? lease->value(json::json_pointer("/spec/holderIdentity"), std::string()) : "";
  }
  fs::path dir;
};

TEST_F(RealBinary, KilledMidFlightAndRestartedMakesNoDuplicatesAndLosesNoJobs) {
  auto op = run("a", {"--leader-elect=false"});
  for (int i = 0; i < 5; ++i) create(job_manifest("j" + std::to_string(i)));
  ASSERT_TRUE(eventually([&] {
    kube::ListOptions o;
    o.label_selector = std::string(api::kLabelJobName);
    return admin->list(kube::resources::kPods, ns, o)["items"].size() >= 5;
  })) << op->log();
  op->kill_hard();
  op = run("b", {"--leader-elect=false"});
  for (int i = 0; i < 5; ++i) {
    const std::string n = "j" + std::to_string(i);
    ASSERT_TRUE(eventually([&] { return running(n, 3, 0); })) << n << "\n" << op->log();
  }
  const auto writes = operator_writes("pods");
  expect_each_pod_created_once(writes);
  EXPECT_EQ(admin->list(kube::resources::kPods, ns, {})["items"].size(), 15u)
      << ::testing::PrintToString(writes);
}

TEST_F(RealBinary, TwoReplicasElectOneLeaderAndTheOtherTakesOverWhenItDies) {
  const std::vector<std::string> election = {"--leader-elect", "--lease-duration=2",
                                             "--renew-deadline=1.5", "--retry-period=0.2"};
  auto a = run("a", election);
  ASSERT_TRUE(eventually([&] { return lease_holder() == "a"; })) << a->log();
  auto b = run("b", election);
  ASSERT_TRUE(eventually([&] { return b->ready(); })) << b->log();
  create(job_manifest("j1"));
  ASSERT_TRUE(eventually([&] { return running("j1", 3, 0); })) << a->log();
  EXPECT_EQ(lease_holder(), "a");
  a->kill_hard();
  ASSERT_TRUE(eventually([&] { return lease_holder() == "b"; })) << b->log();
  create(job_manifest("j2"));
  ASSERT_TRUE(eventually([&] { return running("j2", 3, 0); })) << b->log();
  EXPECT_TRUE(running("j1", 3, 0));
  // Only the leader wrote: b made no pod of j1.
  const auto writes = operator_writes("pods");
  EXPECT_EQ(count(writes, "create pods/j1-", " 201"), 3u) << ::testing::PrintToString(writes);
}

}  // namespace
}  // namespace longhaul::testing
