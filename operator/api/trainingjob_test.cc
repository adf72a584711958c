// Tests for the TrainingJob API types: defaults, field-path errors, status round trips and the
// condition helpers' transition-time rule.
#include "longhaul/api/trainingjob.h"

#include <gtest/gtest.h>

#include "longhaul/base/error.h"

namespace longhaul::api {
namespace {

json minimal_spec() {
  return json::parse(R"({
    "replicaSpecs": {
      "Worker": {"replicas": 2, "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}
    }
  })");
}

TEST(ParseSpec, AppliesTheSchemaDefaults) {
  const TrainingJobSpec s = parse_spec(minimal_spec());
  ASSERT_EQ(s.replica_specs.size(), 1u);
  EXPECT_EQ(s.replica_specs.at(ReplicaType::kWorker).replicas, 2);
  EXPECT_EQ(s.replica_specs.at(ReplicaType::kWorker).restart_policy, RestartPolicy::kExitCode);
  EXPECT_EQ(s.logdir.access_modes, std::vector<std::string>{"ReadWriteMany"});
  EXPECT_EQ(s.logdir.mount_path, "/logdir");
  EXPECT_EQ(s.logdir.reclaim_policy, ReclaimPolicy::kRetain);
  EXPECT_EQ(s.run_policy.backoff_limit, 6);
  EXPECT_EQ(s.run_policy.restart_scope, RestartScope::kGroup);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kRunning);
  EXPECT_FALSE(s.run_policy.suspend);
  EXPECT_EQ(s.success_policy, SuccessPolicy::kChiefSucceeds);
  ASSERT_TRUE(s.chief());
  EXPECT_EQ(s.chief()->first, ReplicaType::kWorker);
}

TEST(ParseSpec, ChiefReplicaIsTheChief) {
  json j = minimal_spec();
  j["replicaSpecs"]["Chief"] = j["replicaSpecs"]["Worker"];
  j["replicaSpecs"]["Chief"].erase("replicas");
  const TrainingJobSpec s = parse_spec(j);
  EXPECT_EQ(s.chief()->first, ReplicaType::kChief);
  EXPECT_EQ(s.total_replicas(), 3);
}

TEST(ParseSpec, ReadsEveryField) {
  json j = minimal_spec();
  j["logdir"] = {{"storageClassName", "nfs"},
                 {"size", "5Gi"},
                 {"accessModes", {"ReadWriteOnce"}},
                 {"mountPath", "/data"},
                 {"reclaimPolicy", "Delete"}};
  j["runPolicy"] = json::parse(R"({"backoffLimit": 2, "restartScope": "Pod",
      "retryableExitCodes": [3], "permanentExitCodes": [137], "backoff": {"initialSeconds": 1,
      "maxSeconds": 4}, "nodeLostTimeoutSeconds": 5, "activeDeadlineSeconds": 60,
      "ttlSecondsAfterFinished": 0, "cleanPodPolicy": "All", "suspend": true})");
  j["successPolicy"] = "AllWorkers";
  const TrainingJobSpec s = parse_spec(j);
  EXPECT_EQ(s.logdir.storage_class_name, "nfs");
  EXPECT_EQ(s.logdir.reclaim_policy, ReclaimPolicy::kDelete);
  EXPECT_EQ(s.run_policy.restart_scope, RestartScope::kPod);
  EXPECT_EQ(s.run_policy.retryable_exit_codes, std::vector<int32_t>{3});
  EXPECT_EQ(s.run_policy.backoff.max_seconds, 4);
  EXPECT_EQ(*s.run_policy.active_deadline_seconds, 60);
  EXPECT_EQ(*s.run_policy.ttl_seconds_after_finished, 0);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kAll);
  EXPECT_TRUE(s.run_policy.suspend);
  EXPECT_EQ(s.success_policy, SuccessPolicy::kAllWorkers);
  // to_json then parse gives the same spec back.
  const TrainingJobSpec again = parse_spec(to_json(s));
  EXPECT_EQ(to_json(again), to_json(s));
}

