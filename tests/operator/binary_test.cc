// Tests of the longhaul-operator binary as a process against the fake API server: metrics and
// probes, graceful SIGTERM, SIGKILL mid-flight and restart, and two replicas electing a leader.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include <gtest/gtest.h>
#include <signal.h>

#include "harness.h"
#include "longhaul/testing/eventually.h"
#include "longhaul/testing/loopback.h"
#include "longhaul/testing/temp_dir.h"
#include "operator_process.h"

namespace longhaul::testing {
namespace {

namespace fs = std::filesystem;

// For state outside the fake server (processes, ports), which has no change hook to wait on.
using longhaul::testing::eventually;

class Binary : public ::testing::Test {
 protected:
  void SetUp() override {
    server.start();
    server.write_kubeconfig(dir / "kubeconfig", "default");
    kubelet = std::make_unique<FakeKubelet>(server);
  }
  void TearDown() override {
    kubelet->stop();
    server.stop();
  }
  bool wait(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
    return server.wait_for(pred, timeout);
  }
  bool running(const std::string& n, size_t pods, int64_t attempt) {
    return pods_running_at(server, n, pods, attempt) && job_status(server, n).phase == "Running";
  }
  std::string lease_holder() {
    auto lease = server.try_get("leases.coordination.k8s.io", "default", "longhaul-operator");
    return lease ? lease->value("spec", json::object()).value("holderIdentity", "") : "";
  }

  longhaul::testing::TempDir dir{"longhaul-op"};
  fakeapi::FakeApiServer server{server_options()};
  std::unique_ptr<FakeKubelet> kubelet;
};

TEST_F(Binary, ServesMetricsAndProbesReconcilesAndStopsOnSigterm) {
  OperatorProcess op(dir, "a", {"--leader-elect=false"});
  ASSERT_TRUE(eventually([&] { return op.health("/healthz") == 200; }, 10s)) << op.log();
  ASSERT_TRUE(eventually([&] { return op.health("/readyz") == 200; }, 10s)) << op.log();
  server.create(kJobs, "default", job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); })) << op.log();
  ASSERT_TRUE(eventually(
      [&] {
        return op.metrics().find("longhaul_operator_jobs{phase=\"Running\"} 1") !=
               std::string::npos;
      },
      10s))
      << op.metrics();
  const std::string m = op.metrics();
  for (const char* name :
       {"longhaul_operator_reconciles_total{result=\"success\"}",
        "longhaul_operator_reconcile_duration_seconds_bucket",
        "longhaul_operator_api_requests_total{", "verb=\"create\"",
        "longhaul_operator_workqueue_depth", "longhaul_operator_workqueue_latency_seconds_count",
        "longhaul_operator_is_leader 1", "longhaul_operator_build_info{version=\"0.1.0\"} 1"}) {
    EXPECT_NE(m.find(name), std::string::npos) << name;
  }
  // Declared from the start (no recovery yet), so dashboards and alerts find the series.
  EXPECT_NE(m.find("longhaul_operator_recovery_seconds_count 0\n"), std::string::npos) << m;
  // The operator's own time per reconcile and its API latency were observed (what
  // bench/operator_bench reports), not merely declared.
  for (const char* unobserved : {"longhaul_operator_reconcile_cpu_seconds_count 0\n",
                                 "longhaul_operator_api_request_duration_seconds_count 0\n"}) {
    EXPECT_EQ(m.find(unobserved), std::string::npos) << m;
    EXPECT_NE(m.find(std::string(unobserved).substr(0, std::strlen(unobserved) - 3)),
              std::string::npos)
        << m;
  }
  op.kill(SIGTERM);
  EXPECT_EQ(op.wait_exit(15s), 0) << op.log();
  EXPECT_NE(op.log().find("longhaul-operator stopped"), std::string::npos);
}

