// Scenario tests of the TrainingJob controller over real HTTP: the fake API server, the real
// HttpClient and informers, the controller loop with its reconciler, and a simulated kubelet.
// This file is the fake backend of the shared scenarios (backend_scenarios.cc, also run on the
// real server) and the scenarios only the fake server can stage: injected faults (5xx, 403
// quota), request counts per status, a lost Lease mid-create, restarts timed to the request log.
#include <gtest/gtest.h>

#include "backend_scenario.h"
#include "harness.h"
#include "longhaul/base/http_server.h"
#include "longhaul/base/mutex.h"
#include "longhaul/controller/controller.h"
#include "longhaul/kube/leader_election.h"

namespace longhaul::testing {
namespace {

using controller::Controller;
using controller::ControllerOptions;

// The fake API server as the backend of the shared scenarios (backend_scenarios.cc): its own
// server per test with a simulated kubelet, namespace "default", and no volume provisioner
// (claims stay Pending, as on the real test server).
class FakeBackend : public ScenarioBackend {
 public:
  FakeBackend() : server_(options()) {
    server_.start();
    admin_ = make_client(server_);
    kubelet_ = std::make_unique<FakeKubelet>(server_);
  }
  static fakeapi::Options options() {
    fakeapi::Options o = server_options();
    o.bind_persistent_volume_claims = false;
    return o;
  }

  const std::string& ns() const override { return ns_; }
  std::shared_ptr<kube::HttpClient> admin() override { return admin_; }
  std::shared_ptr<kube::HttpClient> operator_client() override { return make_client(server_); }
  void configure(ControllerOptions&) override {}
  void terminate(const std::string& pod, int exit_code) override {
    fail_pod(server_, pod, exit_code);
  }
  void preempt(const std::string& pod) override { preempt_pod(server_, pod); }
  void set_stuck(const std::string& pod, bool stuck) override { kubelet_->set_stuck(pod, stuck); }
  // Every write the server answered ("METHOD path"): the kubelet writes to the store directly,
  // and the scenarios make none of their own while they count.
  std::vector<std::string> take_operator_writes() override { return take_writes(server_); }
  std::chrono::milliseconds default_timeout() const override { return 20s; }
  std::chrono::milliseconds poll_interval() const override { return 10ms; }
  std::chrono::seconds timestamp_precision() const override { return 0s; }
  int preemption_rounds() const override { return 10; }
  void stop() override {
    kubelet_->stop();
    admin_->close();
    server_.stop();
  }

