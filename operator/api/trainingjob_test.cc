// Tests for the TrainingJob API types: defaults, field-path errors, status round trips and the
// condition helpers' transition-time rule.
#include "longhaul/api/trainingjob.h"

#include <gtest/gtest.h>

#include "longhaul/api/validation.h"
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
  EXPECT_EQ(s.run_policy.restart_scope, RestartScope::kReplica);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kRunning);
  EXPECT_FALSE(s.run_policy.suspend);
  EXPECT_EQ(s.success_policy, SuccessPolicy::kChiefSucceeds);
  EXPECT_EQ(s.progress_interval_seconds, 30);
  ASSERT_TRUE(s.chief());
  EXPECT_EQ(s.chief()->first, ReplicaType::kWorker);
}

// "Pod", the former name of Replica, still parses (stored objects keep working) and is written
// back under its new name.
TEST(ParseSpec, RestartScopePodIsReadAsReplica) {
  json j = minimal_spec();
  j["runPolicy"] = {{"restartScope", "Pod"}};
  const TrainingJobSpec s = parse_spec(j);
  EXPECT_EQ(s.run_policy.restart_scope, RestartScope::kReplica);
  EXPECT_EQ(to_json(s)["runPolicy"]["restartScope"], "Replica");
}

// The recovery state survives an operator restart only through the status round trip.
TEST(ParseStatus, RecoveryFieldsRoundTrip) {
  TrainingJobStatus st;
  st.group_restart_attempt = 4;
  st.recoveries = 3;
  st.recovering_since = "2026-11-21T13:20:39.250000Z";
  st.last_recovery_milliseconds = 4250;
  st.replica_failures["j-worker-1"] = ReplicaFailures{2, "2026-11-21T13:10:00Z"};
  const TrainingJobStatus back = parse_status(to_json(st));
  EXPECT_EQ(back, st);
  EXPECT_EQ(parse_time(st.recovering_since) - parse_time("2026-11-21T13:20:39Z"),
            std::chrono::milliseconds(250));
  EXPECT_EQ(format_micro_time(parse_time("2026-11-21T13:20:39Z") + std::chrono::microseconds(7)),
            "2026-11-21T13:20:39.000007Z");
  // A status written before these fields existed reads as "no group attempt recorded".
  EXPECT_FALSE(parse_status(json::object()).group_restart_attempt);
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
  j["runPolicy"] = json::parse(R"({"backoffLimit": 2, "restartScope": "Group",
      "retryableExitCodes": [3], "permanentExitCodes": [137], "backoff": {"initialSeconds": 1,
      "maxSeconds": 4}, "nodeLostTimeoutSeconds": 5, "activeDeadlineSeconds": 60,
      "ttlSecondsAfterFinished": 0, "cleanPodPolicy": "All", "suspend": true})");
  j["successPolicy"] = "AllWorkers";
  const TrainingJobSpec s = parse_spec(j);
  EXPECT_EQ(s.logdir.storage_class_name, "nfs");
  EXPECT_EQ(s.logdir.reclaim_policy, ReclaimPolicy::kDelete);
  EXPECT_EQ(s.run_policy.restart_scope, RestartScope::kGroup);
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
        BadSpec{"ProgressIntervalBelowTheMinimum", R"({"progressIntervalSeconds":1})",
                "spec.progressIntervalSeconds: must be >= 5"},
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

// What the API server would refuse when the operator creates the pods: each is caught before
// any pod is created, with the TrainingJob field path and what to change.
struct UnrunnableSpec {
  const char* name;
  const char* container;       // merged onto the Worker's first container {"name":"w","image":"i"}
  const char* template_patch;  // merged onto the Worker's template
  const char* message_prefix;
  const char* advice;  // a fragment of the message telling what to change
};
void PrintTo(const UnrunnableSpec& c, std::ostream* os) { *os << c.name; }

class PodCreateWouldBeRefused : public ::testing::TestWithParam<UnrunnableSpec> {};

