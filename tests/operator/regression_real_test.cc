// Regression tests on the REAL API server (tests/envtest) for defects first seen there: refused
// pod creates (ResourceQuota 403, a 422 the operator's validation lets through), invalid
// TrainingJobs the API server would refuse at pod creation, a deposed leader that kept writing,
// READY after success, and the local kubelet's Nodes. The operator runs in-process (the
// Controller over a kube::HttpClient, as the binary wires it); no kubelet runs unless a test
// starts one, so pods stay Pending unless the test writes their status as a kubelet would.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/controller.h"
#include "longhaul/envtest/gtest.h"
#include "longhaul/kube/leader_election.h"
#include "longhaul/kubelet/local_kubelet.h"
#include "longhaul/testing/test_temp_dir.h"
#include "scenario.h"

namespace longhaul::envtest {
namespace {

using namespace std::chrono_literals;
namespace res = kube::resources;
using controller::Controller;
using controller::ControllerOptions;

json job_manifest(const std::string& name, int workers,
                  const json& container_patch = json::object()) {
  json container = {{"name", "trainer"}, {"image", "ghcr.io/longhaul-dev/longhaul-worker:0.1.0"}};
  container.merge_patch(container_patch);
  return longhaul::testing::training_job_manifest(name, workers, container);
}

// Polls `pred` (reads from the real server) every 100 ms until true or the deadline.
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 60s) {
  return longhaul::testing::eventually_on_server(pred, timeout, 100ms);
}

class OperatorRealTest : public RealServerTest {
 protected:
  void SetUp() override {
    RealServerTest::SetUp();
    if (IsSkipped()) return;
    ns = fresh_namespace();
    client = plane().admin_client();
    reader = plane().admin_client();
  }
  void TearDown() override {
    if (ctl) ctl->stop();
  }
  void start_operator(const std::function<void(ControllerOptions&)>& tweak = {},
                      bool start_workers = true) {
    ControllerOptions o;
    o.namespaces = {ns};
    o.workers = 2;
    o.watch_timeout = 60s;
    o.retry_base_delay = 50ms;
    o.retry_max_delay = 1s;
    if (tweak) tweak(o);
    ctl = std::make_unique<Controller>(client, nullptr, o);
    ctl->start();
    ASSERT_TRUE(ctl->wait_for_sync(30s));
    if (start_workers) ctl->start_workers();
  }
  json get_job(const std::string& name) { return reader->get(res::kTrainingJobs, ns, name); }
  api::TrainingJobStatus status(const std::string& name) {
    return api::parse_status(get_job(name).value("status", json::object()));
  }
  std::vector<json> pods(const std::string& job) {
    kube::ListOptions lo;
    lo.label_selector = std::string(api::kLabelJobName) + "=" + job;
    return reader->list(res::kPods, ns, lo)["items"].get<std::vector<json>>();
  }
  bool warned(const std::string& reason, const std::string& needle) {
    const json events = reader->list(res::kEvents, ns, {});
    for (const json& e : events["items"]) {
      if (e.value("type", "") == "Warning" && e.value("reason", "") == reason &&
          e.value("message", "").find(needle) != std::string::npos) {
        return true;
      }
    }
    return false;
  }