 private:
  const std::string ns_ = "default";
  fakeapi::FakeApiServer server_;
  std::shared_ptr<kube::HttpClient> admin_;
  std::unique_ptr<FakeKubelet> kubelet_;
};

}  // namespace

std::unique_ptr<ScenarioBackend> make_scenario_backend(std::string*) {
  return std::make_unique<FakeBackend>();
}

namespace {

class Scenario : public FakeServerScenario {
 protected:
  bool wait(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
    return server.wait_for(pred, timeout);
  }
  // For state outside the fake server (the operator's reconcile counter), which wait() would
  // only re-check on the server's next change: polled every 5 ms until the deadline.
  bool wait_local(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }
  void create(const json& job) { server.create(kJobs, "default", job); }
  api::TrainingJobStatus status(const std::string& name = "j") { return job_status(server, name); }
  bool running(const std::string& name, size_t pods, int64_t attempt) {
    return pods_running_at(server, name, pods, attempt) && status(name).phase == "Running";
  }
  std::vector<std::string> event_reasons() {
    std::vector<std::string> out;
    for (const json& e : server.list("events", "default")) out.push_back(e.value("reason", ""));
    return out;
  }
  bool saw_event(const std::string& reason) {
    const auto r = event_reasons();
    return std::find(r.begin(), r.end(), reason) != r.end();
  }
};

// Regression (#27): the simulated kubelet patched status by name alone, so a status meant for a
// deleted pod could land on a pod re-created under the same name. Its writes carry the uid.
TEST_F(Scenario, KubeletStatusAimedAtADeletedPodNeverReachesItsSameNameSuccessor) {
  kubelet->set_auto_run(false);
  const json pod = {{"apiVersion", "v1"},
                    {"kind", "Pod"},
                    {"metadata", {{"name", "p"}, {"namespace", "default"}}},
                    {"spec", {{"containers", {{{"name", "trainer"}, {"image", "lh"}}}}}}};
  const std::string old_uid = server.create("pods", "default", pod)["metadata"]["uid"];
  server.finalize_pod_deletion("default", "p");
  const std::string new_uid = server.create("pods", "default", pod)["metadata"]["uid"];
  ASSERT_NE(old_uid, new_uid);
  EXPECT_THROW(patch_pod_status(server, "default", "p", old_uid, {{"phase", "Failed"}}),
               fakeapi::StatusError);
  EXPECT_NE(server.get("pods", "default", "p").value(json::json_pointer("/status/phase"), ""),
            "Failed");
  patch_pod_status(server, "default", "p", new_uid, {{"phase", "Failed"}});
  EXPECT_EQ(server.get("pods", "default", "p")["status"]["phase"], "Failed");
}

TEST_F(Scenario, ChiefExit1FailsTheJobNamingPodAndCode) {
  start_operator();
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  fail_pod(server, "j-chief-0", 1);
  ASSERT_TRUE(wait([&] { return status().phase == "Failed"; }));
  const auto s = status();
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason, "PermanentExitCode");
  EXPECT_NE(failed->message.find("default/j-chief-0"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find("exited with code 1"), std::string::npos) << failed->message;
  // cleanPodPolicy Running: the running workers go, the failed chief stays for its logs.
  ASSERT_TRUE(wait([&] { return job_pods(server, "j").size() == 1; }));
  EXPECT_EQ(job_pods(server, "j")[0]["metadata"]["name"], "j-chief-0");
}

// restartScope Replica over HTTP with informers: each preemption (a worker, then the chief)
// re-creates only the lost pod; the survivors keep their pods; the status counts the recoveries.
TEST_F(Scenario, ReplicaScopeReplacesOnlyThePreemptedPod) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["restartScope"] = "Replica";
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  int n = 0;
  for (const std::string lost : {"j-worker-1", "j-chief-0"}) {
    ++n;
    std::map<std::string, std::string> uids;
    for (const json& p : job_pods(server, "j")) uids[p["metadata"]["name"]] = p["metadata"]["uid"];
    preempt_pod(server, lost);
    ASSERT_TRUE(wait([&] {
      const auto s = status();
      const auto* c = api::find_condition(s, api::condition::kRecovering);
      if (c == nullptr || c->status != "False" || s.recoveries != n) return false;
      const auto pods = job_pods(server, "j");
      if (pods.size() != 3) return false;
      for (const json& p : pods) {
        if (p["metadata"].contains("deletionTimestamp")) return false;
        if (p.value("status", json::object()).value("phase", "") != "Running") return false;
      }
      return true;
    })) << lost;
    for (const json& p : job_pods(server, "j")) {
      const std::string name = p["metadata"]["name"];
      if (name == lost) {
        EXPECT_NE(p["metadata"]["uid"], uids.at(name));
      } else {
        EXPECT_EQ(p["metadata"]["uid"], uids.at(name)) << name << " was re-created";
      }
    }
  }
  const auto s = status();
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(s.preemption_count, 2);
  EXPECT_EQ(s.failure_count, 0);
  EXPECT_TRUE(s.last_recovery_milliseconds.has_value());
  EXPECT_TRUE(saw_event("ReplicasRecovered"));
}

TEST_F(Scenario, OperatorRestartedMidFlightMakesNoDuplicatesAndLosesNoJobs) {
  start_operator();
  for (int i = 0; i < 5; ++i) create(job_manifest("j" + std::to_string(i)));
  // Stop as soon as the first pods exist: some jobs are half-created.
  ASSERT_TRUE(
      wait([&] { return server.count_requests({.verb = "create", .resource = "pods"}) >= 4; }));
  ctl->stop();
  ctl.reset();
  preempt_pod(server, job_pods(server, "j0").empty() ? "j1-chief-0" : "j0-chief-0");
  start_operator();
  for (int i = 0; i < 5; ++i) {
    const std::string n = "j" + std::to_string(i);
    ASSERT_TRUE(wait([&] {
      return status(n).phase == "Running" && job_pods(server, n).size() == 3;
    })) << n;
  }
  // Every pod name was created once per incarnation: 15 pods, plus the pods of the restarted
  // group that existed before the restart (the stop may land mid-pass, after the chief's
  // create and before its workers'), and no create was ever refused as a duplicate.
  const size_t created =
      server.count_requests({.verb = "create", .resource = "pods", .status = 201});
  int restarts = 0;
  for (int i = 0; i < 5; ++i) restarts += status("j" + std::to_string(i)).restart_count;
  EXPECT_LE(restarts, 1);
  EXPECT_GE(created, 15u + restarts);
  EXPECT_LE(created, 15u + 3u * restarts);
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods", .status = 409}), 0u);
}

// restartScope Replica, the operator restarted mid-recovery, right after the decision was
// committed: the new operator re-derives the recovery from the job's status, creates the
// replacement once, touches no survivor, and still measures the recovery.
TEST_F(Scenario, OperatorRestartedMidRecoveryCreatesTheReplacementOnce) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["restartScope"] = "Replica";
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  std::map<std::string, std::string> uids;
  for (const json& p : job_pods(server, "j")) uids[p["metadata"]["name"]] = p["metadata"]["uid"];
  preempt_pod(server, "j-worker-1");
  // Stopped as soon as the decision is committed: the old pod's delete and the replacement's
  // create may or may not have happened yet.
  ASSERT_TRUE(wait([&] { return api::condition_true(status(), api::condition::kRecovering); }));
  ctl->stop();
  ctl.reset();
  start_operator();
  ASSERT_TRUE(wait([&] {
    const auto s = status();
    const auto* c = api::find_condition(s, api::condition::kRecovering);
    if (c == nullptr || c->status != "False" || s.recoveries != 1) return false;
    const auto pods = job_pods(server, "j");
    if (pods.size() != 3) return false;
    for (const json& p : pods) {
      if (p["metadata"].contains("deletionTimestamp")) return false;
      if (p.value("status", json::object()).value("phase", "") != "Running") return false;
    }
    return true;
  }));
  for (const json& p : job_pods(server, "j")) {
    const std::string name = p["metadata"]["name"];
    if (name != "j-worker-1") {
      EXPECT_EQ(p["metadata"]["uid"], uids.at(name)) << name;
    }
  }
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods", .status = 201}), 4u);
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods", .status = 409}), 0u);
  EXPECT_EQ(server.count_requests({.verb = "delete", .resource = "pods"}), 1u);
  EXPECT_TRUE(status().last_recovery_milliseconds.has_value());
}

