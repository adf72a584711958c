// Reconciler tests against the in-memory client: the decisions a user sees in the job's status
// and in the pods, with a controllable clock. The kubelet is simulated by writing pod status.
#include "longhaul/controller/reconciler.h"

#include <optional>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/controller/children.h"
#include "longhaul/kube/stop.h"
#include "reconciler_harness.h"

namespace longhaul::controller {
namespace {

namespace res = kube::resources;

json default_spec() {
  return json::parse(R"({
    "replicaSpecs": {
      "Chief": {"template": {"spec": {"containers": [{"name": "trainer", "image": "lh"}]}}},
      "Worker": {"replicas": 2,
                 "template": {"spec": {"containers": [{"name": "trainer", "image": "lh"}]}}}
    },
    "runPolicy": {"restartScope": "Group", "backoff": {"initialSeconds": 0, "maxSeconds": 0}}
  })");
}

// A 422 as the API server answers a create it finds invalid: one cause naming `field`.
kube::InvalidError invalid(const std::string& what, const std::string& object,
                           const std::string& field, const std::string& cause) {
  kube::InvalidError e(422, what);
  e.set_status(
      object + " is invalid: " + field + ": " + cause,
      json::array({{{"reason", "FieldValueInvalid"}, {"message", cause}, {"field", field}}}));
  return e;
}

class ReconcilerTest : public testing::ReconcilerHarness {
 protected:
  ReconcilerTest() { reconciler = make_reconciler(); }

  std::unique_ptr<Reconciler> make_reconciler(ClusterView* view = nullptr) {
    ReconcilerOptions o = base_options();
    // The chief's /metrics (progress.h), as the test sets them.
    o.progress.fetch = [this](const MetricsEndpoint& e, std::chrono::milliseconds) {
      std::lock_guard lock(chief_mu);
      ++chief_reads;
      read_from = e;
      if (!chief_metrics) throw Unavailable("connection refused");
      return *chief_metrics;
    };
    return std::make_unique<Reconciler>(client, view, &events, o);
  }
  void set_chief_metrics(std::optional<std::string> text) {
    std::lock_guard lock(chief_mu);
    chief_metrics = std::move(text);
  }
  // One reconcile whose read of the chief's metrics (if it starts one) has finished: the read
  // runs off the reconcile path, so the pass after it applies what it brought.
  ReconcileResult reconcile_after_read() {
    reconcile();
    EXPECT_TRUE(reconciler->progress().wait_idle(std::chrono::seconds(10)));
    return reconcile();
  }

  json status_json() { return client.get(res::kTrainingJobs, "ns", "j")["status"]; }
  // The message of the job's Failed condition, after checking the job failed with InvalidSpec.
  std::string invalid_spec_message() {
    const auto s = status();
    EXPECT_EQ(s.phase, "Failed");
    const api::Condition* failed = api::find_condition(s, api::condition::kFailed);
    if (failed == nullptr) {
      ADD_FAILURE() << "no Failed condition";
      return "";
    }
    EXPECT_EQ(failed->reason, api::reason::kInvalidSpec);
    return failed->message;
  }
  void start_running() {
    settle();
    run_all();
    settle();
    ASSERT_EQ(status().phase, "Running");
  }

  std::mutex chief_mu;
  std::optional<std::string> chief_metrics;  // nullopt: the chief is unreachable
  int chief_reads = 0;
  MetricsEndpoint read_from;
};

TEST_F(ReconcilerTest, MissingJobIsDone) {
  EXPECT_FALSE(reconcile().requeue_after);
  EXPECT_EQ(client.writes(), 0);
}

TEST_F(ReconcilerTest, CreatesClaimServiceAndPodsThenStaysPending) {
  create_job(default_spec());
  settle();
  EXPECT_TRUE(client.has(res::kPersistentVolumeClaims, "ns", "j-logdir"));
  EXPECT_TRUE(client.has(res::kServices, "ns", "j"));
  EXPECT_EQ(pod_names(), (std::vector<std::string>{"j-chief-0", "j-worker-0", "j-worker-1"}));
  const auto s = status();
  EXPECT_EQ(s.phase, "Pending");
  EXPECT_TRUE(api::condition_true(s, api::condition::kCreated));
  EXPECT_EQ(s.chief_pod, "j-chief-0");
  EXPECT_EQ(s.ready, "0/3");
  EXPECT_EQ(s.observed_generation, 1);
  EXPECT_EQ(s.start_time, "2026-11-21T13:00:00Z");
  EXPECT_TRUE(events.saw(api::reason::kCreatedPod));
}

TEST_F(ReconcilerTest, RunningJobMakesNoWritesOnceConverged) {
  create_job(default_spec());
  start_running();
  const auto s = status();
  EXPECT_TRUE(api::condition_true(s, api::condition::kRunning));
  EXPECT_EQ(s.replica_statuses.at("Worker").ready, 2);
  EXPECT_EQ(s.ready, "3/3");
  client.reset_counts();
  for (int i = 0; i < 3; ++i) reconcile();
  EXPECT_EQ(client.writes(), 0);
}

TEST_F(ReconcilerTest, ChiefExit1FailsTheJobNamingPodAndCode) {
  create_job(default_spec());
  start_running();
  set_phase("j-chief-0", "Failed", 1);
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Failed");
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason, api::reason::kPermanentExit);
  EXPECT_NE(failed->message.find("ns/j-chief-0"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find("code 1"), std::string::npos) << failed->message;
  EXPECT_FALSE(s.completion_time.empty());
  // cleanPodPolicy Running: the workers are deleted, the failed chief stays for its logs.
  EXPECT_EQ(pod_names(), std::vector<std::string>{"j-chief-0"});
}

TEST_F(ReconcilerTest, TenPreemptionsKeepTheJobRunningWithoutSpendingBudget) {
  create_job(default_spec());
  start_running();
  for (int i = 0; i < 10; ++i) {
    preempt(i % 2 == 0 ? "j-worker-1" : "j-chief-0");
    settle();
    run_all();
    settle();
  }
  const auto s = status();
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(s.preemption_count, 10);
  EXPECT_EQ(s.failure_count, 0);
  EXPECT_EQ(s.restart_count, 10);
  EXPECT_EQ(s.restart_attempt, 10);
  EXPECT_EQ(attempt("j-worker-0"), "10");
  EXPECT_TRUE(events.saw(api::reason::kPreempted));
}

TEST_F(ReconcilerTest, Exit137RestartsTheGroupAfterBackoff) {
  json spec = default_spec();
  spec["runPolicy"]["backoff"] = {{"initialSeconds", 10}, {"maxSeconds", 60}};
  create_job(spec);
  start_running();
  const std::string old_uid = uid("j-worker-0");
  set_phase("j-worker-1", "Failed", 137);
  settle();
  auto s = status();
  EXPECT_EQ(s.phase, "Restarting");
  EXPECT_EQ(s.failure_count, 1);
  EXPECT_EQ(s.next_restart_time, "2026-11-21T13:00:10Z");
  EXPECT_TRUE(pod_names().empty()) << "old incarnation deleted, new one waits for the backoff";
  const auto r = reconcile();
  ASSERT_TRUE(r.requeue_after);
  EXPECT_EQ(*r.requeue_after, std::chrono::seconds(10));
  now += std::chrono::seconds(10);
  settle();
  EXPECT_EQ(pod_names().size(), 3u);
  EXPECT_NE(uid("j-worker-0"), old_uid);
  EXPECT_EQ(attempt("j-worker-0"), "1");
  run_all();
  settle();
  s = status();
  EXPECT_EQ(s.phase, "Running");
  EXPECT_FALSE(api::condition_true(s, api::condition::kRestarting));
  EXPECT_TRUE(s.next_restart_time.empty());
}

TEST_F(ReconcilerTest, BackoffLimitCountsAcrossRecreations) {
  json spec = default_spec();
  spec["runPolicy"]["backoffLimit"] = 2;
  create_job(spec);
  start_running();
  for (int i = 0; i < 2; ++i) {
    set_phase("j-worker-0", "Failed", 138);
    settle();
    run_all();
    settle();
    EXPECT_EQ(status().phase, "Running");
  }
  set_phase("j-worker-0", "Failed", 138);
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Failed");
  EXPECT_EQ(s.failure_count, 3);
  EXPECT_EQ(s.failure_budget, "3/2");
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  EXPECT_EQ(failed->reason, api::reason::kBackoffLimitExceeded);
  EXPECT_NE(failed->message.find("backoffLimit 2"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find("j-worker-0"), std::string::npos) << failed->message;
}

TEST_F(ReconcilerTest, ContainerRestartsInPlaceCountAgainstTheBudget) {
  json spec = default_spec();
  spec["runPolicy"]["backoffLimit"] = 3;
  spec["replicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure";
  create_job(spec);
  start_running();
  set_phase("j-worker-1", "Running", 0,
            {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 2}}}}});
  settle();
  EXPECT_EQ(status().failure_count, 2);
  EXPECT_EQ(status().phase, "Running");
  settle();
  EXPECT_EQ(status().failure_count, 2) << "the same restarts are counted once";
  set_phase("j-worker-1", "Running", 0,
            {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 4}}}}});
  settle();
  EXPECT_EQ(status().phase, "Failed");
  EXPECT_EQ(api::find_condition(status(), api::condition::kFailed)->reason,
            api::reason::kBackoffLimitExceeded);
}