// The per-job failure budget as Prometheus scrapes it: a retryable failure shows as spent against
// the job's backoffLimit, and the job's series leave the scrape with the job.
TEST_F(Binary, ExportsEachJobsFailureBudgetAndDropsItWithTheJob) {
  OperatorProcess op(dir, "a", {"--leader-elect=false"});
  json job = job_manifest("j");
  job["spec"]["runPolicy"] = {{"backoffLimit", 3},
                              {"backoff", {{"initialSeconds", 0}, {"maxSeconds", 0}}}};
  server.create(kJobs, "default", job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); })) << op.log();
  const std::string failures = R"(longhaul_operator_job_failures{name="j",namespace="default"} )";
  const std::string limit = R"(longhaul_operator_job_backoff_limit{name="j",namespace="default"} )";
  ASSERT_TRUE(
      eventually([&] { return op.metrics().find(failures + "0\n") != std::string::npos; }, 10s))
      << op.metrics();
  EXPECT_NE(op.metrics().find(limit + "3\n"), std::string::npos) << op.metrics();
  fail_pod(server, "j-worker-0", 137);
  ASSERT_TRUE(wait([&] { return job_status(server, "j").failure_count == 1; })) << op.log();
  EXPECT_TRUE(
      eventually([&] { return op.metrics().find(failures + "1\n") != std::string::npos; }, 10s))
      << op.metrics();
  server.remove(kJobs, "default", "j");
  EXPECT_TRUE(
      eventually([&] { return op.metrics().find(R"(name="j")") == std::string::npos; }, 10s))
      << "the deleted job's series stay: " << op.metrics();
}

// Regression (#23): connections held open without a request (anything in the pod network can
// hold them) starved the metrics endpoint, whose server took two at a time and let each sit idle
// for 30 s. With 500 held on each of /metrics and the probe port, a scrape and the probes are
// still answered and SIGTERM still ends the operator.
TEST_F(Binary, HeldOpenConnectionsStarveNeitherMetricsNorProbesNorTheStop) {
  raise_open_files_limit();
  OperatorProcess op(dir, "a", {"--leader-elect=false"});
  ASSERT_TRUE(eventually([&] { return op.ready(); }, 10s)) << op.log();
  HeldConnections on_metrics(op.metrics_port(), 500);
  HeldConnections on_probes(op.health_port(), 500);
  ASSERT_EQ(on_metrics.size() + on_probes.size(), 1000u);
  // http_get gives up on a reply that stalls for 5 s: half of Prometheus's scrape timeout.
  EXPECT_NE(op.metrics().find("longhaul_operator_is_leader 1"), std::string::npos) << op.log();
  EXPECT_EQ(op.health("/healthz"), 200);
  EXPECT_EQ(op.health("/readyz"), 200);
  op.kill(SIGTERM);
  EXPECT_EQ(op.wait_exit(15s), 0) << op.log();
}

TEST_F(Binary, KilledMidFlightAndRestartedMakesNoDuplicatesAndLosesNoJobs) {
  auto op =
      std::make_unique<OperatorProcess>(dir, "a", std::vector<std::string>{"--leader-elect=false"});
  for (int i = 0; i < 5; ++i)
    server.create(kJobs, "default", job_manifest("j" + std::to_string(i)));
  ASSERT_TRUE(wait([&] {
    return server.count_requests({.verb = "create", .resource = "pods"}) >= 5;
  })) << op->log();
  op->kill(SIGKILL);
  op->wait_exit(10s);
  op.reset();
  op =
      std::make_unique<OperatorProcess>(dir, "b", std::vector<std::string>{"--leader-elect=false"});
  for (int i = 0; i < 5; ++i) {
    const std::string n = "j" + std::to_string(i);
    ASSERT_TRUE(wait([&] { return running(n, 3, 0); })) << n << "\n" << op->log();
  }
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods", .status = 201}), 15u);
  EXPECT_EQ(server.list("pods").size(), 15u);
}

// Regression: --log-level info did not override LONGHAUL_LOG_LEVEL=debug (only the levels other
// than info were applied), so an operator told to log at info went on logging debug records.
TEST_F(Binary, LogLevelFlagWinsOverTheEnvironment) {
  const char* before = std::getenv("LONGHAUL_LOG_LEVEL");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("LONGHAUL_LOG_LEVEL", "debug", 1);
  auto debug = std::make_unique<OperatorProcess>(dir, "debug",
                                                 std::vector<std::string>{"--leader-elect=false"});
  auto info = std::make_unique<OperatorProcess>(
      dir, "info", std::vector<std::string>{"--leader-elect=false", "--log-level=info"});
  if (saved) {
    ::setenv("LONGHAUL_LOG_LEVEL", saved->c_str(), 1);
  } else {
    ::unsetenv("LONGHAUL_LOG_LEVEL");
  }
  // The environment alone gives debug records (the informers' "informer listed").
  ASSERT_TRUE(
      eventually([&] { return debug->log().find("informer listed") != std::string::npos; }, 10s))
      << debug->log();
  debug->kill_hard();
  // With --log-level info the same operator, having listed and reconciled a job, logged none.
  server.create(kJobs, "default", job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); })) << info->log();
  const std::string log = info->log();
  EXPECT_NE(log.find("INFO"), std::string::npos) << log;
  EXPECT_EQ(log.find("informer listed"), std::string::npos) << log;
  EXPECT_EQ(log.find("DEBUG"), std::string::npos) << log;
}