TEST_F(Scenario, TwentyPercentOfRequestsFailingStillConverges) {
  fakeapi::FaultRule rule;
  rule.status = 500;
  rule.probability = 0.2;
  server.add_fault(rule);
  start_operator();
  for (int i = 0; i < 3; ++i) create(job_manifest("j" + std::to_string(i)));
  for (int i = 0; i < 3; ++i) {
    const std::string n = "j" + std::to_string(i);
    ASSERT_TRUE(wait([&] { return running(n, 3, 0); }, 30s)) << n;
  }
  preempt_pod(server, "j1-worker-0");
  ASSERT_TRUE(wait([&] { return running("j1", 3, 1) && status("j1").preemption_count == 1; }, 30s));
  EXPECT_GT(server.injected_fault_count(), 0u);
  EXPECT_EQ(status("j1").failure_count, 0);
}

// A ResourceQuota 403 on pod create once left the job Pending forever with Created=True, no
// Warning Event, and a log blaming RBAC. Now the job retries by itself (no pod event arrives:
// the kubelet is idle) until the quota allows, and says why meanwhile.
TEST_F(Scenario, QuotaRefusedPodCreateIsRetriedUntilTheQuotaAllows) {
  kubelet->set_auto_run(false);
  const int quota = server.add_fault(
      {.verb = "create",
       .path_regex = "/pods$",
       .status = 403,
       .reason = "Forbidden",
       .message = "pods \"j-worker-1\" is forbidden: exceeded quota: compute, requested: pods=1, "
                  "used: pods=2, limited: pods=2"});
  start_operator([](ControllerOptions& o) {
    o.reconciler.create_retry_base = 100ms;
    o.reconciler.create_retry_max = 400ms;
  });
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] {
    return server.count_requests({.verb = "create", .resource = "pods", .injected = true}) >= 4;
  })) << "refused creates were not retried";
  const auto s = status();
  const api::Condition* created = api::find_condition(s, api::condition::kCreated);
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(created->status, "False");
  EXPECT_EQ(created->reason, "FailedCreate");
  EXPECT_NE(created->message.find("exceeded quota: compute"), std::string::npos)
      << created->message;
  EXPECT_EQ(created->message.find("RBAC"), std::string::npos) << created->message;
  bool warned = false;
  for (const json& e : server.list("events", "default")) {
    warned |= e.value("type", "") == "Warning" && e.value("reason", "") == "FailedCreate" &&
              e.value("message", "").find("exceeded quota") != std::string::npos;
  }
  EXPECT_TRUE(warned) << "no Warning Event FailedCreate with the API server's message";

  server.remove_fault(quota);  // the quota is raised
  kubelet->set_auto_run(true);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); })) << status().phase;
  EXPECT_TRUE(api::condition_true(status(), api::condition::kCreated));
}