struct BadSpec {
  const char* name;
  const char* patch;  // merge-patched onto minimal_spec()
  const char* message_prefix;
};
void PrintTo(const BadSpec& c, std::ostream* os) { *os << c.name; }

class ParseSpecErrors : public ::testing::TestWithParam<BadSpec> {};

TEST_P(ParseSpecErrors, NameTheFieldPath) {
  json j = minimal_spec();
  j.merge_patch(json::parse(GetParam().patch));
  try {
    parse_spec(j);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(GetParam().message_prefix, 0), 0u) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseSpecErrors,
    ::testing::Values(
        BadSpec{"NegativeReplicas", R"({"replicaSpecs":{"Worker":{"replicas":-1}}})",
                "spec.replicaSpecs.Worker.replicas: must be >= 0"},
        BadSpec{"ReplicasNotInteger", R"({"replicaSpecs":{"Worker":{"replicas":"two"}}})",
                "spec.replicaSpecs.Worker.replicas: must be an integer"},
        BadSpec{"UnknownReplicaType", R"({"replicaSpecs":{"Master":{"template":{}}}})",
                "spec.replicaSpecs.Master: unknown replica type"},
        BadSpec{"TwoChiefs", R"({"replicaSpecs":{"Chief":{"replicas":2,"template":{}}}})",
                "spec.replicaSpecs.Chief.replicas: must be <= 1"},
        BadSpec{"MissingTemplate", R"({"replicaSpecs":{"PS":{"replicas":1}}})",
                "spec.replicaSpecs.PS.template: is required"},
        BadSpec{"BadRestartPolicy", R"({"replicaSpecs":{"Worker":{"restartPolicy":"Always"}}})",
                "spec.replicaSpecs.Worker.restartPolicy: unsupported value \"Always\""},
        BadSpec{"NegativeBackoffLimit", R"({"runPolicy":{"backoffLimit":-1}})",
                "spec.runPolicy.backoffLimit: must be >= 0"},
        BadSpec{"BadScope", R"({"runPolicy":{"restartScope":"Node"}})",
                "spec.runPolicy.restartScope: unsupported value"},
        BadSpec{"ExitCodeOutOfRange", R"({"runPolicy":{"retryableExitCodes":[0]}})",
                "spec.runPolicy.retryableExitCodes[0]: must be an exit code"},
        BadSpec{"ExitCodeInBothLists",
                R"({"runPolicy":{"retryableExitCodes":[3],"permanentExitCodes":[3]}})",
                "spec.runPolicy.permanentExitCodes: exit code 3"},
        BadSpec{"BackoffMaxBelowInitial",
                R"({"runPolicy":{"backoff":{"initialSeconds":10,"maxSeconds":1}}})",
                "spec.runPolicy.backoff.maxSeconds: must be >= initialSeconds"},
        BadSpec{"ZeroDeadline", R"({"runPolicy":{"activeDeadlineSeconds":0}})",
                "spec.runPolicy.activeDeadlineSeconds: must be >= 1"},
        BadSpec{"BadCleanPodPolicy", R"({"runPolicy":{"cleanPodPolicy":"Some"}})",
                "spec.runPolicy.cleanPodPolicy: unsupported value"},
        BadSpec{"SuspendNotBool", R"({"runPolicy":{"suspend":"yes"}})",
                "spec.runPolicy.suspend: must be a boolean"},
        BadSpec{"ClaimAndClass", R"({"logdir":{"claimName":"a","storageClassName":"b"}})",
                "spec.logdir: give either claimName"},
        BadSpec{"RelativeMount", R"({"logdir":{"mountPath":"logs"}})",
                "spec.logdir.mountPath: must be an absolute path"},
        BadSpec{"BadAccessMode", R"({"logdir":{"accessModes":["Everyone"]}})",
                "spec.logdir.accessModes[0]: must be one of"},
        BadSpec{"BadReclaim", R"({"logdir":{"reclaimPolicy":"Recycle"}})",
                "spec.logdir.reclaimPolicy: unsupported value"},
        BadSpec{"BadSuccessPolicy", R"({"successPolicy":"Any"})",
                "spec.successPolicy: unsupported value"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ValidateRunnable, TemplateWithoutContainersNamesTheField) {
  json j = minimal_spec();
  j["replicaSpecs"]["Worker"]["template"] = {{"spec", json::object()}};
  const TrainingJobSpec s = parse_spec(j);
  try {
    validate_runnable(s, "job");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "spec.replicaSpecs.Worker.template.spec.containers: must list at least one "
                 "container");
  }
}

TEST(ValidateRunnable, RejectsNamesThatAreNotPodHostnames) {
  const TrainingJobSpec s = parse_spec(minimal_spec());
  EXPECT_NO_THROW(validate_runnable(s, "gpt2-small"));
  EXPECT_THROW(validate_runnable(s, std::string(60, 'a')), InvalidArgument);
}

TEST(ValidateRunnable, NeedsAChiefOrWorker) {
  json j = minimal_spec();
  j["replicaSpecs"]["Worker"]["replicas"] = 0;
  EXPECT_THROW(validate_runnable(parse_spec(j), "job"), InvalidArgument);
}

TEST(Status, RoundTripsThroughJson) {
  TrainingJobStatus s;
  s.phase = std::string(phase::kRunning);
  s.replica_statuses["Worker"] = ReplicaStatus{2, 1, 0, 0};
  s.pods["job-worker-0"] = PodRecord{3, true, 1};
  s.restart_count = 4;
  s.preemption_count = 3;
  s.failure_count = 1;
  s.chief_pod = "job-worker-0";
  s.restart_attempt = 3;
  s.observed_generation = 2;
  s.start_time = "2026-11-21T13:00:00Z";
  set_condition(s, condition::kRunning, "True", reason::kAllReplicasRunning, "",
                parse_time("2026-11-21T13:00:05Z"));
  const json j = to_json(s);
  EXPECT_EQ(j["replicaStatuses"]["Worker"]["ready"], 1);
  EXPECT_EQ(j["conditions"][0]["lastTransitionTime"], "2026-11-21T13:00:05Z");
  EXPECT_EQ(parse_status(j), s);
}

TEST(Status, ParsesGarbageLeniently) {
  const TrainingJobStatus s = parse_status(json::parse(R"({"restartCount": "x", "phase": 3})"));
  EXPECT_EQ(s.restart_count, 0);
  EXPECT_EQ(s.phase, "");
}

TEST(SetCondition, TransitionTimeChangesOnlyWithStatus) {
  TrainingJobStatus s;
  const Time t0 = parse_time("2026-11-21T13:00:00Z");
  const Time t1 = parse_time("2026-11-21T13:05:00Z");
  EXPECT_TRUE(set_condition(s, condition::kRunning, "True", "A", "m", t0));
  EXPECT_FALSE(set_condition(s, condition::kRunning, "True", "A", "m", t1));
  EXPECT_TRUE(set_condition(s, condition::kRunning, "True", "B", "m2", t1));
  EXPECT_EQ(find_condition(s, condition::kRunning)->last_transition_time, "2026-11-21T13:00:00Z");
  EXPECT_TRUE(set_condition(s, condition::kRunning, "False", "B", "m2", t1));
  EXPECT_EQ(find_condition(s, condition::kRunning)->last_transition_time, "2026-11-21T13:05:00Z");
  EXPECT_FALSE(condition_true(s, condition::kRunning));
}

TEST(Time, ParsesKubernetesFormats) {
  const Time t = parse_time("2026-11-21T13:20:39Z");
  EXPECT_EQ(format_time(t), "2026-11-21T13:20:39Z");
  EXPECT_EQ(format_time(parse_time("2026-11-21T14:20:39+01:00")), "2026-11-21T13:20:39Z");
  EXPECT_EQ(parse_time("2026-11-21T13:20:39.500000Z") - t, std::chrono::milliseconds(500));
  EXPECT_THROW(parse_time("yesterday"), InvalidArgument);
  EXPECT_FALSE(parse_time_or_null(""));
}

}  // namespace
}  // namespace longhaul::api