// Counted container restarts move from status onto the pod: status forgets them once the pod
// shows them, and a new operator process counts only restarts made after that.
TEST_F(ReconcilerTest, CountedContainerRestartsLiveOnThePodNotInStatus) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure";
  create_job(spec);
  start_running();
  set_phase("j-worker-1", "Running", 0,
            {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 2}}}}});
  settle();
  EXPECT_EQ(status().failure_count, 2);
  EXPECT_EQ(pod("j-worker-1")["metadata"]["annotations"]["longhaul.dev/counted-restarts"], "2");
  EXPECT_FALSE(status_json().contains("unsettledPods")) << status_json().dump();
  reconciler = make_reconciler();  // a new process: no memory of anything
  EXPECT_EQ(settle(), 0) << "nothing to write after the restart";
  set_phase("j-worker-1", "Running", 0,
            {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 3}}}}});
  settle();
  EXPECT_EQ(status().failure_count, 3);
}

// A view whose pod list stays as it was when frozen: an informer cache that has not yet seen a
// pod's deletion and its re-creation under the same name.
class FrozenPodsView : public ClusterView {
 public:
  explicit FrozenPodsView(kube::Client& client) : api_(client) {}
  json get_job(const std::string& ns, const std::string& name) override {
    return api_.get_job(ns, name);
  }
  std::vector<json> list_pods(const std::string& ns, const std::string& job) override {
    return frozen_ ? *frozen_ : api_.list_pods(ns, job);
  }
  bool exists(const kube::Resource& r, const std::string& ns, const std::string& name) override {
    return api_.exists(r, ns, name);
  }
  void freeze(const std::string& ns, const std::string& job) { frozen_ = api_.list_pods(ns, job); }

 private:
  ApiClusterView api_;
  std::optional<std::vector<json>> frozen_;
};

// Issue #27: a write the operator aims at a pod by name carries that pod's uid, so a decision
// taken on a view that still shows a pod deleted and re-created under the same name since never
// lands on the new pod: the counted-restarts annotation meant for the old pod is refused by the
// API server (metadata.uid is immutable) and the new pod keeps exactly what its kubelet wrote.
TEST_F(ReconcilerTest, WriteAimedAtAnOldPodNeverReachesTheSameNamePodCreatedSince) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure";
  create_job(spec);
  start_running();
  FrozenPodsView view(client);
  reconciler = make_reconciler(&view);
  set_phase("j-worker-1", "Running", 0,
            {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 2}}}}});
  view.freeze("ns", "j");
  const std::string old_uid = uid("j-worker-1");
  json successor = pod("j-worker-1");
  client.remove(res::kPods, "ns", "j-worker-1", {});
  successor["metadata"].erase("uid");
  successor["metadata"].erase("resourceVersion");
  successor["status"] = {{"phase", "Pending"}};
  client.create(res::kPods, "ns", successor);
  const json before = pod("j-worker-1");
  ASSERT_NE(before["metadata"]["uid"], old_uid);

  reconcile();
  EXPECT_EQ(status().failure_count, 2) << "the old pod's restarts are counted";
  EXPECT_EQ(pod("j-worker-1"), before)
      << "a write aimed at uid " << old_uid << " reached the pod created since";
}