  std::string ns;
  std::shared_ptr<kube::HttpClient> client;  // the operator's
  std::shared_ptr<kube::HttpClient> reader;  // the test's own reads
  std::unique_ptr<Controller> ctl;
};

// A ResourceQuota 403 once left the job Pending forever with Created=True, no Warning Event
// and a log blaming RBAC. On the real server the quota refuses the second pod; the job says so,
// retries by itself, and creates the rest once the quota is raised.
TEST_F(OperatorRealTest, QuotaRefusedPodCreateIsRetriedUntilTheQuotaIsRaised) {
  json quota = {{"apiVersion", "v1"},
                {"kind", "ResourceQuota"},
                {"metadata", {{"name", "pods"}, {"namespace", ns}}},
                {"spec", {{"hard", {{"pods", "1"}}}}}};
  plane().apply(quota, ns);
  // Admission refuses every pod until the quota controller has computed the usage.
  ASSERT_TRUE(eventually([&] {
    return plane()
        .call("GET", "/api/v1/namespaces/" + ns + "/resourcequotas/pods")["status"]
        .contains("used");
  }));
  start_operator([](ControllerOptions& o) {
    o.reconciler.create_retry_base = 200ms;
    o.reconciler.create_retry_max = 1s;
  });
  client->create(res::kTrainingJobs, ns, job_manifest("q", 1));
  ASSERT_TRUE(eventually([&] {
    const api::Condition* c = api::find_condition(status("q"), api::condition::kCreated);
    return c && c->status == "False" && c->reason == "FailedCreate";
  })) << get_job("q").dump();
  const api::Condition created = *api::find_condition(status("q"), api::condition::kCreated);
  EXPECT_NE(created.message.find("exceeded quota"), std::string::npos) << created.message;
  EXPECT_EQ(created.message.find("RBAC"), std::string::npos) << created.message;
  EXPECT_TRUE(eventually([&] { return warned("FailedCreate", "exceeded quota"); }));
  EXPECT_EQ(pods("q").size(), 1u);

  quota["spec"]["hard"]["pods"] = "10";
  plane().apply(quota, ns);
  ASSERT_TRUE(eventually([&] {
    return pods("q").size() == 2 && api::condition_true(status("q"), api::condition::kCreated);
  })) << get_job("q").dump();
}

// A pod the API server refuses as invalid (here a negative runAsUser, which the operator does
// not check itself) fails the job with InvalidSpec naming the TrainingJob field.
TEST_F(OperatorRealTest, PodRefusedAsInvalidFailsTheJobNamingTheField) {
  start_operator();
  client->create(res::kTrainingJobs, ns,
                 job_manifest("bad", 1, {{"securityContext", {{"runAsUser", -1}}}}));
  ASSERT_TRUE(eventually([&] { return status("bad").phase == "Failed"; })) << get_job("bad").dump();
  const api::Condition failed = *api::find_condition(status("bad"), api::condition::kFailed);
  EXPECT_EQ(failed.reason, "InvalidSpec");
  EXPECT_NE(failed.message.find("template.spec.containers[0].securityContext.runAsUser"),
            std::string::npos)
      << failed.message;
  EXPECT_TRUE(eventually([&] { return pods("bad").empty(); })) << "pods left after the failure";
}

// What the API server would refuse at pod creation is caught before any pod is created: the
// job ends Failed/InvalidSpec naming the field, never accepted and left Pending.
TEST_F(OperatorRealTest, InvalidTemplatesFailBeforeAnyPodIsCreated) {
  struct Case {
    const char* job;
    json container_patch;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"container-name", {{"name", "Trainer_1"}}, "template.spec.containers[0].name"},
      {"port-name",
       {{"ports", {{{"name", "prometheus-metrics"}, {"containerPort", 9400}}}}},
       "template.spec.containers[0].ports[0].name"},
      {"env-name", {{"env", {{{"name", "1BAD"}, {"value", "x"}}}}}, "containers[0].env[0].name"},
      {"quantity",
       {{"resources", {{"limits", {{"memory", "2GB"}}}}}},
       "containers[0].resources.limits[memory]"},
  };
  start_operator();
  for (const Case& c : cases) {
    try {
      client->create(res::kTrainingJobs, ns, job_manifest(c.job, 1, c.container_patch));
    } catch (const kube::ApiError& e) {  // refused by the CRD: fine when it names the field
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
      continue;
    }
    ASSERT_TRUE(eventually([&] { return status(c.job).phase == "Failed"; })) << c.job;
    const api::Condition failed = *api::find_condition(status(c.job), api::condition::kFailed);
    EXPECT_EQ(failed.reason, "InvalidSpec") << c.job;
    EXPECT_NE(failed.message.find(c.field), std::string::npos) << failed.message;
    EXPECT_TRUE(pods(c.job).empty()) << c.job;
  }
}

