// The operator's informer caches keep only what it reads (trim_cached_pod, kube::strip_for_cache):
// every reader of a cached pod decides the same on a trimmed pod, and the reconciler driven by a
// trimmed pod cache makes the same decisions as one reading whole pods.
#include <gtest/gtest.h>

#include "longhaul/controller/cleanup_policy.h"
#include "longhaul/controller/cluster_view.h"
#include "longhaul/controller/controller.h"
#include "longhaul/controller/failure_policy.h"
#include "longhaul/controller/ownership.h"
#include "longhaul/controller/progress.h"
#include "reconciler_harness.h"

namespace longhaul::controller {
namespace {

namespace res = kube::resources;

// What the real API server adds to a pod the operator created: field ownership per writer,
// kubectl's copy, the ServiceAccount volume, default tolerations.
void add_server_fields(json& pod) {
  json& md = pod["metadata"];
  md["managedFields"] = json::array(
      {{{"manager", "longhaul-operator"},
        {"operation", "Update"},
        {"fieldsType", "FieldsV1"},
        {"fieldsV1",
         {{"f:metadata", {{"f:labels", {{"f:longhaul.dev/job-name", json::object()}}}}}}}},
       {{"manager", "kubelet"},
        {"operation", "Update"},
        {"subresource", "status"},
        {"fieldsV1", {{"f:status", {{"f:phase", json::object()}}}}}}});
  md["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = pod.dump();
  json& spec = pod["spec"];
  spec["volumes"].push_back(
      {{"name", "kube-api-access-x"},
       {"projected", {{"sources", {{{"serviceAccountToken", {{"path", "token"}}}}}}}}});
  spec["tolerations"] = {{{"key", "node.kubernetes.io/not-ready"}, {"operator", "Exists"}}};
  for (json& c : spec["containers"]) {
    c["volumeMounts"].push_back({{"name", "kube-api-access-x"}, {"mountPath", "/var/run/secrets"}});
    c["terminationMessagePath"] = "/dev/termination-log";
  }
}

json trimmed(json pod) {
  trim_cached_pod(pod);
  return pod;
}

json served_pod(const json& status) {
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", "j-worker-0"},
        {"namespace", "ns"},
        {"uid", "pod-uid"},
        {"labels", {{"longhaul.dev/job-name", "j"}}},
        {"annotations", {{"longhaul.dev/restart-attempt", "3"}}},
        {"ownerReferences",
         {{{"apiVersion", "longhaul.dev/v1alpha1"},
           {"kind", "TrainingJob"},
           {"name", "j"},
           {"uid", "job-uid"},
           {"controller", true}}}}}},
      {"spec",
       {{"containers",
         {{{"name", "trainer"},
           {"image", "lh"},
           {"command", {"longhaul-worker", "train"}},
           {"env", {{{"name", "TF_CONFIG"}, {"value", std::string(4000, 'x')}}}},
           {"ports", {{{"name", "metrics"}, {"containerPort", 9400}}}}}}},
        {"volumes", {{{"name", "logdir"}, {"persistentVolumeClaim", {{"claimName", "c"}}}}}},
        {"nodeName", "node-1"}}},
      {"status", status}};
  add_server_fields(pod);
  return pod;
}

TEST(TrimCachedPodTest, KeepsWhatTheReadersReadAndDropsTheRest) {
  const json pod = served_pod({{"phase", "Running"}, {"podIP", "10.0.0.7"}});
  const json t = trimmed(pod);
  EXPECT_FALSE(t["metadata"].contains("managedFields"));
  EXPECT_EQ(t["metadata"]["annotations"], (json{{"longhaul.dev/restart-attempt", "3"}}));
  EXPECT_EQ(t["metadata"]["labels"], pod["metadata"]["labels"]);
  EXPECT_EQ(t["metadata"]["ownerReferences"], pod["metadata"]["ownerReferences"]);
  EXPECT_EQ(t["status"], pod["status"]);
  EXPECT_EQ(t["spec"]["nodeName"], "node-1");
  EXPECT_FALSE(t["spec"].contains("volumes"));
  EXPECT_FALSE(t["spec"].contains("tolerations"));
  EXPECT_EQ(t["spec"]["containers"][0],
            (json{{"name", "trainer"},
                  {"image", "lh"},
                  {"ports", {{{"name", "metrics"}, {"containerPort", 9400}}}},
                  {"terminationMessagePath", "/dev/termination-log"}}));
  EXPECT_LT(t.dump().size() * 4, pod.dump().size());
}