// Status written by the operator before unsettledPods (status.pods: a record per pod) is read
// on upgrade: nothing is re-created or counted twice, and status.pods goes away.
TEST_F(ReconcilerTest, StatusOfThePreviousOperatorVersionIsReadOnUpgrade) {
  json spec = default_spec();
  spec["runPolicy"]["restartScope"] = "Replica";
  spec["replicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure";
  create_job(spec);
  start_running();
  preempt("j-worker-0");
  settle();
  run_all();
  settle();
  set_phase("j-worker-1", "Running", 0,
            {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 1}}}}});
  // What the previous version wrote at this point: worker-0 replaced in place (attempt 1),
  // worker-1's container restart counted, the chief's record in the range form.
  json job = client.get(res::kTrainingJobs, "ns", "j");
  json& st = job["status"];
  st.erase("unsettledPods");
  for (auto& [_, c] : st["replicaStatuses"].items()) c.erase("replicas");
  st["failureCount"] = 1;
  st["pods"] = json::parse(R"({
      "j-chief-[0]": {"restartAttempt": 0, "created": true, "containerRestarts": 0},
      "j-worker-0": {"restartAttempt": 1, "created": true, "containerRestarts": 0},
      "j-worker-1": {"restartAttempt": 0, "created": true, "containerRestarts": 1}})");
  client.put(res::kTrainingJobs, job);
  const int creates = client.writes_of("create", "pods");
  const int deletes = client.writes_of("delete", "pods");
  reconciler = make_reconciler();
  settle();
  EXPECT_EQ(client.writes_of("create", "pods"), creates);
  EXPECT_EQ(client.writes_of("delete", "pods"), deletes);
  EXPECT_EQ(status().failure_count, 1) << "the counted restart is not counted again";
  EXPECT_EQ(status().phase, "Running");
  EXPECT_FALSE(status_json().contains("pods")) << status_json().dump();
  EXPECT_FALSE(status_json().contains("unsettledPods")) << status_json().dump();
  EXPECT_EQ(pod("j-worker-1")["metadata"]["annotations"]["longhaul.dev/counted-restarts"], "1");
  EXPECT_EQ(settle(), 0);
  preempt("j-worker-0");  // the upgraded operator still knows worker-0's incarnation
  settle();
  EXPECT_EQ(attempt("j-worker-0"), "2");
  EXPECT_EQ(status().preemption_count, 2);
}

// The failure budget as the operator exports it per job (longhaul_operator_job_failures and
// longhaul_operator_job_backoff_limit): what the committed status says after each pass.
class FailureBudgetTest : public ReconcilerTest {
 protected:
  FailureBudgetTest() {
    ReconcilerOptions o = base_options();
    o.on_failure_budget = [this](const std::string& key, const std::optional<FailureBudget>& b) {
      std::lock_guard lock(budget_mu);
      budgets[key] = b;
    };
    reconciler = std::make_unique<Reconciler>(client, nullptr, &events, o);
  }
  // The last report for ns/j; nullopt when none came.
  std::optional<std::optional<FailureBudget>> reported() {
    std::lock_guard lock(budget_mu);
    const auto it = budgets.find("ns/j");
    if (it == budgets.end()) return std::nullopt;
    return it->second;
  }
  std::mutex budget_mu;
  std::map<std::string, std::optional<FailureBudget>> budgets;
};

TEST_F(FailureBudgetTest, ARestartingJobReportsTheFailuresItSpentAndItsLimit) {
  json spec = default_spec();
  spec["runPolicy"]["backoffLimit"] = 4;
  create_job(spec);
  start_running();
  ASSERT_TRUE(reported());
  EXPECT_EQ(*reported(), (FailureBudget{0, 4}));
  for (int failures = 1; failures <= 3; ++failures) {
    set_phase("j-worker-0", "Failed", 138);
    settle();
    EXPECT_EQ(*reported(), (FailureBudget{failures, 4})) << "after failure " << failures;
    run_all();
    settle();
  }
  preempt("j-worker-1");
  settle();
  EXPECT_EQ(*reported(), (FailureBudget{3, 4})) << "a preemption spends no budget";
}

TEST_F(FailureBudgetTest, ADeletedJobsBudgetIsDropped) {
  create_job(default_spec());
  start_running();
  ASSERT_TRUE(reported() && reported()->has_value());
  client.remove(res::kTrainingJobs, "ns", "j", {});
  reconcile();
  ASSERT_TRUE(reported());
  EXPECT_EQ(*reported(), std::nullopt) << "no stale series for a job that is gone";
}

TEST_F(FailureBudgetTest, AFinishedJobSpendsNoMoreBudgetAndIsDropped) {
  json spec = default_spec();
  spec["runPolicy"]["backoffLimit"] = 0;
  create_job(spec);
  start_running();
  set_phase("j-worker-0", "Failed", 138);
  settle();
  ASSERT_EQ(status().phase, "Failed");
  ASSERT_TRUE(reported());
  EXPECT_EQ(*reported(), std::nullopt);
}

TEST_F(ReconcilerTest, PodScopeRestartsOnlyTheFailedPod) {
  json spec = default_spec();
  spec["runPolicy"]["restartScope"] = "Pod";
  create_job(spec);
  start_running();
  const std::string chief_uid = uid("j-chief-0");
  set_phase("j-worker-1", "Failed", 137);
  settle();
  EXPECT_EQ(uid("j-chief-0"), chief_uid);
  EXPECT_EQ(attempt("j-worker-1"), "1");
  EXPECT_EQ(attempt("j-worker-0"), "0");
  EXPECT_EQ(status().failure_count, 1);
}

TEST_F(ReconcilerTest, PodDeletedFromUnderUsIsAPreemption) {
  create_job(default_spec());
  start_running();
  client.erase(res::kPods, "ns", "j-worker-0");
  settle();
  const auto s = status();
  EXPECT_EQ(s.preemption_count, 1);
  EXPECT_EQ(s.failure_count, 0);
  EXPECT_EQ(pod_names().size(), 3u);
  EXPECT_EQ(attempt("j-chief-0"), "1");
}

// Regression (#27, on a real kubelet 1.26.4): a pod re-created 20-40 ms after its same-name
// predecessor was removed was given the predecessor's terminated container by the kubelet, and
// kept it (every later update of the kubelet was refused). A freed name is reused only
// name_release_delay after the operator saw it free; the pass asks to be run again then.
TEST_F(ReconcilerTest, AFreedPodNameIsReusedOnlyAfterTheReleaseDelay) {
  ReconcilerOptions o = base_options();
  o.name_release_delay = ReconcilerOptions{}.name_release_delay;  // the default
  ASSERT_GT(o.name_release_delay, std::chrono::milliseconds(0));
  reconciler = std::make_unique<Reconciler>(client, nullptr, &events, o);
  create_job(default_spec());
  start_running();  // the first pods: their names were never taken, no wait
  client.erase(res::kPods, "ns", "j-worker-0");
  const auto first = reconcile();
  EXPECT_FALSE(client.has(res::kPods, "ns", "j-worker-0"));
  ASSERT_TRUE(first.requeue_after);
  EXPECT_GT(*first.requeue_after, std::chrono::milliseconds(0));
  EXPECT_LE(*first.requeue_after, o.name_release_delay);
  now += o.name_release_delay - std::chrono::milliseconds(1);
  settle();
  EXPECT_FALSE(client.has(res::kPods, "ns", "j-worker-0")) << "re-created before the delay";
  now += std::chrono::milliseconds(1);
  settle();
  EXPECT_TRUE(client.has(res::kPods, "ns", "j-worker-0"));
  EXPECT_EQ(status().preemption_count, 1);
}