TEST_F(Binary, TwoReplicasElectOneLeaderAndTheOtherTakesOverWhenItDies) {
  const std::vector<std::string> election = {"--lease-duration=2", "--renew-deadline=1.5",
                                             "--retry-period=0.2"};
  auto a = std::make_unique<OperatorProcess>(dir, "a", election);
  ASSERT_TRUE(wait([&] { return lease_holder() == "a"; }, 10s)) << a->log();
  auto b = std::make_unique<OperatorProcess>(dir, "b", election);
  ASSERT_TRUE(eventually([&] { return b->health("/readyz") == 200; }, 10s)) << b->log();
  server.create(kJobs, "default", job_manifest("j1"));
  ASSERT_TRUE(wait([&] { return running("j1", 3, 0); }));
  EXPECT_EQ(lease_holder(), "a");
  // The follower is ready (warm caches) but does not reconcile.
  const std::string bm = b->metrics();
  EXPECT_NE(bm.find("longhaul_operator_is_leader 0"), std::string::npos) << bm;
  EXPECT_EQ(bm.find("longhaul_operator_reconciles_total{"), std::string::npos) << bm;

  a->kill(SIGKILL);
  a->wait_exit(10s);
  ASSERT_TRUE(wait([&] { return lease_holder() == "b"; }, 15s)) << b->log();
  server.create(kJobs, "default", job_manifest("j2"));
  ASSERT_TRUE(wait([&] { return running("j2", 3, 0); })) << b->log();
  EXPECT_TRUE(running("j1", 3, 0));
  EXPECT_NE(b->metrics().find("longhaul_operator_is_leader 1"), std::string::npos);
}

TEST_F(Binary, SigtermReleasesTheLeaseForAFastTakeover) {
  OperatorProcess a(dir, "a", {"--lease-duration=30", "--retry-period=0.2"});
  ASSERT_TRUE(wait([&] { return lease_holder() == "a"; }, 10s)) << a.log();
  a.kill(SIGTERM);
  EXPECT_EQ(a.wait_exit(15s), 0) << a.log();
  EXPECT_EQ(lease_holder(), "");
  OperatorProcess b(dir, "b", {"--lease-duration=30", "--retry-period=0.2"});
  EXPECT_TRUE(wait([&] { return lease_holder() == "b"; }, 5s)) << "b waited for a's 30 s lease";
}

// A 5000-replica job once took 7 min 42 s to shut down (the chart's grace is 30 s): the create
// loop never checked for a stop. SIGTERM in the middle of a large create now stops the writes,
// releases the Lease and exits well within the grace period.
TEST_F(Binary, SigtermDuringALargeCreateExitsWithinTheGraceAndReleasesTheLease) {
  kubelet->set_auto_run(false);
  OperatorProcess op(dir, "a", {"--qps=20", "--burst=20", "--retry-period=0.2"});
  ASSERT_TRUE(wait([&] { return lease_holder() == "a"; }, 10s)) << op.log();
  server.create(kJobs, "default", job_manifest("big", 1000));
  // At 20 requests/s the 1001 creates would take about 50 s.
  ASSERT_TRUE(wait(
      [&] { return server.count_requests({.verb = "create", .resource = "pods"}) >= 40; }, 30s))
      << op.log();
  op.kill(SIGTERM);
  EXPECT_EQ(op.wait_exit(30s), 0) << "not stopped within the chart's 30 s grace\n" << op.log();
  EXPECT_EQ(lease_holder(), "") << op.log();
  EXPECT_LT(server.list("pods").size(), 500u) << "the create loop ran on after SIGTERM";
}

}  // namespace
}  // namespace longhaul::testing
