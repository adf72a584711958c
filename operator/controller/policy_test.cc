// Table-driven tests of the failure/restart, success and clean-up policies.
#include <gtest/gtest.h>

#include "longhaul/controller/cleanup_policy.h"
#include "longhaul/controller/failure_policy.h"
#include "longhaul/controller/success_policy.h"

namespace longhaul::controller {
namespace {

using api::ReplicaType;

json failed_pod(int exit_code) {
  return {{"metadata", {{"name", "j-worker-1"}, {"namespace", "ns"}}},
          {"status",
           {{"phase", "Failed"},
            {"containerStatuses",
             {{{"name", "trainer"},
               {"restartCount", 0},
               {"state", {{"terminated", {{"exitCode", exit_code}}}}}}}}}}};
}

struct ClassifyCase {
  const char* name;
  json pod;
  api::RestartPolicy restart_policy;
  std::vector<int32_t> retryable, permanent;
  PodOutcome want;
  const char* message_part;
};
void PrintTo(const ClassifyCase& c, std::ostream* os) { *os << c.name; }

class ClassifyPod : public ::testing::TestWithParam<ClassifyCase> {};

TEST_P(ClassifyPod, DecidesTheOutcome) {
  const ClassifyCase& c = GetParam();
  api::ReplicaSpec replica;
  replica.restart_policy = c.restart_policy;
  api::RunPolicy policy;
  policy.retryable_exit_codes = c.retryable;
  policy.permanent_exit_codes = c.permanent;
  const PodClassification got = classify_pod(c.pod, replica, policy);
  EXPECT_EQ(outcome_name(got.outcome), outcome_name(c.want));
  EXPECT_NE(got.message.find(c.message_part), std::string::npos) << got.message;
}

json with_status(json pod, const json& status_patch) {
  pod["status"].merge_patch(status_patch);
  return pod;
}

const auto kExitCode = api::RestartPolicy::kExitCode;

INSTANTIATE_TEST_SUITE_P(
    Table, ClassifyPod,
    ::testing::Values(
        ClassifyCase{"Exit1Permanent",
                     failed_pod(1),
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kPermanentFailure,
                     "container trainer exited with code 1"},
        ClassifyCase{"Exit137Retryable",
                     failed_pod(137),
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kRetryableFailure,
                     "code 137"},
        ClassifyCase{"Exit138Retryable",
                     failed_pod(138),
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kRetryableFailure,
                     "code 138"},
        ClassifyCase{"ListedRetryable",
                     failed_pod(3),
                     kExitCode,
                     {3},
                     {},
                     PodOutcome::kRetryableFailure,
                     "code 3"},
        ClassifyCase{"ListedPermanent",
                     failed_pod(137),
                     kExitCode,
                     {},
                     {137},
                     PodOutcome::kPermanentFailure,
                     "code 137"},
        ClassifyCase{"NeverPolicyFailsOnRetryableCode",
                     failed_pod(137),
                     api::RestartPolicy::kNever,
                     {},
                     {},
                     PodOutcome::kPermanentFailure,
                     "restartPolicy is Never"},
        ClassifyCase{"DisruptionTargetBeatsExitCode",
                     with_status(failed_pod(1), {{"conditions",
                                                  {{{"type", "DisruptionTarget"},
                                                    {"status", "True"},
                                                    {"reason", "PreemptionByScheduler"}}}}}),
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kDisrupted,
                     "PreemptionByScheduler"},
        ClassifyCase{"EvictedReason",
                     with_status(failed_pod(143), {{"reason", "Evicted"}}),
                     api::RestartPolicy::kNever,
                     {},
                     {},
                     PodOutcome::kDisrupted,
                     "Evicted"},
        ClassifyCase{"NodeShutdownReason",
                     with_status(failed_pod(143), {{"reason", "NodeShutdown"}}),
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kDisrupted,
                     "NodeShutdown"},
        ClassifyCase{
            "DeletedUnderUs",
            json{{"metadata", {{"name", "p"}, {"deletionTimestamp", "2026-11-21T13:00:00Z"}}},
                 {"status", {{"phase", "Running"}}}},
            kExitCode,
            {},
            {},
            PodOutcome::kDisrupted,
            "Deleted"},
        ClassifyCase{"FailedWithoutExitCodeRetries",
                     json{{"metadata", {{"name", "p"}}}, {"status", {{"phase", "Failed"}}}},
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kRetryableFailure,
                     "no exit code"},
        ClassifyCase{"RunningIsActive",
                     json{{"metadata", {{"name", "p"}}}, {"status", {{"phase", "Running"}}}},
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kActive,
                     ""},
        ClassifyCase{"SucceededEvenIfDisruptionConditionLingers",
                     json{{"metadata", {{"name", "p"}}},
                          {"status",
                           {{"phase", "Succeeded"},
                            {"conditions", {{{"type", "DisruptionTarget"}, {"status", "True"}}}}}}},
                     kExitCode,
                     {},
                     {},
                     PodOutcome::kSucceeded,
                     ""}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ExitCodes, DefaultClassesAndOverrides) {
  api::RunPolicy p;
  for (int code : {1, 2, 3, 4, 127}) {
    EXPECT_EQ(classify_exit_code(code, p), ExitCodeClass::kPermanent) << code;
  }
  for (int code : {128, 137, 138, 143, 255}) {
    EXPECT_EQ(classify_exit_code(code, p), ExitCodeClass::kRetryable) << code;
  }
  p.retryable_exit_codes = {4};
  p.permanent_exit_codes = {143};
  EXPECT_EQ(classify_exit_code(4, p), ExitCodeClass::kRetryable);
  EXPECT_EQ(classify_exit_code(143, p), ExitCodeClass::kPermanent);
}

TEST(ContainerRestarts, SumsEveryContainer) {
  const json pod = {
      {"status", {{"containerStatuses", {{{"restartCount", 2}}, {{"restartCount", 3}}}}}}};
  EXPECT_EQ(container_restarts(pod), 5);
  EXPECT_EQ(container_restarts(json::object()), 0);
}

struct BackoffCase {
  int n;
  double jitter;
  int64_t want_ms;
};
void PrintTo(const BackoffCase& c, std::ostream* os) { *os << "n=" << c.n; }
class RestartBackoff : public ::testing::TestWithParam<BackoffCase> {};
TEST_P(RestartBackoff, GrowsExponentiallyWithJitterAndCap) {
  api::BackoffSpec b{10, 300};
  EXPECT_EQ(restart_backoff(b, GetParam().n, GetParam().jitter).count(), GetParam().want_ms);
}
INSTANTIATE_TEST_SUITE_P(Table, RestartBackoff,
                         ::testing::Values(BackoffCase{0, 0.5, 0}, BackoffCase{1, 0.0, 10000},
                                           BackoffCase{2, 0.0, 20000}, BackoffCase{3, 0.5, 44000},
                                           BackoffCase{6, 0.0, 300000},
                                           BackoffCase{40, 0.9, 300000}));

api::TrainingJobSpec spec_with(int chiefs, int workers, api::SuccessPolicy policy) {
  api::TrainingJobSpec s;
  if (chiefs > 0) s.replica_specs[ReplicaType::kChief].replicas = chiefs;
  s.replica_specs[ReplicaType::kWorker].replicas = workers;
  s.success_policy = policy;
  return s;
}

TEST(SuccessPolicy, ChiefSucceedsLooksOnlyAtTheChief) {
  const auto s = spec_with(0, 2, api::SuccessPolicy::kChiefSucceeds);
  PodOutcomes o{{{ReplicaType::kWorker, 0}, PodOutcome::kActive},
                {{ReplicaType::kWorker, 1}, PodOutcome::kSucceeded}};
  EXPECT_FALSE(job_succeeded(s, o, "ns/j-worker-0"));
  o[{ReplicaType::kWorker, 0}] = PodOutcome::kSucceeded;
  o[{ReplicaType::kWorker, 1}] = PodOutcome::kActive;
  const auto d = job_succeeded(s, o, "ns/j-worker-0");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->reason, api::reason::kChiefSucceeded);
  EXPECT_EQ(d->message, "chief pod ns/j-worker-0 succeeded");
}

TEST(SuccessPolicy, ChiefReplicaIsTheChiefWhenPresent) {
  const auto s = spec_with(1, 2, api::SuccessPolicy::kChiefSucceeds);
  PodOutcomes o{{{ReplicaType::kWorker, 0}, PodOutcome::kSucceeded}};
  EXPECT_FALSE(job_succeeded(s, o, "x"));
  o[{ReplicaType::kChief, 0}] = PodOutcome::kSucceeded;
  EXPECT_TRUE(job_succeeded(s, o, "x"));
}

TEST(SuccessPolicy, AllWorkersNeedsEveryWorker) {
  const auto s = spec_with(0, 2, api::SuccessPolicy::kAllWorkers);
  PodOutcomes o{{{ReplicaType::kWorker, 0}, PodOutcome::kSucceeded}};
  EXPECT_FALSE(job_succeeded(s, o, "x"));
  o[{ReplicaType::kWorker, 1}] = PodOutcome::kSucceeded;
  ASSERT_TRUE(job_succeeded(s, o, "x"));
  EXPECT_EQ(job_succeeded(s, o, "x")->reason, api::reason::kAllWorkersSucceeded);
}

struct CleanCase {
  const char* name;
  api::CleanPodPolicy policy;
  bool deadline;
  const char* phase;
  bool terminating;
  bool want;
};
void PrintTo(const CleanCase& c, std::ostream* os) { *os << c.name; }
class CleanPod : public ::testing::TestWithParam<CleanCase> {};
TEST_P(CleanPod, FollowsThePolicy) {
  const CleanCase& c = GetParam();
  json pod = {{"metadata", {{"name", "p"}}}, {"status", {{"phase", c.phase}}}};
  if (c.terminating) pod["metadata"]["deletionTimestamp"] = "2026-11-21T13:00:00Z";
  EXPECT_EQ(should_clean_pod(c.policy, c.deadline, pod), c.want);
}
INSTANTIATE_TEST_SUITE_P(
    Table, CleanPod,
    ::testing::Values(
        CleanCase{"RunningDeletesRunning", api::CleanPodPolicy::kRunning, false, "Running", false,
                  true},
        CleanCase{"RunningKeepsFinished", api::CleanPodPolicy::kRunning, false, "Succeeded", false,
                  false},
        CleanCase{"AllDeletesFinished", api::CleanPodPolicy::kAll, false, "Failed", false, true},
        CleanCase{"NoneKeepsRunning", api::CleanPodPolicy::kNone, false, "Running", false, false},
        CleanCase{"DeadlineStopsRunningEvenUnderNone", api::CleanPodPolicy::kNone, true, "Running",
                  false, true},
        CleanCase{"AlreadyTerminatingIsLeftAlone", api::CleanPodPolicy::kAll, false, "Running",
                  true, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Ttl, CountsFromCompletionTime) {
  api::RunPolicy p;
  api::TrainingJobStatus s;
  const api::Time now = api::parse_time("2026-11-21T13:00:10Z");
  EXPECT_FALSE(ttl_remaining(p, s, now));
  p.ttl_seconds_after_finished = 30;
  s.phase = std::string(api::phase::kSucceeded);
  s.completion_time = "2026-11-21T13:00:00Z";
  EXPECT_EQ(*ttl_remaining(p, s, now), std::chrono::seconds(20));
  s.phase = std::string(api::phase::kRunning);
  EXPECT_FALSE(ttl_remaining(p, s, now));
}

}  // namespace
}  // namespace longhaul::controller