TEST_F(ReconcilerTest, PodStuckTerminatingIsForceDeletedAfterTheTimeout) {
  json spec = default_spec();
  spec["runPolicy"]["nodeLostTimeoutSeconds"] = 30;
  create_job(spec);
  start_running();
  client.graceful_pod_deletion = true;
  client.now_text = "2026-11-21T13:00:00Z";
  // The node is lost: someone deleted the pod, but no kubelet confirms it.
  json p = pod("j-worker-0");
  p["metadata"]["deletionTimestamp"] = "2026-11-21T13:00:00Z";
  client.put(res::kPods, p);
  settle();
  EXPECT_EQ(status().preemption_count, 1);
  EXPECT_TRUE(client.has(res::kPods, "ns", "j-worker-0"));
  EXPECT_EQ(client.writes_of("delete", "pods"), 2) << "the other two pods of the group";
  const auto r = reconcile();
  ASSERT_TRUE(r.requeue_after);
  EXPECT_LE(*r.requeue_after, std::chrono::seconds(30));
  now += std::chrono::seconds(31);
  // The other pods terminated normally.
  client.erase(res::kPods, "ns", "j-chief-0");
  client.erase(res::kPods, "ns", "j-worker-1");
  reconcile();
  EXPECT_FALSE(client.has(res::kPods, "ns", "j-worker-0"));
  EXPECT_TRUE(events.saw(api::reason::kForceDeletedPod));
  client.graceful_pod_deletion = false;
  settle();
  EXPECT_EQ(pod_names().size(), 3u);
  EXPECT_EQ(attempt("j-worker-0"), "1");
}

struct SuccessCase {
  const char* name;
  const char* clean_pod_policy;
  std::vector<std::string> pods_left;
};
void PrintTo(const SuccessCase& c, std::ostream* os) { *os << c.name; }
class ReconcilerSuccess : public ReconcilerTest,
                          public ::testing::WithParamInterface<SuccessCase> {};