// A deposed leader once created 37 more pods of a 150-replica job 20 s after it lost the Lease.
// Losing the Lease in the middle of a large create now stops the writes: at most the requests
// already in flight land after the loss is observed, none after the workers are drained.
TEST_F(Scenario, LostLeaseMidCreateStopsWrites) {
  kubelet->set_auto_run(false);
  // A rate-limited client, so that the create runs long enough to lose the Lease during it.
  kube::ClusterConfig cfg;
  cfg.server = server.url();
  kube::HttpClientOptions slow;
  slow.qps = 50;
  slow.burst = 10;
  client->close();
  client = std::make_shared<kube::HttpClient>(cfg, slow);
  auto lease_client = make_client(server);

  std::atomic<size_t> creates_at_loss{0};
  std::atomic<bool> lost{false};
  ControllerOptions o;
  o.workers = 2;
  ctl = std::make_unique<Controller>(client, nullptr, o);
  ctl->start();
  ASSERT_TRUE(ctl->wait_for_sync(10s));
  kube::LeaderElectionConfig lc;
  lc.lease_namespace = "default";
  lc.lease_name = "longhaul-operator";
  lc.identity = "a";
  lc.lease_duration = 1500ms;
  lc.renew_deadline = 1000ms;
  lc.retry_period = 100ms;
  lc.on_started_leading = [this] { ctl->start_workers(); };
  lc.on_stopped_leading = [&] {
    ctl->cancel_workers();
    creates_at_loss = server.count_requests({.verb = "create", .resource = "pods"});
    lost = true;
  };
  kube::LeaderElector elector(lease_client, lc);
  elector.start();
  create(job_manifest("big", 300));
  ASSERT_TRUE(
      wait([&] { return server.count_requests({.verb = "create", .resource = "pods"}) >= 30; }));
  server.add_fault({.path_regex = "/leases", .status = 500});  // renewals fail from now on
  ASSERT_TRUE(wait_local([&] { return lost.load(); }));
  ctl->stop_workers();
  const size_t after = server.count_requests({.verb = "create", .resource = "pods"});
  // A worker's pod creates go out in batches of up to 16 at once (the reconciler's
  // kMaxParallelPodWrites): what was sent before the cancel, and had not reached the server when
  // the loss was counted, may still land; nothing after it.
  EXPECT_LE(after, creates_at_loss + o.workers * 16) << "writes after the loss was observed";
  EXPECT_LT(after, 301u) << "the whole job was created: the Lease was lost too late to tell";
  elector.stop();
  server.clear_faults();
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods"}), after);
  lease_client->close();
}

