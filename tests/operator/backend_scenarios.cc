// The operator's scenarios that tell the same story on the fake and on the real API server,
// written once (backend_scenario.h): compiled into operator_scenario_test (fake server) and
// operator_real_test (real kube-apiserver), each with its own make_scenario_backend().
#include <map>

#include <gtest/gtest.h>

#include "backend_scenario.h"

namespace longhaul::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
const kube::Resource& kJobs = kube::resources::kTrainingJobs;

std::map<std::string, std::string> env_of(const json& pod) {
  std::map<std::string, std::string> env;
  for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e.value("value", "");
  return env;
}

using SharedScenario = BackendScenario;

TEST_F(SharedScenario, CreateMakesClaimServiceAndPodsWithEnvLabelsMountsAndOwners) {
  start_operator();
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); })) << status().phase;
  const json job = admin->get(kJobs, ns, "j");
  const std::string uid = job["metadata"]["uid"];

  const json claim = admin->get(kube::resources::kPersistentVolumeClaims, ns, "j-logdir");
  EXPECT_EQ(claim["spec"]["accessModes"], json::array({"ReadWriteMany"}));
  EXPECT_FALSE(claim["metadata"].contains("ownerReferences")) << "Retain: not garbage-collected";
  // No provisioner: the claim stays Pending, and the job runs regardless.
  EXPECT_EQ(claim.value(json::json_pointer("/status/phase"), std::string()), "Pending");
  const json svc = admin->get(kube::resources::kServices, ns, "j");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["metadata"]["ownerReferences"][0]["uid"], uid);

  const json chief = admin->get(kube::resources::kPods, ns, "j-chief-0");
  EXPECT_EQ(chief["metadata"]["labels"]["longhaul.dev/role"], "chief");
  EXPECT_EQ(chief["metadata"]["ownerReferences"][0]["uid"], uid);
  EXPECT_EQ(chief["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(chief["spec"]["hostname"], "j-chief-0");
  EXPECT_EQ(chief["spec"]["subdomain"], "j");
  EXPECT_EQ(chief["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(chief["spec"]["serviceAccountName"], "default");  // admitted by the server
  const json w1 = admin->get(kube::resources::kPods, ns, "j-worker-1");
  EXPECT_EQ(w1["metadata"]["labels"]["longhaul.dev/replica-type"], "worker");
  EXPECT_EQ(w1["metadata"]["labels"]["longhaul.dev/replica-index"], "1");
  EXPECT_FALSE(w1["metadata"]["labels"].contains("longhaul.dev/role"));
  EXPECT_EQ(w1["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/logdir");
  EXPECT_EQ(w1["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "j-logdir");
  const auto env = env_of(w1);
  const json tf = json::parse(env.at("TF_CONFIG"));
  EXPECT_EQ(tf["cluster"]["chief"], json::array({"j-chief-0.j." + ns + ".svc:2222"}));
  EXPECT_EQ(tf["cluster"]["worker"][1], "j-worker-1.j." + ns + ".svc:2222");
  EXPECT_EQ(tf["task"], json({{"type", "worker"}, {"index", 1}}));
  EXPECT_EQ(env.at("LONGHAUL_RANK"), "2");
  EXPECT_EQ(env.at("LONGHAUL_WORLD_SIZE"), "3");
  EXPECT_EQ(env.at("LONGHAUL_CHIEF_ADDRESS"), "j-chief-0.j." + ns + ".svc:2222");
  EXPECT_EQ(env.at("LONGHAUL_RESTART_ATTEMPT"), "0");
  EXPECT_EQ(env.at("LONGHAUL_LOGDIR"), "/logdir");

  ASSERT_TRUE(wait([&] {
    const auto s = status();
    return s.ready == "3/3" && api::condition_true(s, api::condition::kRunning);
  }));
  const auto s = status();
  EXPECT_EQ(s.chief_pod, "j-chief-0");
  EXPECT_TRUE(api::condition_true(s, api::condition::kCreated));
  EXPECT_EQ(s.observed_generation, 1);
  EXPECT_TRUE(wait([&] { return saw_event("CreatedPod"); }))
      << ::testing::PrintToString(event_reasons());
}

TEST_F(SharedScenario, ChiefExit1FailsTheJobNamingPodAndCode) {
  start_operator();
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  backend->terminate("j-chief-0", 1);
  ASSERT_TRUE(wait([&] { return status().phase == "Failed"; }));
  const auto s = status();
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason, "PermanentExitCode");
  EXPECT_NE(failed->message.find(ns + "/j-chief-0"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find("exited with code 1"), std::string::npos) << failed->message;
  // cleanPodPolicy Running: the running workers go, the failed chief stays for its logs.
  ASSERT_TRUE(wait([&] { return job_pods("j").size() == 1; }));
  EXPECT_EQ(job_pods("j")[0]["metadata"]["name"], "j-chief-0");
}

// Preemptions (DisruptionTarget) restart the group without spending the failure budget: ten on
// the fake server, three on the real one (each costs it seconds).
TEST_F(SharedScenario, RepeatedPreemptionsKeepTheJobRunningWithTheBudgetUntouched) {
  start_operator();
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  const int rounds = backend->preemption_rounds();
  for (int i = 1; i <= rounds; ++i) {
    backend->preempt(i % 2 ? "j-worker-1" : "j-chief-0");
    ASSERT_TRUE(wait([&] { return running("j", 3, i); })) << "preemption " << i;
  }
  ASSERT_TRUE(wait([&] { return status().preemption_count == rounds; }));
  const auto s = status();
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(s.failure_count, 0);
  EXPECT_EQ(s.failure_budget, "0/6");
  EXPECT_EQ(s.restart_count, rounds);
}

TEST_F(SharedScenario, Exit137RestartsTheGroupAfterTheBackoff) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["backoff"] = {{"initialSeconds", 1}, {"maxSeconds", 2}};
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  backend->terminate("j-worker-0", 137);
  ASSERT_TRUE(wait([&] { return status().failure_count == 1; }));
  const std::string not_before = status().next_restart_time;
  ASSERT_FALSE(not_before.empty());
  EXPECT_EQ(status().phase, "Restarting");
  ASSERT_TRUE(wait([&] { return running("j", 3, 1); }));
  for (const json& p : job_pods("j")) {
    EXPECT_GE(api::parse_time(p["metadata"]["creationTimestamp"].get<std::string>()),
              api::parse_time(not_before) - backend->timestamp_precision())
        << "pod " << p["metadata"]["name"] << " was created before the backoff ended";
  }
  ASSERT_TRUE(wait([&] { return status().phase == "Running"; }));
  EXPECT_EQ(status().failure_count, 1);
}

TEST_F(SharedScenario, BackoffLimitReachedAcrossRecreationsFailsTheJob) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["backoffLimit"] = 2;
  create(job);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(wait([&] { return running("j", 3, i); })) << "attempt " << i;
    backend->terminate("j-worker-1", 138);
  }
  ASSERT_TRUE(wait([&] { return status().phase == "Failed"; }));
  const auto s = status();
  EXPECT_EQ(s.failure_count, 3);
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason, "BackoffLimitExceeded");
  EXPECT_NE(failed->message.find("backoffLimit 2"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find("j-worker-1"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find("138"), std::string::npos) << failed->message;
}

TEST_F(SharedScenario, GroupRestartRecreatesEveryReplica) {
  start_operator();
  create(job_manifest("j", 3));
  ASSERT_TRUE(wait([&] { return running("j", 4, 0); }));
  std::map<std::string, std::string> before;
  for (const json& p : job_pods("j")) before[p["metadata"]["name"]] = p["metadata"]["uid"];
  backend->terminate("j-worker-2", 255);
  ASSERT_TRUE(wait([&] { return running("j", 4, 1); })) << [&] {
    std::string out;
    for (const json& p : job_pods("j")) out += p["metadata"].dump() + "\n";
    return out + status().phase;
  }();
  for (const json& p : job_pods("j")) {
    EXPECT_NE(before.at(p["metadata"]["name"]), p["metadata"]["uid"]) << p["metadata"]["name"];
    EXPECT_EQ(env_of(p).at("LONGHAUL_RESTART_ATTEMPT"), "1");
  }
}

TEST_F(SharedScenario, PodStuckTerminatingOnALostNodeIsForceDeleted) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["nodeLostTimeoutSeconds"] = 1;
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  // worker-1's node is gone: its deletion (as the taint manager's would be) never completes.
  backend->set_stuck("j-worker-1", true);
  kube::DeleteOptions grace;
  grace.grace_period_seconds = 1;
  admin->remove(kube::resources::kPods, ns, "j-worker-1", grace);
  ASSERT_TRUE(wait([&] { return status().preemption_count == 1; }));
  ASSERT_TRUE(wait([&] { return running("j", 3, 1); }, 60s));
  EXPECT_TRUE(wait([&] { return saw_event("ForceDeletedPod"); }))
      << ::testing::PrintToString(event_reasons());
  EXPECT_EQ(status().failure_count, 0);
}

struct CleanupCase {
  const char* policy;
  std::vector<std::string> pods_left;
};
void PrintTo(const CleanupCase& c, std::ostream* os) { *os << c.policy; }
class SharedSuccessScenario : public BackendScenario,
                              public ::testing::WithParamInterface<CleanupCase> {};

TEST_P(SharedSuccessScenario, ChiefSuccessFinishesAndCleansUpByPolicy) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["cleanPodPolicy"] = GetParam().policy;
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  backend->terminate("j-worker-0", 0);
  backend->terminate("j-chief-0", 0);
  ASSERT_TRUE(wait([&] { return status().phase == "Succeeded"; }));
  auto names = [&] {
    std::vector<std::string> n;
    for (const json& p : job_pods("j")) n.push_back(p["metadata"]["name"]);
    std::sort(n.begin(), n.end());
    return n;
  };
  ASSERT_TRUE(wait([&] { return names() == GetParam().pods_left; })) << names().size();
  const auto s = status();
  EXPECT_EQ(api::find_condition(s, api::condition::kSucceeded)->reason, "ChiefSucceeded");
  EXPECT_FALSE(s.completion_time.empty());
}
INSTANTIATE_TEST_SUITE_P(
    Policies, SharedSuccessScenario,
    ::testing::Values(CleanupCase{"Running", {"j-chief-0", "j-worker-0"}}, CleanupCase{"All", {}},
                      CleanupCase{"None", {"j-chief-0", "j-worker-0", "j-worker-1"}}),
    [](const auto& info) { return std::string(info.param.policy); });

TEST_F(SharedScenario, SuspendDeletesPodsAndResumeRecreatesThem) {
  start_operator();
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  admin->patch(kJobs, ns, "j", {{"spec", {{"runPolicy", {{"suspend", true}}}}}},
               kube::PatchType::kMerge);
  ASSERT_TRUE(wait([&] { return status().phase == "Suspended" && job_pods("j").empty(); }));
  EXPECT_TRUE(api::condition_true(status(), api::condition::kSuspended));
  admin->patch(kJobs, ns, "j", {{"spec", {{"runPolicy", {{"suspend", false}}}}}},
               kube::PatchType::kMerge);
  ASSERT_TRUE(wait([&] { return running("j", 3, 1); }));
  EXPECT_EQ(api::find_condition(status(), api::condition::kSuspended)->status, "False");
  EXPECT_EQ(status().failure_count, 0);
}

TEST_F(SharedScenario, ActiveDeadlineFailsTheJobWithDeadlineExceeded) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 2;
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  ASSERT_TRUE(wait([&] { return status().phase == "Failed"; }));
  EXPECT_EQ(api::find_condition(status(), api::condition::kFailed)->reason, "DeadlineExceeded");
  ASSERT_TRUE(wait([&] { return job_pods("j").empty(); }));
}

// ttlSecondsAfterFinished deletes the job; the garbage collector (not the operator: the pods
// are kept by cleanPodPolicy None) removes the pods and Service it owned; the Retain claim has
// no owner and stays. A real server's collector starts watching a new kind only at its periodic
// rediscovery (30 s): the deadlines allow for that.
TEST_F(SharedScenario, TtlAfterFinishedDeletesTheJobAndTheCollectorItsChildrenButKeepsTheLogdir) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 1;
  job["spec"]["runPolicy"]["cleanPodPolicy"] = "None";
  create(job);
  ASSERT_TRUE(wait([&] { return running("j", 3, 0); }));
  backend->terminate("j-chief-0", 0);
  ASSERT_TRUE(wait([&] { return !try_get(kJobs, "j"); }));
  ASSERT_TRUE(wait([&] { return job_pods("j").empty(); }, 120s));
  ASSERT_TRUE(wait([&] { return !try_get(kube::resources::kServices, "j"); }, 120s));
  EXPECT_TRUE(try_get(kube::resources::kPersistentVolumeClaims, "j-logdir"));
}