TEST_P(ReconcilerSuccess, ChiefSuccessFinishesAndCleansUpByPolicy) {
  json spec = default_spec();
  spec["runPolicy"]["cleanPodPolicy"] = GetParam().clean_pod_policy;
  create_job(spec);
  start_running();
  set_phase("j-worker-0", "Succeeded");
  set_phase("j-chief-0", "Succeeded");
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Succeeded");
  EXPECT_EQ(api::find_condition(s, api::condition::kSucceeded)->reason,
            api::reason::kChiefSucceeded);
  EXPECT_EQ(pod_names(), GetParam().pods_left);
  client.reset_counts();
  reconcile();
  EXPECT_EQ(client.writes(), 0);
}
INSTANTIATE_TEST_SUITE_P(
    Table, ReconcilerSuccess,
    ::testing::Values(SuccessCase{"Running", "Running", {"j-chief-0", "j-worker-0"}},
                      SuccessCase{"All", "All", {}},
                      SuccessCase{"None", "None", {"j-chief-0", "j-worker-0", "j-worker-1"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(ReconcilerTest, SuspendDeletesPodsAndResumeRecreatesThem) {
  create_job(default_spec());
  start_running();
  json job = client.get(res::kTrainingJobs, "ns", "j");
  job["spec"]["runPolicy"]["suspend"] = true;
  client.update(res::kTrainingJobs, "ns", job);
  settle();
  auto s = status();
  EXPECT_EQ(s.phase, "Suspended");
  EXPECT_TRUE(api::condition_true(s, api::condition::kSuspended));
  EXPECT_TRUE(pod_names().empty());
  EXPECT_TRUE(s.start_time.empty());
  job = client.get(res::kTrainingJobs, "ns", "j");
  job["spec"]["runPolicy"]["suspend"] = false;
  client.update(res::kTrainingJobs, "ns", job);
  settle();
  EXPECT_EQ(pod_names().size(), 3u);
  EXPECT_EQ(attempt("j-worker-1"), "1");
  run_all();
  settle();
  s = status();
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(api::find_condition(s, api::condition::kSuspended)->status, "False");
  EXPECT_EQ(s.observed_generation, 3);
  EXPECT_EQ(s.failure_count, 0);
}

TEST_F(ReconcilerTest, ActiveDeadlineFailsTheJobAndStopsPods) {
  json spec = default_spec();
  spec["runPolicy"]["activeDeadlineSeconds"] = 60;
  spec["runPolicy"]["cleanPodPolicy"] = "None";
  create_job(spec);
  start_running();
  const auto r = reconcile();
  ASSERT_TRUE(r.requeue_after);
  EXPECT_EQ(*r.requeue_after, std::chrono::seconds(60));
  now += std::chrono::seconds(61);
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Failed");
  EXPECT_EQ(api::find_condition(s, api::condition::kFailed)->reason,
            api::reason::kDeadlineExceeded);
  EXPECT_TRUE(pod_names().empty());
}

TEST_F(ReconcilerTest, TtlDeletesTheFinishedJob) {
  json spec = default_spec();
  spec["runPolicy"]["ttlSecondsAfterFinished"] = 30;
  create_job(spec);
  start_running();
  set_phase("j-chief-0", "Succeeded");
  settle();
  EXPECT_TRUE(client.has(res::kTrainingJobs, "ns", "j"));
  now += std::chrono::seconds(30);
  reconcile();
  EXPECT_FALSE(client.has(res::kTrainingJobs, "ns", "j"));
  EXPECT_TRUE(pod_names().empty()) << "owned pods are garbage-collected with the job";
  EXPECT_TRUE(client.has(res::kPersistentVolumeClaims, "ns", "j-logdir"))
      << "reclaimPolicy Retain keeps the logdir";
}

TEST_F(ReconcilerTest, InvalidSpecFailsOnceWithoutCrashLooping) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["template"]["spec"]["containers"] = json::array();
  create_job(spec);
  EXPECT_NO_THROW(settle());
  const auto s = status();
  EXPECT_EQ(s.phase, "Failed");
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  EXPECT_EQ(failed->reason, api::reason::kInvalidSpec);
  EXPECT_EQ(failed->message,
            "spec.replicaSpecs.Worker.template.spec.containers: must list at least one container");
  EXPECT_TRUE(pod_names().empty());
  client.reset_counts();
  reconcile();
  EXPECT_EQ(client.writes(), 0);
}

// A worker told to take 45 s for its final checkpoint in a pod the kubelet kills after 30 s
// (the default terminationGracePeriodSeconds) was created anyway and lost that checkpoint on
// every preemption: now the job fails before any pod exists, naming both fields.
TEST_F(ReconcilerTest, WorkerGracePeriodLongerThanThePodsFailsWithInvalidSpec) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"] =
      json::array({"train", "--set=grace_period_secs=45"});
  create_job(spec);
  EXPECT_NO_THROW(settle());
  const std::string message = invalid_spec_message();
  EXPECT_EQ(message.rfind("spec.replicaSpecs.Worker.template.spec.containers[0].args[1]: "
                          "grace_period_secs=45 is not below "
                          "spec.replicaSpecs.Worker.template.spec.terminationGracePeriodSeconds "
                          "(30)",
                          0),
            0u)
      << message;
  EXPECT_TRUE(events.saw(api::reason::kInvalidSpec));
  EXPECT_TRUE(pod_names().empty());
}

TEST_F(ReconcilerTest, RestartedOperatorRecoversFromTheClusterWithoutDuplicates) {
  create_job(default_spec());
  start_running();
  preempt("j-worker-0");
  reconcile();                     // decides the restart, commits it, deletes the old pods
  reconciler = make_reconciler();  // a new process: no memory of anything
  settle();
  run_all();
  settle();
  const auto s = status();
  EXPECT_EQ(s.preemption_count, 1);
  EXPECT_EQ(s.restart_attempt, 1);
  EXPECT_EQ(pod_names().size(), 3u);
  EXPECT_EQ(client.writes_of("create", "pods"), 6);
}

// Regression: the controller skips reconciles for its own status writes, so the pass that
// decides a restart or a deadline must also act on the pods.
TEST_F(ReconcilerTest, OnePassDecidesAndActs) {
  json spec = default_spec();
  spec["runPolicy"]["activeDeadlineSeconds"] = 60;
  create_job(spec);
  start_running();
  preempt("j-worker-0");
  reconcile();
  for (const std::string& n : pod_names()) EXPECT_NE(attempt(n), "0") << n;
  settle();
  run_all();
  settle();
  now += std::chrono::seconds(61);
  reconcile();
  EXPECT_EQ(status().phase, "Failed");
  EXPECT_TRUE(pod_names().empty());
}

TEST_F(ReconcilerTest, CreatingAnExistingPodIsTreatedAsExisting) {
  create_job(default_spec());
  reconcile();
  // A second operator (or a lost answer) already created the pods.
  auto other = make_reconciler();
  other->reconcile("ns", "j");
  other->reconcile("ns", "j");
  EXPECT_EQ(pod_names().size(), 3u);
}

// After success, READY showed the last incarnation ("1/2" with the chief done): a finished job
// has no ready replicas, and keeps its succeeded counts.
TEST_F(ReconcilerTest, SucceededJobShowsNoReadyReplicas) {
  create_job(default_spec());
  start_running();
  EXPECT_EQ(status().ready, "3/3");
  set_phase("j-chief-0", "Succeeded");
  settle();
  const auto s = status();
  ASSERT_EQ(s.phase, "Succeeded");
  EXPECT_EQ(s.ready, "0/3");
  EXPECT_EQ(s.replica_statuses.at("Chief").succeeded, 1);
  EXPECT_EQ(s.replica_statuses.at("Worker").active, 0);
  EXPECT_EQ(s.replica_statuses.at("Worker").ready, 0);
}

kube::ApiError quota_error() {
  kube::ApiError e(Code::kPermissionDenied, 403, "Forbidden",
                   "create Pod ns/j-worker-0: pods \"j-worker-0\" is forbidden: exceeded quota: q, "
                   "requested: pods=1, used: pods=1, limited: pods=1 (HTTP 403 Forbidden)");
  e.set_status(
      "pods \"j-worker-0\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, "
      "limited: pods=1",
      json::array());
  return e;
}

// A ResourceQuota 403 once left the job Pending forever with Created=True, no Warning Event and
// no retry: now the job says why, and retries by itself with backoff until the quota allows.
TEST_F(ReconcilerTest, QuotaRefusedCreateIsRetriedWithBackoffAndReported) {
  bool quota_full = true;
  client.before_create = [&](const kube::Resource& r, const json& o) {
    if (quota_full && r.plural == "pods" && o["metadata"]["name"] == "j-worker-0") {
      throw quota_error();
    }
  };
  create_job(default_spec());
  const ReconcileResult first = reconcile();
  ASSERT_TRUE(first.requeue_after);  // the job requeues itself: no other event is needed
  EXPECT_EQ(*first.requeue_after, std::chrono::milliseconds(1000));
  auto s = status();
  const api::Condition* created = api::find_condition(s, api::condition::kCreated);
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(created->status, "False");
  EXPECT_EQ(created->reason, api::reason::kFailedCreate);
  EXPECT_NE(created->message.find("exceeded quota"), std::string::npos) << created->message;
  EXPECT_EQ(created->message.find("RBAC"), std::string::npos) << created->message;
  EXPECT_TRUE(events.saw(api::reason::kFailedCreate));
  // Creates stop at a refusal: the chief (a batch of 1) exists, and of the next batch (2 pods in
  // flight together) only what the quota let through.
  const auto names = pod_names();
  EXPECT_EQ(names.front(), "j-chief-0");
  EXPECT_EQ(std::count(names.begin(), names.end(), "j-worker-0"), 0);

  // Within the backoff nothing is tried again; after it the create is retried, and refused
  // again with a longer backoff and no status write (nothing new to say).
  int tries = 0;
  client.before_create = [&](const kube::Resource& r, const json& o) {
    if (r.plural == "pods") ++tries;
    if (quota_full && r.plural == "pods" && o["metadata"]["name"] == "j-worker-0") {
      throw quota_error();
    }
  };
  settle();  // records the chief as created
  EXPECT_EQ(tries, 0);
  client.reset_counts();
  now += std::chrono::seconds(1);
  EXPECT_EQ(*reconcile().requeue_after, std::chrono::milliseconds(2000));
  EXPECT_EQ(tries, 1);
  EXPECT_EQ(client.writes_of("update_status", "trainingjobs"), 0) << status_json().dump();

  // The quota is raised: the next retry creates the rest and Created turns True.
  quota_full = false;
  now += std::chrono::seconds(2);
  settle();
  EXPECT_EQ(pod_names(), (std::vector<std::string>{"j-chief-0", "j-worker-0", "j-worker-1"}));
  s = status();
  EXPECT_TRUE(api::condition_true(s, api::condition::kCreated));
  EXPECT_EQ(s.phase, "Pending");
}

// A pod the API server refuses as invalid (422) fails the job with InvalidSpec naming the
// TrainingJob field, instead of leaving it Pending.
TEST_F(ReconcilerTest, PodRefusedAsInvalidFailsTheJobNamingTheField) {
  client.before_create = [&](const kube::Resource& r, const json& o) {
    if (r.plural != "pods" || o["metadata"]["name"] != "j-worker-0") return;
    throw invalid("create Pod ns/j-worker-0: Pod \"j-worker-0\" is invalid", "Pod \"j-worker-0\"",
                  "spec.containers[0].securityContext.runAsUser",
                  "Invalid value: -1: must be between 0 and 2147483647, inclusive");
  };
  create_job(default_spec());
  settle();
  const std::string message = invalid_spec_message();
  EXPECT_EQ(message.rfind("spec.replicaSpecs.Worker.template.spec.containers[0]."
                          "securityContext.runAsUser: Invalid value: -1",
                          0),
            0u)
      << message;
  EXPECT_TRUE(events.saw(api::reason::kFailedCreate));
  // The chief created before the refusal is cleaned up (cleanPodPolicy Running).
  EXPECT_TRUE(pod_names().empty());
}

// A logdir claim or Service the API server refuses as invalid fails the job the same way,
// naming the TrainingJob field the claim's or Service's field comes from.
TEST_F(ReconcilerTest, ClaimRefusedAsInvalidFailsTheJobNamingTheLogdirField) {
  client.before_create = [&](const kube::Resource& r, const json&) {
    if (r.plural != "persistentvolumeclaims") return;
    throw invalid("create PersistentVolumeClaim ns/j-logdir: invalid",
                  "PersistentVolumeClaim \"j-logdir\"", "spec.resources[storage]",
                  "Invalid value: \"0\": must be greater than zero");
  };
  create_job(default_spec());
  settle();
  const std::string message = invalid_spec_message();
  EXPECT_EQ(message.rfind("spec.logdir.size: Invalid value: \"0\"", 0), 0u) << message;
  EXPECT_NE(message.find("logdir claim ns/j-logdir"), std::string::npos) << message;
  EXPECT_TRUE(pod_names().empty()) << "nothing is created after the refusal";
}

// What the API server would refuse is caught before anything is created.
TEST_F(ReconcilerTest, InvalidContainerNameFailsBeforeAnyPodIsCreated) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "Trainer_1";
  create_job(spec);
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Failed");
  EXPECT_EQ(api::find_condition(s, api::condition::kFailed)
                ->message.rfind(
                    "spec.replicaSpecs.Worker.template.spec.containers[0].name: invalid container "
                    "name \"Trainer_1\"",
                    0),
            0u);
  EXPECT_EQ(client.writes_of("create", "pods"), 0);
}

// A 1000-replica job once got one Event per pod: now one per decision, naming a few pods.
TEST_F(ReconcilerTest, LargeJobGetsOneEventPerDecisionNotPerPod) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["replicas"] = 1000;
  create_job(spec);
  reconcile();
  EXPECT_EQ(pod_names().size(), 1001u);
  // One Event for the claim, the Service and the pods created together.
  EXPECT_EQ(std::count(events.reasons.begin(), events.reasons.end(), "CreatedPod"), 1);
  EXPECT_EQ(std::count(events.reasons.begin(), events.reasons.end(), "CreatedService"), 0);
  EXPECT_EQ(std::count(events.reasons.begin(), events.reasons.end(), "CreatedClaim"), 0);
  bool named = false;
  for (const std::string& m : events.messages) {
    named |= m.find(
                 "created logdir claim ns/j-logdir, headless Service ns/j and pods j-chief-0, "
                 "j-worker-0, j-worker-1, j-worker-2, j-worker-3 and 996 more (restart attempt "
                 "0)") != std::string::npos;
  }
  EXPECT_TRUE(named) << ::testing::PrintToString(events.messages);
  settle();
  run_all();
  settle();
  const json job = client.get(res::kTrainingJobs, "ns", "j");
  EXPECT_LT(job["status"].dump().size(), 4096u) << job["status"].dump().substr(0, 500);
}