// After success, READY showed the last incarnation ("1/2"): on the real server the printer
// column of a finished job reads 0/N.
TEST_F(OperatorRealTest, SucceededJobShowsNoReadyReplicas) {
  start_operator();
  client->create(res::kTrainingJobs, ns, job_manifest("done", 1));
  ASSERT_TRUE(eventually([&] { return pods("done").size() == 2; }));
  for (const json& p : pods("done")) {  // as a kubelet: running and ready
    client->patch(
        res::kPods, ns, p["metadata"]["name"].get<std::string>(),
        {{"status",
          {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}},
        kube::PatchType::kMerge, true);
  }
  ASSERT_TRUE(eventually([&] { return status("done").ready == "2/2"; }));
  client->patch(res::kPods, ns, "done-chief-0",
                {{"status",
                  {{"phase", "Succeeded"},
                   {"conditions", {{{"type", "Ready"}, {"status", "False"}}}},
                   {"containerStatuses",
                    {{{"name", "trainer"},
                      {"ready", false},
                      {"restartCount", 0},
                      {"image", "x"},
                      {"imageID", ""},
                      {"state", {{"terminated", {{"exitCode", 0}}}}}}}}}}},
                kube::PatchType::kMerge, true);
  ASSERT_TRUE(eventually([&] { return status("done").phase == "Succeeded"; }));
  const auto s = status("done");
  EXPECT_EQ(s.ready, "0/2");
  EXPECT_EQ(s.replica_statuses.at("Chief").succeeded, 1);
  // What `kubectl get tj` prints comes from the same field.
  const json table = json::parse(
      plane()
          .request("GET", "/apis/longhaul.dev/v1alpha1/namespaces/" + ns + "/trainingjobs/done", "",
                   "application/json", "application/json;as=Table;v=v1;g=meta.k8s.io")
          .body);
  size_t ready_column = 0;
  for (size_t i = 0; i < table["columnDefinitions"].size(); ++i) {
    if (table["columnDefinitions"][i]["name"] == "Ready") ready_column = i;
  }
  ASSERT_GT(ready_column, 0u) << table.dump();
  EXPECT_EQ(table["rows"][0]["cells"][ready_column], "0/2");
}

// A deposed leader once created 37 more pods 20 s after it lost the Lease. Here another
// candidate takes the Lease over in the middle of a 150-replica create: the old leader stops
// writing at once (at most the creates already in flight land).
TEST_F(OperatorRealTest, DeposedLeaderStopsCreatingPods) {
  kube::HttpClientOptions slow;
  slow.qps = 40;
  slow.burst = 10;
  client = std::make_shared<kube::HttpClient>(plane().admin_config(), slow);
  start_operator({}, /*start_workers=*/false);
  auto admin = plane().admin_client();
  std::atomic<bool> lost{false};
  std::atomic<size_t> pods_at_loss{0};
  kube::LeaderElectionConfig lc;
  lc.lease_namespace = ns;
  lc.lease_name = "longhaul-operator";
  lc.identity = "old-leader";
  lc.lease_duration = 3000ms;
  lc.renew_deadline = 2000ms;
  lc.retry_period = 200ms;
  lc.on_started_leading = [this] { ctl->start_workers(); };
  lc.on_stopped_leading = [&] {
    ctl->cancel_workers();
    pods_at_loss = pods("big").size();
    lost = true;
  };
  kube::LeaderElector elector(plane().admin_client(), lc);
  elector.start();
  admin->create(res::kTrainingJobs, ns, job_manifest("big", 149));
  ASSERT_TRUE(eventually([&] { return pods("big").size() >= 20; }));
  // Another replica takes the Lease (as after an expiry it observed).
  ASSERT_TRUE(eventually([&] {
    json lease = admin->get(res::kLeases, ns, "longhaul-operator");
    lease["spec"]["holderIdentity"] = "new-leader";
    lease["spec"]["renewTime"] = kube::format_micro_time(std::chrono::system_clock::now());
    lease["spec"]["leaseDurationSeconds"] = 3600;
    admin->update(res::kLeases, ns, lease);  // 409 while the old leader renews: try again
    return true;
  }));
  ASSERT_TRUE(eventually([&] { return lost.load(); }, 30s));
  ctl->stop_workers();
  const size_t after = pods("big").size();
  EXPECT_LE(after, pods_at_loss + 2) << "pods created after the loss was observed";
  EXPECT_LT(after, 150u) << "the whole job was created before the loss: inconclusive";
  elector.stop();
}

// On a real API server the local kubelet registers Ready Nodes with Leases in
// kube-node-lease (the pod garbage collector deletes pods bound to unknown nodes), binds and
// runs a pod of any namespace, and reports it Succeeded.
TEST_F(OperatorRealTest, LocalKubeletRegistersNodesAndRunsPodsOnTheRealServer) {
  const longhaul::testing::TestTempDir root("real_kubelet");
  kubelet::KubeletOptions o;
  o.root = root.path();
  o.nodes = {ns + "-node"};
  o.ns = ns;
  o.node_heartbeat = 1s;
  kubelet::LocalKubelet k(plane().admin_client(), o);
  k.start();
  ASSERT_TRUE(eventually([&] {
    const json node = client->get(res::kNodes, "", ns + "-node");
    for (const json& c : node["status"]["conditions"]) {
      if (c["type"] == "Ready" && c["status"] == "True") return true;
    }
    return false;
  })) << client->get(res::kNodes, "", ns + "-node").dump();
  // The Lease follows the Node's first status in the same heartbeat.
  EXPECT_TRUE(eventually([&] {
    return client->get(res::kLeases, "kube-node-lease", ns + "-node")["spec"]["holderIdentity"] ==
           ns + "-node";
  }));
  client->create(res::kPods, ns,
                 {{"apiVersion", "v1"},
                  {"kind", "Pod"},
                  {"metadata", {{"name", "hello"}}},
                  {"spec",
                   {{"restartPolicy", "Never"},
                    {"containers",
                     {{{"name", "main"},
                       {"image", "busybox"},
                       {"command", {"/bin/sh", "-c", "echo hello"}}}}}}}});
  EXPECT_TRUE(eventually([&] {
    return client->get(res::kPods, ns, "hello")["status"].value("phase", "") == "Succeeded";
  })) << client->get(res::kPods, ns, "hello").dump();
  EXPECT_EQ(k.resolve_pod("hello").first, ns);
  k.stop();
}

}  // namespace
}  // namespace longhaul::envtest