// Every function that reads a cached pod answers the same for the trimmed pod, in each state.
TEST(TrimCachedPodTest, ReadersDecideTheSameOnTrimmedPods) {
  const json statuses[] = {
      {{"phase", "Pending"},
       {"containerStatuses",
        {{{"name", "trainer"}, {"state", {{"waiting", {{"reason", "ImagePullBackOff"}}}}}}}}},
      {{"phase", "Running"},
       {"podIP", "10.0.0.7"},
       {"conditions", {{{"type", "Ready"}, {"status", "True"}}}},
       {"containerStatuses", {{{"name", "trainer"}, {"restartCount", 2}}}}},
      {{"phase", "Failed"},
       {"containerStatuses",
        {{{"name", "trainer"}, {"state", {{"terminated", {{"exitCode", 137}}}}}}}}},
      {{"phase", "Failed"},
       {"containerStatuses",
        {{{"name", "trainer"}, {"state", {{"terminated", {{"exitCode", 1}}}}}}}}},
      {{"phase", "Failed"},
       {"conditions",
        {{{"type", "DisruptionTarget"}, {"status", "True"}, {"reason", "PreemptionByScheduler"}}}}},
      {{"phase", "Succeeded"}},
      // The worker's final progress (progress.h reads it from the terminated container).
      {{"phase", "Succeeded"},
       {"containerStatuses",
        {{{"name", "trainer"},
          {"state",
           {{"terminated",
             {{"exitCode", 0},
              {"finishedAt", "2026-11-21T13:00:04Z"},
              {"message", R"({"step":1500,"maxSteps":1500,"chief":true})"}}}}}}}}},
  };
  api::ReplicaSpec replica;
  replica.restart_policy = api::RestartPolicy::kOnFailure;
  api::RunPolicy policy;
  for (const json& status : statuses) {
    const json pod = served_pod(status);
    const json t = trimmed(pod);
    SCOPED_TRACE(status.dump());
    const PodClassification a = classify_pod(pod, replica, policy),
                            b = classify_pod(t, replica, policy);
    EXPECT_EQ(a.outcome, b.outcome);
    EXPECT_EQ(a.reason, b.reason);
    EXPECT_EQ(a.message, b.message);
    EXPECT_EQ(a.exit_code, b.exit_code);
    EXPECT_EQ(container_restarts(pod), container_restarts(t));
    EXPECT_EQ(disruption_reason(pod), disruption_reason(t));
    EXPECT_EQ(failed_container(pod), failed_container(t));
    EXPECT_EQ(metrics_endpoint(pod), metrics_endpoint(t));
    EXPECT_EQ(terminated_progress(pod), terminated_progress(t));
    EXPECT_EQ(controlled_by_job(pod, "job-uid", "j"), controlled_by_job(t, "job-uid", "j"));
    for (auto p :
         {api::CleanPodPolicy::kAll, api::CleanPodPolicy::kRunning, api::CleanPodPolicy::kNone}) {
      for (bool deadline : {false, true}) {
        EXPECT_EQ(should_clean_pod(p, deadline, pod), should_clean_pod(p, deadline, t));
      }
    }
  }
  EXPECT_EQ(metrics_endpoint(trimmed(served_pod(statuses[1]))),
            (MetricsEndpoint{"10.0.0.7", 9400, "j-worker-0"}));
  const auto final_progress = terminated_progress(trimmed(served_pod(statuses[6])));
  ASSERT_TRUE(final_progress);
  EXPECT_EQ(final_progress->sample.step, 1500);
}