// A job of the largest supported size with pods in every state: status holds counts per type
// and at most 32 pods that matter, whatever the pods do; an operator restart in the middle
// loses nothing and creates nothing twice; once converged, nothing is written.
TEST_F(ReconcilerTest, ThousandReplicasInDifferingStatesKeepStatusBounded) {
  json spec = default_spec();
  spec["runPolicy"]["restartScope"] = "Replica";
  spec["runPolicy"]["backoffLimit"] = 100;
  spec["replicaSpecs"]["Worker"]["replicas"] = api::kMaxReplicasPerType;
  create_job(spec);
  settle();
  const auto worker = [](int i) { return "j-worker-" + std::to_string(i); };
  set_phase("j-chief-0", "Running");
  for (int i = 0; i < 1000; ++i) {
    if (i >= 500 && i < 600) {
      set_phase(
          worker(i), "Pending", 0,
          {{"containerStatuses",
            {{{"name", "trainer"}, {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}}}}});
    } else if (i >= 600 && i < 610) {
      preempt(worker(i));
    } else if (i >= 610 && i < 620) {
      set_phase(worker(i), "Failed", 137);
    } else if (i >= 620 && i < 630) {
      set_phase(worker(i), "Running", 0,
                {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 1}}}}});
    } else {
      set_phase(worker(i), "Running");
    }
  }
  reconcile();  // decides: 20 replacements in place, 10 container restarts counted
  {
    const json st = status_json();
    EXPECT_LT(st.dump().size(), 8192u) << st.dump();
    const auto s = status();
    EXPECT_EQ(s.replica_statuses.at("Worker").replicas, 1000);
    // The 20 failed pods are being replaced: no longer of the current incarnation.
    EXPECT_EQ(s.replica_statuses.at("Worker").active, 980);
    EXPECT_EQ(s.replica_statuses.at("Worker").ready, 880);
    EXPECT_EQ(s.replica_statuses.at("Worker").failed, 0);
    EXPECT_EQ(s.replica_statuses.at("Chief").replicas, 1);
    EXPECT_EQ(s.failure_count, 20);
    EXPECT_EQ(s.preemption_count, 10);
    EXPECT_EQ(s.restart_attempt, 1) << "one pass's replacements share one attempt";
    ASSERT_EQ(s.pod_statuses.size(), api::kMaxPodStatuses);
    EXPECT_EQ(s.pod_statuses[0].name, "j-chief-0");
    EXPECT_EQ(s.pod_statuses[1].name, "j-worker-500");  // then in rank order
    EXPECT_EQ(s.pod_statuses[1].phase, "Pending");
    EXPECT_EQ(s.pod_statuses[1].reason, "ContainerCreating");
    // The pods that matter: the chief, 100 creating, 20 being replaced.
    EXPECT_EQ(s.pod_statuses_omitted, 1 + 100 + 20 - 32);
    EXPECT_LE(st["unsettledPods"].size(), 4u) << st["unsettledPods"].dump();
    int events_naming_each = 0;
    for (const std::string& m : events.messages) events_naming_each += m.size() > 2000;
    EXPECT_EQ(events_naming_each, 0) << "Events name at most a few pods";
  }
  reconciler = make_reconciler();  // a new process, mid-recovery
  settle();
  EXPECT_EQ(status().failure_count, 20) << "nothing counted twice";
  EXPECT_EQ(status().preemption_count, 10);
  EXPECT_EQ(client.writes_of("create", "pods"), 1001 + 20) << "each replacement made once";
  EXPECT_EQ(pod_names().size(), 1001u);
  for (int i = 600; i < 620; ++i) EXPECT_EQ(attempt(worker(i)), "1") << worker(i);
  run_all();
  settle();
  const json st = status_json();
  EXPECT_EQ(status().phase, "Running");
  EXPECT_FALSE(st.contains("unsettledPods")) << st["unsettledPods"].dump();
  ASSERT_EQ(status().pod_statuses.size(), 1u);  // the chief only
  EXPECT_EQ(status().pod_statuses_omitted, 0);
  EXPECT_LT(st.dump().size(), 4096u) << st.dump();
  EXPECT_EQ(settle(), 0) << "no writes once converged";
}