// The chief's training progress over real HTTP: the operator reads the chief's metrics port (a
// loopback server standing in for longhaul-worker's /metrics), writes status.progress at most
// once per progressIntervalSeconds, and keeps it, without an error, once the chief is
// unreachable.
TEST_F(Scenario, ChiefProgressReachesStatusRateLimitedAndSurvivesAnUnreachableChief) {
  struct {
    Mutex mu;
    int64_t step GUARDED_BY(mu) = 1200;
    bool moving GUARDED_BY(mu) = false;  // each read finds the chief 7 steps further
  } metrics;
  http::Server chief("chief metrics", "127.0.0.1", 0, [&](std::string_view, std::string_view) {
    MutexLock lock(metrics.mu);
    if (metrics.moving) metrics.step += 7;
    return http::Response{200, "text/plain; version=0.0.4",
                          "longhaul_train_global_step{rank=\"0\"} " + std::to_string(metrics.step) +
                              "\nlonghaul_train_max_steps{rank=\"0\"} 5000\n"
                              "longhaul_checkpoint_last_step{rank=\"0\"} 1000\n"
                              "longhaul_checkpoint_last_timestamp_seconds{rank=\"0\"} "
                              "1763730000\n"};
  });
  chief.start();
  std::atomic<int> errors{0};
  start_operator([&](ControllerOptions& o) {
    o.on_reconcile = [&](std::string_view result, double) {
      ++reconciles;
      if (result == "error") ++errors;
    };
  });
  json job = job_manifest("j", 1);
  job["spec"]["progressIntervalSeconds"] = 5;
  job["spec"]["replicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["ports"] = {
      {{"name", "metrics"}, {"containerPort", chief.port()}}};
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 2, 0); }));
  server.patch_status("pods", "default", "j-chief-0", {{"podIP", "127.0.0.1"}});

  // Read as soon as the chief has an IP, without waiting for the interval.
  ASSERT_TRUE(wait([&] {
    const auto p = status().progress;
    return p && p->steps == "1200/5000";
  })) << api::to_json(status()).dump();
  const api::TrainingProgress first = *status().progress;
  EXPECT_EQ(first.last_checkpoint_step, 1000);
  EXPECT_EQ(first.last_checkpoint_time, "2025-11-21T13:00:00Z");
  const fakeapi::RequestMatch status_writes{
      .verb = "update", .resource = kJobs, .subresource = "status"};
  const size_t writes_before = server.count_requests(status_writes);

  // From now on the chief has moved at every read; status follows once per interval.
  {
    MutexLock lock(metrics.mu);
    metrics.moving = true;
  }
  ASSERT_TRUE(wait([&] {
    const auto p = status().progress;
    return p && p->observed_time != first.observed_time;
  })) << api::to_json(status()).dump();
  const api::TrainingProgress second = *status().progress;
  EXPECT_GT(second.step, first.step);
  EXPECT_GE(api::parse_time(second.observed_time) - api::parse_time(first.observed_time), 5s);
  EXPECT_EQ(server.count_requests(status_writes) - writes_before, 1u)
      << "a chief that moves at every read costs one status write per interval";

  // The chief becomes unreachable: reads fail, nothing is written, no reconcile errs, and the
  // last progress stays. Two reads after the stop need at least 5 s; wait for three rounds of
  // the interval's reconciles.
  chief.stop();
  const size_t writes_at_stop = server.count_requests(status_writes);
  api::TrainingJobStatus kept = status();
  const int reconciles_at_stop = reconciles.load();
  ASSERT_TRUE(wait_local([&] { return reconciles.load() >= reconciles_at_stop + 3; }, 60s));
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(server.count_requests(status_writes), writes_at_stop);
  EXPECT_EQ(status().progress, kept.progress);
  EXPECT_EQ(status().phase, "Running");
}

}  // namespace
}  // namespace longhaul::testing