// The reconciler reading pods through a view that serves them as the operator's cache does
// (server fields added, then trimmed), over a job's life: create, run, preempt, recover, report
// the chief's progress from its metrics port, succeed.
class TrimmedPodView : public ClusterView {
 public:
  explicit TrimmedPodView(kube::Client& client) : api_(client) {}
  json get_job(const std::string& ns, const std::string& name) override {
    return api_.get_job(ns, name);
  }
  std::vector<json> list_pods(const std::string& ns, const std::string& job) override {
    std::vector<json> pods = api_.list_pods(ns, job);
    for (json& p : pods) {
      add_server_fields(p);
      trim_cached_pod(p);
    }
    return pods;
  }
  bool exists(const kube::Resource& r, const std::string& ns, const std::string& name) override {
    return api_.exists(r, ns, name);
  }

 private:
  ApiClusterView api_;
};

class TrimmedCacheReconcilerTest : public testing::ReconcilerHarness {
 protected:
  TrimmedCacheReconcilerTest() : view(client) {
    ReconcilerOptions o = base_options();
    o.progress.fetch = [this](const MetricsEndpoint& e, std::chrono::milliseconds) {
      std::lock_guard lock(mu);
      read_from = e;
      return std::string(
          "longhaul_train_global_step{rank=\"0\"} 1200\nlonghaul_train_max_steps{rank=\"0\"} "
          "5000\n");
    };
    reconciler = std::make_unique<Reconciler>(client, &view, &events, o);
  }
  TrimmedPodView view;
  std::mutex mu;
  MetricsEndpoint read_from;
};

TEST_F(TrimmedCacheReconcilerTest, JobLifeIsTheSame) {
  json spec = json::parse(R"({
    "progressIntervalSeconds": 30,
    "replicaSpecs": {
      "Chief": {"template": {"spec": {"containers": [{"name": "trainer", "image": "lh",
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"name": "metrics", "containerPort": 9400}]}]}}},
      "Worker": {"replicas": 2,
                 "template": {"spec": {"containers": [{"name": "trainer", "image": "lh"}]}}}
    },
    "runPolicy": {"restartScope": "Group", "backoff": {"initialSeconds": 0, "maxSeconds": 0}}
  })");
  create_job(spec);
  settle();
  EXPECT_EQ(pod_names(), (std::vector<std::string>{"j-chief-0", "j-worker-0", "j-worker-1"}));
  run_all();
  settle();
  ASSERT_EQ(status().phase, "Running");
  EXPECT_EQ(settle(), 0);  // converged: nothing more to write

  preempt("j-worker-1");
  settle();
  run_all();
  settle();
  const auto s = status();
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(s.preemption_count, 1);
  EXPECT_EQ(s.restart_attempt, 1);
  EXPECT_EQ(attempt("j-chief-0"), "1");
  EXPECT_EQ(attempt("j-worker-1"), "1");
  EXPECT_TRUE(events.saw(api::reason::kPreempted));

  set_phase("j-chief-0", "Running", 0, {{"podIP", "10.0.0.7"}});
  reconcile();
  ASSERT_TRUE(reconciler->progress().wait_idle(std::chrono::seconds(10)));
  reconcile();
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(read_from, (MetricsEndpoint{"10.0.0.7", 9400, "j-chief-0"}));
  }
  EXPECT_EQ(client.get(res::kTrainingJobs, "ns", "j")["status"]["progress"]["step"], 1200);

  set_phase("j-chief-0", "Succeeded");
  settle();
  EXPECT_EQ(status().phase, "Succeeded");
}

}  // namespace
}  // namespace longhaul::controller