// A deposed leader kept creating pods after it lost the Lease: once the stop is requested
// no further write is made, even in the middle of a pass.
TEST_F(ReconcilerTest, StopRequestedMidPassMakesNoFurtherWrites) {
  json spec = default_spec();
  spec["replicaSpecs"]["Worker"]["replicas"] = 150;
  create_job(spec);
  std::stop_source stop;
  int creates = 0;
  client.before_create = [&](const kube::Resource& r, const json&) {
    if (r.plural == "pods" && ++creates == 40) stop.request_stop();  // the Lease is lost
  };
  kube::ScopedStopToken scope(stop.get_token());
  client.reset_counts();
  EXPECT_THROW(reconcile(), Cancelled);
  // The creates already in flight (at most one batch) completed, no more were sent.
  EXPECT_GE(client.writes_of("create", "pods"), 40);
  EXPECT_LT(client.writes_of("create", "pods"), 40 + 16);
  const int writes = client.writes();
  EXPECT_THROW(reconcile(), Cancelled);
  EXPECT_EQ(client.writes(), writes);
}

// ---- training progress (progress.h) in status, on the fake clock

json progress_spec() {
  json spec = default_spec();
  spec["progressIntervalSeconds"] = 30;
  spec["replicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["ports"] = {
      {{"name", "metrics"}, {"containerPort", 9400}}};
  return spec;
}

std::string exposition(int64_t step, int64_t checkpoint_step, int64_t checkpoint_unix) {
  return "# TYPE longhaul_train_global_step gauge\n"
         "longhaul_train_global_step{rank=\"0\"} " +
         std::to_string(step) + "\nlonghaul_train_max_steps{rank=\"0\"} 5000\n" +
         "longhaul_checkpoint_last_step{rank=\"0\"} " + std::to_string(checkpoint_step) +
         "\nlonghaul_checkpoint_last_timestamp_seconds{rank=\"0\"} " +
         std::to_string(checkpoint_unix) + "\n";
}

