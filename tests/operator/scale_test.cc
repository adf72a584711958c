// The largest supported job (1000 Workers and a Chief) on the fake API server, through the
// real HttpClient, informers and controller: its status stays a few KB whatever its pods do,
// an operator restart during creation and another right after a mass failure lose nothing and
// create nothing twice, and once converged nothing is written. Multi-second: labelled slow.
#include <gtest/gtest.h>

#include "harness.h"
#include "longhaul/controller/controller.h"

namespace longhaul::testing {
namespace {

class Scale : public FakeServerScenario {
 protected:
  void restart_operator() {
    ctl->stop();
    ctl.reset();
    start_operator();
  }
  // Waits on the job's status (cheap to read on every change), recording its largest size.
  bool wait_status(const std::function<bool(const api::TrainingJobStatus&)>& pred,
                   std::chrono::milliseconds timeout = 120s) {
    return server.wait_for(
        [&] {
          auto job = server.try_get(kJobs, "default", "big");
          if (!job) return false;
          const json st = job->value("status", json::object());
          largest_status = std::max(largest_status, st.dump().size());
          return pred(api::parse_status(st));
        },
        timeout);
  }
  size_t created_pods() {
    return server.count_requests({.verb = "create", .resource = "pods", .status = 201});
  }
  api::TrainingJobStatus status_of() { return job_status(server, "big"); }
  static std::string worker(int i) { return "big-worker-" + std::to_string(i); }

  size_t largest_status = 0;
};

TEST_F(Scale, ThousandReplicasInDifferingStatesKeepStatusBoundedAcrossOperatorRestarts) {
  constexpr int kWorkers = api::kMaxReplicasPerType;
  constexpr size_t kPods = kWorkers + 1;
  start_operator();
  json job = job_manifest("big", kWorkers);
  job["spec"]["runPolicy"]["restartScope"] = "Replica";
  job["spec"]["runPolicy"]["backoffLimit"] = 100;
  server.create(kJobs, "default", job);

  // Restarted mid-creation: the new operator finds what exists and creates only the rest.
  ASSERT_TRUE(server.wait_for([&] { return created_pods() >= 300; }, 60s));
  restart_operator();
  ASSERT_TRUE(wait_status([&](const auto& s) {
    return s.phase == "Running" && s.ready == "1001/1001";
  })) << status_of().ready;
  EXPECT_EQ(job_pods(server, "big").size(), kPods);
  EXPECT_EQ(created_pods(), kPods) << "a pod name created twice";
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods", .status = 409}), 0u);

  // Pods in every state at once: 50 creating, 10 preempted, 10 failed (retryable exit 137),
  // 10 whose containers restarted in place, the rest running.
  kubelet->set_auto_run(false);
  for (int i = 0; i < 50; ++i) {
    server.patch_status(
        "pods", "default", worker(i),
        {{"phase", "Pending"},
         {"conditions", {{{"type", "Ready"}, {"status", "False"}}}},
         {"containerStatuses",
          {{{"name", "trainer"}, {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}}}}});
  }
  for (int i = 100; i < 110; ++i) preempt_pod(server, worker(i));
  for (int i = 200; i < 210; ++i) fail_pod(server, worker(i), 137);
  for (int i = 300; i < 310; ++i) {
    server.patch_status("pods", "default", worker(i),
                        {{"containerStatuses", {{{"name", "trainer"}, {"restartCount", 1}}}}});
  }
  // The operator is restarted as soon as every failure is counted, before it is done
  // replacing the pods.
  ASSERT_TRUE(wait_status(
      [&](const auto& s) { return s.preemption_count == 10 && s.failure_count == 20; }));
  {
    const auto s = status_of();
    EXPECT_EQ(s.replica_statuses.at("Worker").replicas, kWorkers);
    EXPECT_LE(s.pod_statuses.size(), api::kMaxPodStatuses);
    EXPECT_EQ(s.pod_statuses.front().name, "big-chief-0");
  }
  restart_operator();
  kubelet->set_auto_run(true);  // starts the replacements
  for (int i = 0; i < 50; ++i) {
    server.patch_status(
        "pods", "default", worker(i),
        {{"phase", "Running"},
         {"conditions", {{{"type", "Ready"}, {"status", "True"}}}},
         {"containerStatuses", {{{"name", "trainer"}, {"state", {{"running", json::object()}}}}}}});
  }
  ASSERT_TRUE(wait_status([&](const auto& s) {
    return s.ready == "1001/1001" && s.recoveries == 20 &&
           !api::condition_true(s, api::condition::kRecovering);
  })) << status_of().ready;

  const auto s = status_of();
  EXPECT_EQ(s.preemption_count, 10) << "nothing counted twice across the restart";
  EXPECT_EQ(s.failure_count, 20);
  EXPECT_EQ(s.replica_statuses.at("Worker").active, kWorkers);
  EXPECT_EQ(s.replica_statuses.at("Worker").ready, kWorkers);
  ASSERT_EQ(s.pod_statuses.size(), 1u) << "only the chief matters now";
  EXPECT_EQ(s.pod_statuses_omitted, 0);
  EXPECT_TRUE(s.pods.empty()) << "status keeps nothing per pod once converged";
  EXPECT_EQ(created_pods(), kPods + 20) << "each failed pod replaced once";
  EXPECT_EQ(server.count_requests({.verb = "delete", .resource = "pods"}), 20u);
  EXPECT_EQ(server.count_requests({.verb = "create", .resource = "pods", .status = 409}), 0u);
  const auto pods = job_pods(server, "big");
  EXPECT_EQ(pods.size(), kPods);
  for (int i = 300; i < 310; ++i) {
    const json p = server.get("pods", "default", worker(i));
    EXPECT_EQ(p["metadata"]["annotations"].value(std::string(api::kAnnotationCountedRestarts), ""),
              "1")
        << worker(i);
  }
  // Bounded: a few KB at every moment of the job's life (it was 419 KB for 5000 pods).
  EXPECT_LT(largest_status, 16u * 1024) << "largest status seen";
  RecordProperty("largest_status_bytes", static_cast<int>(largest_status));
  // Events stay aggregated: few, and each names at most a few pods.
  const auto events = server.list("events", "default");
  EXPECT_LT(events.size(), 60u);
  for (const json& e : events) EXPECT_LT(e.value("message", "").size(), 600u) << e.dump();

  // Converged: forced reconciles write nothing.
  ASSERT_NO_FATAL_FAILURE(expect_forced_reconciles_write_nothing(
      *ctl, reconciles, [&] { return take_writes(server); }, "default/big", /*max_rounds=*/5,
      /*quiet_rounds=*/2));
}

}  // namespace
}  // namespace longhaul::testing
