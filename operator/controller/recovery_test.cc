// restartScope Replica against the in-memory client, with a controllable clock: a lost replica is
// re-created alone (same name, rank and LONGHAUL_RESTART_ATTEMPT), the survivors are never
// touched, the job reports the recovery (condition Recovering, recoveries, the measured time,
// Events, the metric callback), and the budget rules and the Group fallback hold.
#include <gtest/gtest.h>

#include "longhaul/controller/reconciler.h"
#include "longhaul/controller/recovery_policy.h"
#include "reconciler_harness.h"

namespace longhaul::controller {
namespace {

namespace res = kube::resources;
using std::chrono::seconds;

// A chief and two workers; restartScope left to its default (Replica).
json replica_spec() {
  return json::parse(R"({
    "replicaSpecs": {
      "Chief": {"template": {"spec": {"containers": [{"name": "trainer", "image": "lh"}]}}},
      "Worker": {"replicas": 2,
                 "template": {"spec": {"containers": [{"name": "trainer", "image": "lh"}]}}}
    },
    "runPolicy": {"backoffLimit": 10, "backoff": {"initialSeconds": 10, "maxSeconds": 60},
                  "nodeLostTimeoutSeconds": 30}
  })");
}

class RecoveryTest : public testing::ReconcilerHarness {
 protected:
  RecoveryTest() { reconciler = make_reconciler(); }

  std::unique_ptr<Reconciler> make_reconciler() {
    ReconcilerOptions o = base_options();
    o.on_recovery = [this](double s) { recovery_seconds.push_back(s); };
    return std::make_unique<Reconciler>(client, nullptr, &events, o);
  }
  std::string env(const std::string& name, const std::string& var) {
    const json p = pod(name);
    for (const json& e : p["spec"]["containers"][0]["env"]) {
      if (e["name"] == var) return e["value"];
    }
    return "";
  }
  void start_running() {
    create_job(replica_spec());
    settle();
    run_all();
    settle();
    ASSERT_EQ(status().phase, "Running");
  }
  std::map<std::string, std::string> uids() {
    std::map<std::string, std::string> out;
    for (const std::string& n : pod_names()) out[n] = uid(n);
    return out;
  }
  // Every pod but `lost` kept its uid (never deleted nor re-created).
  void expect_survivors_untouched(const std::map<std::string, std::string>& before,
                                  const std::string& lost) {
    for (const auto& [name, u] : before) {
      if (name == lost) continue;
      ASSERT_TRUE(client.has(res::kPods, "ns", name)) << name;
      EXPECT_EQ(uid(name), u) << name << " was re-created";
    }
  }
  const api::Condition* recovering() {
    static api::TrainingJobStatus s;
    s = status();
    return api::find_condition(s, api::condition::kRecovering);
  }