TEST_F(ReconcilerTest, ChiefProgressAppearsInStatusFromItsMetricsPort) {
  set_chief_metrics(exposition(1200, 1000, 1763730000));
  create_job(progress_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  const ReconcileResult r = reconcile_after_read();
  EXPECT_EQ(read_from, (MetricsEndpoint{"10.0.0.7", 9400, "j-chief-0"}));
  const json progress = status_json()["progress"];
  EXPECT_EQ(progress, json::parse(R"({"step": 1200, "maxSteps": 5000, "steps": "1200/5000",
                                      "lastCheckpointStep": 1000,
                                      "lastCheckpointTime": "2025-11-21T13:00:00Z",
                                      "observedTime": "2026-11-21T13:00:00Z",
                                      "lastStepTime": "2026-11-21T13:00:00Z",
                                      "pod": "j-chief-0"})"));
  // A running job with a readable chief comes back for the next read.
  ASSERT_TRUE(r.requeue_after);
  EXPECT_LE(*r.requeue_after, std::chrono::milliseconds(31000));
  // The other status fields are untouched by the progress.
  EXPECT_EQ(status().phase, "Running");
  EXPECT_EQ(status().ready, "3/3");
}

TEST_F(ReconcilerTest, ProgressIsWrittenAtMostOncePerIntervalAndNeverWhenUnchanged) {
  set_chief_metrics(exposition(0, 0, 0));
  create_job(progress_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  reconcile_after_read();
  ASSERT_TRUE(status().progress);
  client.reset_counts();
  // Ten minutes of steady training, the operator reconciling every 2 s (as often as any event
  // could make it) and a new step every second.
  int64_t step = 0;
  std::vector<std::string> observed;
  for (int tick = 0; tick < 300; ++tick) {
    now += std::chrono::seconds(2);
    step += 2;
    set_chief_metrics(exposition(step, step / 100 * 100, 1763730000 + step / 100));
    reconcile_after_read();
    const auto p = status().progress;
    if (observed.empty() || observed.back() != p->observed_time)
      observed.push_back(p->observed_time);
  }
  const int writes = client.writes_of("update_status", "trainingjobs");
  EXPECT_EQ(writes, client.writes()) << "progress causes status writes only";
  EXPECT_LE(writes, 600 / 30);
  EXPECT_GE(writes, 600 / 32) << "the progress must keep moving";
  for (size_t i = 1; i < observed.size(); ++i) {
    EXPECT_GE(api::parse_time(observed[i]) - api::parse_time(observed[i - 1]),
              std::chrono::seconds(30));
  }
  EXPECT_GE(status().progress->step, step - 32) << "at most one interval behind the chief";

  // The chief stops advancing (e.g. waiting on a slow filesystem): not one write more.
  reconcile_after_read();
  now += std::chrono::seconds(60);
  reconcile_after_read();  // the last step lands
  now += std::chrono::seconds(31);
  reconcile_after_read();  // then the next read says the step did not move: no rate, no ETA
  EXPECT_EQ(status().progress->steps_per_second, 0);
  EXPECT_EQ(status().progress->eta, "");
  client.reset_counts();
  for (int tick = 0; tick < 100; ++tick) {
    now += std::chrono::seconds(7);
    reconcile_after_read();
  }
  EXPECT_EQ(client.writes(), 0);
  EXPECT_EQ(status().progress->step, step);
}

// Found in the field: a job that trained to the end showed Succeeded with the STEP of its last
// metrics read (749/1500): nothing was read once the chief had finished. The chief's termination
// message (worker/cli/termination_message.h) makes the final status exact, in the same write
// that finishes the job.
TEST_F(ReconcilerTest, ASucceededJobShowsTheStepAndCheckpointTheChiefEndedAt) {
  set_chief_metrics(exposition(749, 500, 1763730000));
  create_job(progress_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  reconcile_after_read();
  ASSERT_EQ(status().progress->steps, "749/5000");
  now += std::chrono::seconds(5);  // well inside the interval: a read's change would wait
  const std::string message =
      R"({"step":5000,"maxSteps":5000,"lastCheckpointStep":5000,)"
      R"("lastCheckpointTime":"2026-11-21T13:00:04Z","lastStepTime":"2026-11-21T13:00:04Z",)"
      R"("stepsPerSecond":1000,"chief":true})";
  set_phase("j-chief-0", "Succeeded", 0,
            {{"containerStatuses",
              {{{"name", "trainer"},
                {"state",
                 {{"terminated",
                   {{"exitCode", 0},
                    {"finishedAt", "2026-11-21T13:00:04Z"},
                    {"message", message}}}}}}}}});
  const int reads = chief_reads;
  settle();
  const auto s = status();
  ASSERT_EQ(s.phase, "Succeeded");
  EXPECT_EQ(s.progress->steps, "5000/5000");
  EXPECT_EQ(s.progress->last_checkpoint_step, 5000);
  EXPECT_EQ(s.progress->last_checkpoint_time, "2026-11-21T13:00:04Z");
  EXPECT_EQ(s.progress->last_step_time, "2026-11-21T13:00:04Z");
  EXPECT_EQ(s.progress->eta, "");
  // At rest: a finished job's progress is never read or written again.
  client.reset_counts();
  for (int i = 0; i < 5; ++i) {
    now += std::chrono::seconds(31);
    reconcile_after_read();
  }
  EXPECT_EQ(client.writes_of("update_status", "trainingjobs"), 0);
  EXPECT_EQ(chief_reads, reads);
  EXPECT_EQ(status().progress, s.progress);
}

// A job shorter than one interval never showed progress: the read right after the chief started
// failed (connection refused) and the next came a whole interval later.
TEST_F(ReconcilerTest, AFailedFirstReadIsRetriedWithinSecondsWithoutAWrite) {
  set_chief_metrics(std::nullopt);
  create_job(progress_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  client.reset_counts();
  const ReconcileResult r = reconcile_after_read();
  ASSERT_TRUE(r.requeue_after);
  EXPECT_LE(*r.requeue_after, std::chrono::milliseconds(1000));
  EXPECT_EQ(client.writes(), 0);
  set_chief_metrics(exposition(12, 10, 1763730000));
  now += *r.requeue_after;
  reconcile_after_read();
  ASSERT_TRUE(status().progress);
  EXPECT_EQ(status().progress->steps, "12/5000");
}

TEST_F(ReconcilerTest, UnreachableChiefIsNoErrorAndKeepsTheLastProgress) {
  set_chief_metrics(exposition(700, 600, 1763730000));
  create_job(progress_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  reconcile_after_read();
  const auto before = status();
  ASSERT_TRUE(before.progress);
  set_chief_metrics(std::nullopt);
  client.reset_counts();
  const int reads = chief_reads;
  for (int tick = 0; tick < 10; ++tick) {
    now += std::chrono::seconds(31);
    EXPECT_NO_THROW(reconcile_after_read());
  }
  EXPECT_GE(chief_reads - reads, 10) << "the chief is still tried every interval";
  EXPECT_EQ(client.writes(), 0);
  EXPECT_EQ(status(), before);
  EXPECT_FALSE(api::find_condition(status(), api::condition::kFailed));
}

TEST_F(ReconcilerTest, AChiefWithoutAMetricsPortIsNeverReadAndCostsNoWrites) {
  set_chief_metrics(exposition(5, 0, 0));
  create_job(default_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  client.reset_counts();
  for (int i = 0; i < 3; ++i) {
    now += std::chrono::seconds(60);
    EXPECT_FALSE(reconcile_after_read().requeue_after);
  }
  EXPECT_EQ(chief_reads, 0);
  EXPECT_EQ(client.writes(), 0);
  EXPECT_FALSE(status().progress);
}

TEST_F(ReconcilerTest, ProgressSurvivesARestartAndTheNewChiefIsRead) {
  set_chief_metrics(exposition(900, 800, 1763730000));
  create_job(progress_spec());
  start_running();
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  reconcile_after_read();
  preempt("j-chief-0");
  settle();
  // While the group restarts, the last progress stays.
  EXPECT_EQ(status().progress->step, 900);
  run_all();
  settle();
  ASSERT_EQ(status().phase, "Running");
  // The new chief resumed from the checkpoint at 800 and has a new IP: read at once, written
  // once the interval since the last change has passed.
  set_chief_metrics(exposition(810, 800, 1763730000));
  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.8"}});
  now += std::chrono::seconds(31);
  reconcile_after_read();
  EXPECT_EQ(read_from, (MetricsEndpoint{"10.0.0.8", 9400, "j-chief-0"}));
  EXPECT_EQ(status().progress->steps, "810/5000");
}

}  // namespace
}  // namespace longhaul::controller