TEST_P(PodCreateWouldBeRefused, FailsValidationNamingTheField) {
  json j = minimal_spec();
  json& tmpl = j["replicaSpecs"]["Worker"]["template"];
  tmpl["spec"]["containers"][0].merge_patch(json::parse(GetParam().container));
  tmpl.merge_patch(json::parse(GetParam().template_patch));
  const TrainingJobSpec s = parse_spec(j);
  try {
    validate_runnable(s, "job");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(GetParam().message_prefix, 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(GetParam().advice), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, PodCreateWouldBeRefused,
    ::testing::Values(
        UnrunnableSpec{"UpperCaseContainerName", R"({"name":"Trainer"})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].name: invalid "
                       "container name \"Trainer\"",
                       "DNS-1123 label"},
        UnrunnableSpec{"UnderscoreContainerName", R"({"name":"my_trainer"})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].name", "DNS-1123"},
        UnrunnableSpec{"DuplicateContainerName", "{}",
                       R"({"spec":{"initContainers":[{"name":"w","image":"i"}]}})",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].name: duplicate",
                       "its own name"},
        UnrunnableSpec{"MissingImage", R"({"image":""})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].image: is required",
                       "required"},
        UnrunnableSpec{"PortNameTooLong",
                       R"({"ports":[{"name":"prometheus-metrics","containerPort":9400}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].ports[0].name: "
                       "invalid port name \"prometheus-metrics\"",
                       "at most 15"},
        UnrunnableSpec{"PortNameUpperCase",
                       R"({"ports":[{"name":"Metrics","containerPort":9400}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].ports[0].name",
                       "IANA service name"},
        UnrunnableSpec{"PortNameAllDigits", R"({"ports":[{"name":"9400","containerPort":9400}]})",
                       "{}", "spec.replicaSpecs.Worker.template.spec.containers[0].ports[0].name",
                       "at least one letter"},
        UnrunnableSpec{
            "DuplicatePortName",
            R"({"ports":[{"name":"m","containerPort":1},{"name":"m","containerPort":2}]})", "{}",
            "spec.replicaSpecs.Worker.template.spec.containers[0].ports[1].name: "
            "duplicate port name",
            "unique"},
        UnrunnableSpec{"PortOutOfRange", R"({"ports":[{"containerPort":70000}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].ports[0]."
                       "containerPort",
                       "between 1 and 65535"},
        UnrunnableSpec{"BadProtocol", R"({"ports":[{"containerPort":80,"protocol":"HTTP"}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].ports[0].protocol",
                       "TCP, UDP or SCTP"},
        UnrunnableSpec{"EnvNameStartsWithDigit", R"({"env":[{"name":"1X","value":"a"}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].env[0].name: "
                       "invalid environment variable name \"1X\"",
                       "must not start with a digit"},
        UnrunnableSpec{"EnvNameWithSpace", R"({"env":[{"name":"MY VAR","value":"a"}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].env[0].name",
                       "letters, digits"},
        UnrunnableSpec{"EnvValueNotString", R"({"env":[{"name":"N","value":1}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].env[0].value",
                       "must be a string"},
        UnrunnableSpec{"BadMemoryQuantity", R"({"resources":{"limits":{"memory":"2GB"}}})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].resources.limits["
                       "memory]: invalid quantity \"2GB\"",
                       "16Gi"},
        UnrunnableSpec{"NegativeCpu", R"({"resources":{"requests":{"cpu":"-1"}}})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].resources.requests["
                       "cpu]",
                       ">= 0"},
        UnrunnableSpec{"RequestAboveLimit",
                       R"({"resources":{"requests":{"cpu":"2"},"limits":{"cpu":"1500m"}}})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].resources.requests["
                       "cpu]",
                       "less than or equal to limits[cpu]"},
        UnrunnableSpec{"FractionalGpu", R"({"resources":{"limits":{"nvidia.com/gpu":"0.5"}}})",
                       "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].resources.limits["
                       "nvidia.com/gpu]",
                       "whole numbers"},
        UnrunnableSpec{"GpuRequestWithoutLimit",
                       R"({"resources":{"requests":{"nvidia.com/gpu":"1"}}})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].resources.limits["
                       "nvidia.com/gpu]: is required",
                       "equal to the request"},
        UnrunnableSpec{"UnknownResourceName", R"({"resources":{"limits":{"gpu":"1"}}})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].resources.limits["
                       "gpu]: unknown resource name",
                       "nvidia.com/gpu"},
        UnrunnableSpec{"MountOfUnknownVolume",
                       R"({"volumeMounts":[{"name":"data","mountPath":"/data"}]})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].volumeMounts[0]."
                       "name: volume \"data\" is not in template.spec.volumes",
                       "add it there"},
        UnrunnableSpec{
            "SamePathMountedTwice",
            R"({"volumeMounts":[{"name":"d","mountPath":"/d"},{"name":"d","mountPath":"/d"}]})",
            R"({"spec":{"volumes":[{"name":"d","emptyDir":{}}]}})",
            "spec.replicaSpecs.Worker.template.spec.containers[0].volumeMounts[1]."
            "mountPath",
            "must be unique"},
        UnrunnableSpec{"BadVolumeName", "{}",
                       R"({"spec":{"volumes":[{"name":"Data","emptyDir":{}}]}})",
                       "spec.replicaSpecs.Worker.template.spec.volumes[0].name: invalid volume "
                       "name",
                       "DNS-1123 label"},
        UnrunnableSpec{"LabelValueWithSpace", "{}",
                       R"({"metadata":{"labels":{"team":"ml research"}}})",
                       "spec.replicaSpecs.Worker.template.metadata.labels[team]: invalid value",
                       "at most 63 characters"},
        UnrunnableSpec{
            "LabelValueTooLong", "{}",
            R"({"metadata":{"labels":{"team":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}})",
            "spec.replicaSpecs.Worker.template.metadata.labels[team]", "at most 63"},
        UnrunnableSpec{"LabelKeyInvalid", "{}", R"({"metadata":{"labels":{"-team":"a"}}})",
                       "spec.replicaSpecs.Worker.template.metadata.labels: key \"-team\"",
                       "qualified name"},
        UnrunnableSpec{
            "AnnotationKeyInvalid", "{}", R"({"metadata":{"annotations":{"Example.com/x":"a"}}})",
            "spec.replicaSpecs.Worker.template.metadata.annotations: key", "qualified name"},
        UnrunnableSpec{
            "NodeSelectorValueInvalid", "{}", R"({"spec":{"nodeSelector":{"pool":"gpu pool"}}})",
            "spec.replicaSpecs.Worker.template.spec.nodeSelector[pool]", "at most 63 characters"},
        UnrunnableSpec{
            "BadServiceAccountName", "{}", R"({"spec":{"serviceAccountName":"Trainer_SA"}})",
            "spec.replicaSpecs.Worker.template.spec.serviceAccountName", "DNS-1123 subdomain"},
        UnrunnableSpec{"BadPullPolicy", R"({"imagePullPolicy":"Sometimes"})", "{}",
                       "spec.replicaSpecs.Worker.template.spec.containers[0].imagePullPolicy",
                       "Always, IfNotPresent or Never"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ValidateRunnable, AcceptsWhatKubernetesAccepts) {
  json j = minimal_spec();
  json& tmpl = j["replicaSpecs"]["Worker"]["template"];
  tmpl["metadata"] = json::parse(
      R"({"labels":{"app.kubernetes.io/name":"gpt2","team":"ml.research_1"},
          "annotations":{"example.com/note":"any text at all"}})");
  tmpl["spec"] = json::parse(R"({
    "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
    "serviceAccountName": "trainer",
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
    "containers": [{"name": "trainer-0", "image": "registry.example/lh:0.1",
      "ports": [{"name": "longhaul", "containerPort": 2222}, {"name": "metrics", "containerPort": 9400}],
      "env": [{"name": "OPENBLAS_CORETYPE", "value": "Haswell"}, {"name": "my.var-x", "value": ""}],
      "resources": {"requests": {"cpu": "500m", "memory": "1.5Gi", "nvidia.com/gpu": 8},
                    "limits": {"cpu": "2", "memory": "2e9", "nvidia.com/gpu": "8"}},
      "volumeMounts": [{"name": "data", "mountPath": "/data"},
                       {"name": "longhaul-logdir", "mountPath": "/logdir"}]}]})");
  EXPECT_NO_THROW(validate_runnable(parse_spec(j), "gpt2"));
}

// A worker's grace_period_secs given on its command line against the pod's
// terminationGracePeriodSeconds: the kubelet must not kill the worker before its final
// checkpoint. (Regression: they were tied only by a comment in an example manifest.)
struct GraceCase {
  const char* name;
  const char* container;  // merged onto the Worker's first container
  const char* pod_spec;   // merged onto the Worker's template spec
  const char* error;      // "" when the spec is runnable, else the start of the message
};
void PrintTo(const GraceCase& c, std::ostream* os) { *os << c.name; }

class GracePeriod : public ::testing::TestWithParam<GraceCase> {};

TEST_P(GracePeriod, WorkerGraceMustEndBeforeThePodsGrace) {
  json j = minimal_spec();
  json& tmpl = j["replicaSpecs"]["Worker"]["template"];
  tmpl["spec"]["containers"][0].merge_patch(json::parse(GetParam().container));
  tmpl["spec"].merge_patch(json::parse(GetParam().pod_spec));
  const TrainingJobSpec s = parse_spec(j);
  if (std::string(GetParam().error).empty()) {
    EXPECT_NO_THROW(validate_runnable(s, "job"));
    return;
  }
  try {
    validate_runnable(s, "job");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(GetParam().error, 0), 0u) << what;
    EXPECT_NE(what.find("set terminationGracePeriodSeconds above grace_period_secs"),
              std::string::npos)
        << what;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, GracePeriod,
    ::testing::Values(
        GraceCase{"BelowThePodsGrace", R"({"args": ["train", "--set=grace_period_secs=25"]})",
                  R"({"terminationGracePeriodSeconds": 30})", ""},
        GraceCase{"BelowTheDefault30", R"({"args": ["--set", "grace_period_secs=29.5"]})", "{}",
                  ""},
        GraceCase{"NotSetOnTheCommandLine", R"({"args": ["--set=supervisor.stop_grace_secs=90"]})",
                  R"({"terminationGracePeriodSeconds": 5})", ""},
        GraceCase{"EqualToThePodsGrace",
                  R"({"command": ["longhaul-worker", "train", "--set=grace_period_secs=60"]})",
                  R"({"terminationGracePeriodSeconds": 60})",
                  "spec.replicaSpecs.Worker.template.spec.containers[0].command[2]: "
                  "grace_period_secs=60 is not below "
                  "spec.replicaSpecs.Worker.template.spec.terminationGracePeriodSeconds (60)"},
        GraceCase{"AboveTheDefault30", R"({"args": ["train", "--set", "grace_period_secs=45"]})",
                  "{}",
                  "spec.replicaSpecs.Worker.template.spec.containers[0].args[2]: "
                  "grace_period_secs=45 is not below "
                  "spec.replicaSpecs.Worker.template.spec.terminationGracePeriodSeconds (30)"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Quantity, ParsesKubernetesGrammar) {
  EXPECT_DOUBLE_EQ(static_cast<double>(parse_quantity("500m").value()), 0.5);
  EXPECT_DOUBLE_EQ(static_cast<double>(parse_quantity("2Ki").value()), 2048.0);
  EXPECT_DOUBLE_EQ(static_cast<double>(parse_quantity("1e3").value()), 1000.0);
  EXPECT_DOUBLE_EQ(static_cast<double>(parse_quantity(".5").value()), 0.5);
  EXPECT_DOUBLE_EQ(static_cast<double>(parse_quantity("+3").value()), 3.0);
  for (const char* bad : {"", "Gi", "2GB", "1.2.3", "1 Gi", "e3", "1e", "5i"}) {
    EXPECT_FALSE(parse_quantity(bad)) << bad;
  }
}

TEST(Limits, AThousandReplicasPerTypeIsTheLargestJob) {
  json j = minimal_spec();
  j["replicaSpecs"]["Worker"]["replicas"] = kMaxReplicasPerType;
  EXPECT_NO_THROW(parse_spec(j));
  j["replicaSpecs"]["Worker"]["replicas"] = kMaxReplicasPerType + 1;
  try {
    parse_spec(j);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "spec.replicaSpecs.Worker.replicas: must be <= 1000");
  }
}

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
  s.replica_statuses["Worker"] = ReplicaStatus{3, 2, 1, 0, 0};
  s.pods["job-worker-0"] = PodRecord{3, true, 1};
  s.restart_count = 4;
  s.preemption_count = 3;
  s.failure_count = 1;
  s.chief_pod = "job-worker-0";
  s.restart_attempt = 3;
  s.observed_generation = 2;
  s.start_time = "2026-11-21T13:00:00Z";
  s.pod_statuses = {{"job-worker-0", "Running", ""}, {"job-worker-2", "Pending", "NotCreated"}};
  s.pod_statuses_omitted = 1;
  s.progress = TrainingProgress{
      1200,           5000, 1000,     "2026-11-21T12:59:00Z", "2026-11-21T13:00:06Z", "1200/5000",
      "job-worker-0", 2.41, "26m16s", "2026-11-21T13:26:21Z", "2026-11-21T13:00:05Z"};
  set_condition(s, condition::kRunning, "True", reason::kAllReplicasRunning, "",
                parse_time("2026-11-21T13:00:05Z"));
  const json j = to_json(s);
  EXPECT_EQ(j["progress"]["steps"], "1200/5000");
  EXPECT_EQ(j["progress"]["lastCheckpointTime"], "2026-11-21T12:59:00Z");
  EXPECT_EQ(j["progress"]["stepsPerSecond"], 2.41);
  EXPECT_EQ(j["progress"]["eta"], "26m16s");
  EXPECT_EQ(j["progress"]["estimatedCompletionTime"], "2026-11-21T13:26:21Z");
  EXPECT_EQ(j["progress"]["lastStepTime"], "2026-11-21T13:00:05Z");
  EXPECT_EQ(j["replicaStatuses"]["Worker"]["ready"], 1);
  EXPECT_EQ(j["replicaStatuses"]["Worker"]["replicas"], 3);
  EXPECT_EQ(j["unsettledPods"]["job-worker-[0]"]["restartAttempt"], 3);
  EXPECT_FALSE(j.contains("pods"));
  EXPECT_EQ(j["podStatuses"][1]["reason"], "NotCreated");
  EXPECT_EQ(j["podStatusesOmitted"], 1);
  EXPECT_EQ(j["conditions"][0]["lastTransitionTime"], "2026-11-21T13:00:05Z");
  EXPECT_EQ(parse_status(j), s);
}

// A 1000-replica job once wrote one status entry per pod (hundreds of KB rewritten on every
// status write); unsettled pods with equal records (a group restart's) share one range key.
TEST(Status, PodRecordsOfALargeJobStayBounded) {
  TrainingJobStatus s;
  for (int i = 0; i < kMaxReplicasPerType; ++i) {
    s.pods["big-worker-" + std::to_string(i)] = PodRecord{2, true, 0};
  }
  s.pods["big-chief-0"] = PodRecord{2, true, 0};
  s.pods["big-worker-7"] = PodRecord{3, false, 0};  // one pod restarted on its own
  s.pods["big-worker-8"] = PodRecord{2, true, 4};   // one pod's containers restarted
  const json j = to_json(s);
  EXPECT_EQ(j["unsettledPods"].size(), 4u) << j["unsettledPods"].dump();
  EXPECT_TRUE(j["unsettledPods"].contains("big-worker-[0-6,9-999]")) << j["unsettledPods"].dump();
  EXPECT_LT(j.dump().size(), 1024u);
  EXPECT_EQ(parse_status(j), s);
}

TEST(Status, ReadsPodRecordsKeyedByPodName) {  // status written by earlier versions
  const auto s = parse_status(json::parse(
      R"({"pods": {"j-worker-0": {"restartAttempt": 1, "created": true, "containerRestarts": 0},
                   "j-worker-[1-2]": {"restartAttempt": 1, "created": true}}})"));
  ASSERT_EQ(s.pods.size(), 3u);
  EXPECT_EQ(s.pods.at("j-worker-2"), (PodRecord{1, true, 0}));
  EXPECT_TRUE(s.legacy_pods);
  // Written back as it was read, so that a reconcile that settles them sees a change.
  EXPECT_TRUE(to_json(s).contains("pods"));
  EXPECT_FALSE(to_json(s).contains("unsettledPods"));
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