  std::vector<double> recovery_seconds;
};

TEST_F(RecoveryTest, PreemptedWorkerIsReplacedAloneAndTheRecoveryIsMeasured) {
  start_running();
  const auto before = uids();
  client.reset_counts();
  preempt("j-worker-1");
  settle();
  // Only the lost pod was deleted and re-created, under the same name and rank, with the group's
  // rendezvous attempt (0) and a new incarnation.
  EXPECT_EQ(client.writes_of("delete", "pods"), 1);
  EXPECT_EQ(client.writes_of("create", "pods"), 1);
  expect_survivors_untouched(before, "j-worker-1");
  EXPECT_NE(uid("j-worker-1"), before.at("j-worker-1"));
  EXPECT_EQ(attempt("j-worker-1"), "1");
  EXPECT_EQ(env("j-worker-1", "LONGHAUL_RESTART_ATTEMPT"), "0");
  EXPECT_EQ(env("j-worker-1", "LONGHAUL_RANK"), "2");
  auto s = status();
  EXPECT_EQ(s.phase, "Running") << "the survivors keep training";
  EXPECT_EQ(s.preemption_count, 1);
  EXPECT_EQ(s.failure_count, 0) << "a preemption spends no budget";
  EXPECT_EQ(s.recoveries, 1);
  ASSERT_NE(recovering(), nullptr);
  EXPECT_EQ(recovering()->status, "True");
  EXPECT_EQ(recovering()->reason, api::reason::kPreempted);
  EXPECT_NE(recovering()->message.find("j-worker-1"), std::string::npos);
  EXPECT_EQ(s.recovering_since, "2026-11-21T13:00:00.000000Z");
  EXPECT_EQ(events.count(api::reason::kPreempted), 1);

  // The replacement runs 4.25 s after the fault was observed: the group is whole again.
  now += std::chrono::milliseconds(4250);
  run_all();
  settle();
  s = status();
  EXPECT_EQ(recovering()->status, "False");
  EXPECT_EQ(recovering()->reason, api::reason::kReplicasRecovered);
  EXPECT_EQ(s.last_recovery_milliseconds, 4250);
  EXPECT_TRUE(s.recovering_since.empty());
  EXPECT_EQ(recovery_seconds, std::vector<double>{4.25});
  EXPECT_EQ(events.count(api::reason::kReplicasRecovered), 1);
  EXPECT_EQ(s.ready, "3/3");

  // Converged: nothing is written any more.
  client.reset_counts();
  for (int i = 0; i < 3; ++i) reconcile();
  EXPECT_EQ(client.writes(), 0);
}

TEST_F(RecoveryTest, PreemptedChiefIsReplacedAloneAndStaysTheChief) {
  start_running();
  const auto before = uids();
  preempt("j-chief-0");
  settle();
  expect_survivors_untouched(before, "j-chief-0");
  EXPECT_NE(uid("j-chief-0"), before.at("j-chief-0"));
  EXPECT_EQ(env("j-chief-0", "LONGHAUL_RESTART_ATTEMPT"), "0");
  EXPECT_EQ(pod("j-chief-0")["metadata"]["labels"]["longhaul.dev/role"], "chief");
  EXPECT_EQ(status().chief_pod, "j-chief-0");
  EXPECT_EQ(recovering()->status, "True");
  run_all();
  settle();
  EXPECT_EQ(recovering()->status, "False");
  EXPECT_EQ(status().recoveries, 1);
}

TEST_F(RecoveryTest, PodOnALostNodeIsForceDeletedThenReplacedAlone) {
  start_running();
  const auto before = uids();
  client.graceful_pod_deletion = true;
  client.now_text = "2026-11-21T13:00:00Z";
  json p = pod("j-worker-0");  // the node is gone: deleted, but no kubelet confirms it
  p["metadata"]["deletionTimestamp"] = "2026-11-21T13:00:00Z";
  client.put(res::kPods, p);
  client.reset_counts();
  settle();
  EXPECT_EQ(client.writes_of("delete", "pods"), 0) << "no survivor is deleted";
  EXPECT_EQ(status().preemption_count, 1);
  EXPECT_EQ(recovering()->status, "True");
  now += seconds(31);
  reconcile();  // past nodeLostTimeoutSeconds: force-deleted
  EXPECT_FALSE(client.has(res::kPods, "ns", "j-worker-0"));
  client.graceful_pod_deletion = false;
  settle();
  expect_survivors_untouched(before, "j-worker-0");
  EXPECT_EQ(env("j-worker-0", "LONGHAUL_RESTART_ATTEMPT"), "0");
  run_all();
  settle();
  EXPECT_EQ(status().last_recovery_milliseconds, 31000);
  EXPECT_EQ(status().failure_count, 0);
}

TEST_F(RecoveryTest, PermanentExitStillFailsTheJob) {
  start_running();
  set_phase("j-worker-0", "Failed", 2);
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Failed");
  EXPECT_EQ(api::find_condition(s, api::condition::kFailed)->reason, api::reason::kPermanentExit);
  EXPECT_EQ(s.recoveries, 0);
}

TEST_F(RecoveryTest, RetryableExitReplacesTheReplicaAloneAndSpendsBudget) {
  start_running();
  const auto before = uids();
  set_phase("j-worker-0", "Failed", 137);
  settle();
  expect_survivors_untouched(before, "j-worker-0");
  const auto s = status();
  EXPECT_EQ(s.failure_count, 1);
  EXPECT_EQ(s.recoveries, 1);
  EXPECT_TRUE(s.next_restart_time.empty()) << "the survivors wait: the replacement is not delayed";
  EXPECT_EQ(s.replica_failures.at("j-worker-0").count, 1);
}

// A replica replaced after failures kReplicaFailuresBeforeGroupRestart times within the window
// fails once more: the whole group restarts, after the failure backoff, with a new attempt.
TEST_F(RecoveryTest, ReplicaThatKeepsFailingFallsBackToAGroupRestartWithBackoff) {
  start_running();
  for (int i = 0; i < kReplicaFailuresBeforeGroupRestart; ++i) {
    set_phase("j-worker-1", "Failed", 137);
    settle();
    run_all();
    settle();
    now += seconds(60);
  }
  const auto before = uids();
  EXPECT_EQ(status().recoveries, kReplicaFailuresBeforeGroupRestart);
  set_phase("j-worker-1", "Failed", 137);
  settle();
  auto s = status();
  EXPECT_EQ(s.phase, "Restarting");
  const api::Condition* restarting = api::find_condition(s, api::condition::kRestarting);
  ASSERT_NE(restarting, nullptr);
  EXPECT_EQ(restarting->reason, api::reason::kReplicaKeepsFailing);
  EXPECT_EQ(recovering()->status, "False");
  EXPECT_EQ(s.failure_count, kReplicaFailuresBeforeGroupRestart + 1);
  EXPECT_EQ(s.recoveries, kReplicaFailuresBeforeGroupRestart);
  ASSERT_FALSE(s.next_restart_time.empty()) << "the group restart backs off";
  EXPECT_TRUE(pod_names().empty()) << "every old pod is deleted";
  now = api::parse_time(s.next_restart_time);
  settle();
  ASSERT_EQ(pod_names().size(), 3u);
  for (const std::string& n : pod_names()) {
    EXPECT_NE(uid(n), before.at(n));
    EXPECT_EQ(env(n, "LONGHAUL_RESTART_ATTEMPT"), std::to_string(s.restart_attempt));
  }
  EXPECT_EQ(s.group_restart_attempt, s.restart_attempt);
}

TEST_F(RecoveryTest, FailuresSpreadBeyondTheWindowStayInPlace) {
  start_running();
  for (int i = 0; i < kReplicaFailuresBeforeGroupRestart + 2; ++i) {
    const auto before = uids();
    set_phase("j-worker-1", "Failed", 137);
    settle();
    expect_survivors_untouched(before, "j-worker-1");
    run_all();
    settle();
    now += kReplicaFailureWindow + seconds(1);
  }
  EXPECT_EQ(status().recoveries, kReplicaFailuresBeforeGroupRestart + 2);
}

// Exit 138: longhaul survivors that gave up waiting for a replacement ask for a new group.
TEST_F(RecoveryTest, ExitCode138RestartsTheGroup) {
  start_running();
  preempt("j-worker-1");
  settle();
  set_phase("j-chief-0", "Failed", 138);
  settle();
  const auto s = status();
  EXPECT_EQ(api::find_condition(s, api::condition::kRestarting)->reason,
            api::reason::kGroupRestartRequested);
  EXPECT_EQ(recovering()->status, "False");
  EXPECT_EQ(recovering()->reason, api::reason::kGroupRestartRequested);
  EXPECT_EQ(s.failure_count, 1);
  now = api::parse_time(s.next_restart_time);
  settle();
  ASSERT_EQ(pod_names().size(), 3u);
  for (const std::string& n : pod_names())
    EXPECT_EQ(env(n, "LONGHAUL_RESTART_ATTEMPT"), std::to_string(s.restart_attempt));
}

// An operator restarted after committing the decision (status written, old pod deleted) but
// before creating the replacement: the new one re-derives everything from the status, creates
// the pod once, and measures the recovery from the original fault.
TEST_F(RecoveryTest, OperatorRestartMidRecoveryCreatesNoDuplicateAndKeepsTheClock) {
  start_running();
  const auto before = uids();
  client.graceful_pod_deletion = true;  // the old pod lingers Terminating
  client.now_text = "2026-11-21T13:00:00Z";
  client.reset_counts();
  preempt("j-worker-1");
  reconcile();  // decides, writes status, deletes the old pod
  EXPECT_EQ(client.writes_of("delete", "pods"), 1);
  reconciler = make_reconciler();  // the operator restarts: no memory of the delete
  now += seconds(2);
  settle();
  EXPECT_EQ(client.writes_of("create", "pods"), 0) << "the old pod still holds the name";
  client.erase(res::kPods, "ns", "j-worker-1");  // its kubelet confirms the deletion
  client.graceful_pod_deletion = false;
  reconciler = make_reconciler();  // and restarts again
  settle();
  reconcile();
  EXPECT_EQ(client.writes_of("create", "pods"), 1);
  EXPECT_EQ(client.writes_of("delete", "pods"), 1);
  expect_survivors_untouched(before, "j-worker-1");
  EXPECT_EQ(status().recoveries, 1);
  now += seconds(1);
  run_all();
  settle();
  EXPECT_EQ(status().last_recovery_milliseconds, 3000);
  client.reset_counts();
  reconciler = make_reconciler();
  for (int i = 0; i < 3; ++i) reconcile();
  EXPECT_EQ(client.writes(), 0);
}

TEST_F(RecoveryTest, GroupScopeStillRestartsEveryReplica) {
  json spec = replica_spec();
  spec["runPolicy"]["restartScope"] = "Group";
  create_job(spec);
  settle();
  run_all();
  settle();
  const auto before = uids();
  preempt("j-worker-1");
  settle();
  EXPECT_EQ(status().recoveries, 0);
  EXPECT_EQ(recovering(), nullptr);
  ASSERT_EQ(pod_names().size(), 3u);
  for (const std::string& n : pod_names()) {
    EXPECT_NE(uid(n), before.at(n));
    EXPECT_EQ(env(n, "LONGHAUL_RESTART_ATTEMPT"), "1");
  }
}

}  // namespace
}  // namespace longhaul::controller