TEST_F(SharedScenario, InvalidSpecTheServerAcceptsFailsWithInvalidSpecAndNoPods) {
  start_operator();
  json job = job_manifest("j");
  job["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"] = json::array();
  create(job);  // the pod template is opaque to the CRD schema: the operator must catch it
  ASSERT_TRUE(wait([&] { return status().phase == "Failed"; }));
  const auto s = status();
  const auto* failed = api::find_condition(s, api::condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason, "InvalidSpec");
  EXPECT_NE(failed->message.find("spec.replicaSpecs.Worker.template.spec.containers"),
            std::string::npos)
      << failed->message;
  EXPECT_TRUE(job_pods("j").empty());
}

TEST_F(SharedScenario, NoWritesOnceConverged) {
  start_operator();
  create(job_manifest("j"));
  ASSERT_TRUE(wait([&] { return running("j", 3, 0) && status().ready == "3/3"; }));
  // The last decision's Event is written right after its status: wait for it too.
  ASSERT_TRUE(wait([&] { return saw_event("AllReplicasRunning"); }));
  // Converged: a forced reconcile writes nothing.
  ASSERT_NO_FATAL_FAILURE(expect_forced_reconciles_write_nothing(
      *ctl, reconciles, [&] { return backend->take_operator_writes(); }, ns + "/j",
      /*max_rounds=*/5, /*quiet_rounds=*/3));
}

}  // namespace
}  // namespace longhaul::testing
