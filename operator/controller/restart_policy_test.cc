// Table-driven tests of the restart decision (restart_policy.h) and of restartScope Replica's
// part of it (recovery_policy.h): given the pods a pass classified and the status counters,
// what the job does next. The decisions are values; nothing is applied here.
#include "longhaul/controller/restart_policy.h"

#include <gtest/gtest.h>

#include "longhaul/controller/recovery_policy.h"

namespace longhaul::controller {
namespace {

using api::ReplicaType;
using std::chrono::seconds;

const api::Time kNow = api::parse_time("2026-11-21T13:20:39Z");

// A chief and two workers, backoffLimit 6.
api::TrainingJobSpec spec_with(api::RestartScope scope) {
  api::TrainingJobSpec spec = api::parse_spec(json::parse(R"({
    "replicaSpecs": {
      "Chief": {"template": {"spec": {"containers": [{"name": "t", "image": "lh"}]}}},
      "Worker": {"replicas": 2,
                 "template": {"spec": {"containers": [{"name": "t", "image": "lh"}]}}}
    },
    "runPolicy": {"backoffLimit": 6}
  })"));
  spec.run_policy.restart_scope = scope;
  return spec;
}

LostPod disrupted(const std::string& pod) {
  return {pod,
          {PodOutcome::kDisrupted, std::string(api::reason::kPreempted),
           "pod ns/" + pod + " was preempted", std::nullopt}};
}
LostPod retryable(const std::string& pod, int exit_code = 137) {
  return {pod,
          {PodOutcome::kRetryableFailure, std::string(api::reason::kRetryableExit),
           "pod ns/" + pod + " exited " + std::to_string(exit_code), exit_code}};
}
LostPod permanent(const std::string& pod) {
  return {pod,
          {PodOutcome::kPermanentFailure, std::string(api::reason::kPermanentExit),
           "pod ns/" + pod + " exited 1", 1}};
}

// The replica's failure record after `n` failures counted at `since`.
std::map<std::string, api::ReplicaFailures> failed_before(const std::string& pod, int32_t n,
                                                          api::Time since) {
  return {{pod, api::ReplicaFailures{n, api::format_time(since)}}};
}

struct DecideCase {
  const char* name;
  api::RestartScope scope;
  std::vector<LostPod> disrupted, retryable, permanent;
  bool chief_succeeded = false;
  int32_t failure_count = 0;
  std::map<std::string, api::ReplicaFailures> replica_failures;
  RestartDecision want;  // replica_failures: compared only when `check_failures`
  bool check_failures = false;
};
void PrintTo(const DecideCase& c, std::ostream* os) { *os << c.name; }

RestartDecision::Finish failed(std::string_view reason, std::string message) {
  return {std::string(api::phase::kFailed), std::string(reason), std::move(message)};
}

class DecideRestart : public ::testing::TestWithParam<DecideCase> {};

TEST_P(DecideRestart, DecidesWhatTheJobDoesNext) {
  const DecideCase& c = GetParam();
  const api::TrainingJobSpec spec = spec_with(c.scope);
  ClassifiedPods pods;
  pods.disrupted = c.disrupted;
  pods.retryable = c.retryable;
  pods.permanent = c.permanent;
  pods.outcomes[{ReplicaType::kChief, 0}] =
      c.chief_succeeded ? PodOutcome::kSucceeded : PodOutcome::kActive;
  for (const auto& p : c.disrupted) pods.outcomes[{ReplicaType::kWorker, 0}] = p.c.outcome;
  const RestartDecision got = decide_restart(
      {spec, pods, "ns/j-chief-0", c.failure_count, "ns/j-worker-1", c.replica_failures, kNow});
  RestartDecision want = c.want;
  if (!c.check_failures) want.replica_failures = got.replica_failures;
  EXPECT_EQ(got.disruptions, want.disruptions);
  EXPECT_EQ(got.failures, want.failures);
  EXPECT_EQ(got.abandoned_recovery.has_value(), want.abandoned_recovery.has_value());
  if (got.abandoned_recovery && want.abandoned_recovery) {
    EXPECT_EQ(got.abandoned_recovery->reason, want.abandoned_recovery->reason);
    EXPECT_EQ(got.abandoned_recovery->message, want.abandoned_recovery->message);
  }
  ASSERT_EQ(got.replacements.size(), want.replacements.size());
  for (size_t i = 0; i < got.replacements.size(); ++i) {
    EXPECT_EQ(got.replacements[i].pod, want.replacements[i].pod) << i;
    EXPECT_EQ(got.replacements[i].reason, want.replacements[i].reason) << i;
    EXPECT_EQ(got.replacements[i].message, want.replacements[i].message) << i;
  }
  ASSERT_EQ(got.group_restart.has_value(), want.group_restart.has_value());
  if (got.group_restart) {
    EXPECT_EQ(got.group_restart->reason, want.group_restart->reason);
    EXPECT_EQ(got.group_restart->message, want.group_restart->message);
    EXPECT_EQ(got.group_restart->after_backoff, want.group_restart->after_backoff);
  }
  ASSERT_EQ(got.finish.has_value(), want.finish.has_value());
  if (got.finish) {
    EXPECT_EQ(got.finish->phase, want.finish->phase);
    EXPECT_EQ(got.finish->reason, want.finish->reason);
    EXPECT_EQ(got.finish->message, want.finish->message);
  }
  EXPECT_EQ(got.replica_failures, want.replica_failures);
}

const std::string kWindowStart = api::format_time(kNow - seconds(60));

INSTANTIATE_TEST_SUITE_P(
    Table, DecideRestart,
    ::testing::Values(
        DecideCase{.name = "NothingLostDecidesNothing",
                   .scope = api::RestartScope::kReplica,
                   .replica_failures = failed_before("j-worker-0", 1, kNow - seconds(60)),
                   .want = {.replica_failures = failed_before("j-worker-0", 1, kNow - seconds(60))},
                   .check_failures = true},
        DecideCase{
            .name = "ChiefSucceededWinsOverALostWorker",
            .scope = api::RestartScope::kGroup,
            .disrupted = {disrupted("j-worker-0")},
            .chief_succeeded = true,
            .want = {.finish = RestartDecision::Finish{std::string(api::phase::kSucceeded),
                                                       std::string(api::reason::kChiefSucceeded),
                                                       "chief pod ns/j-chief-0 succeeded"}}},
        DecideCase{
            .name = "PermanentFailureFailsTheJob",
            .scope = api::RestartScope::kReplica,
            .disrupted = {disrupted("j-worker-0")},
            .permanent = {permanent("j-worker-1")},
            .want = {.finish = failed(api::reason::kPermanentExit, "pod ns/j-worker-1 exited 1")}},
        DecideCase{.name = "ContainerRestartsPastTheLimitFailTheJob",
                   .scope = api::RestartScope::kGroup,
                   .failure_count = 7,
                   .want = {.finish = failed(api::reason::kBackoffLimitExceeded,
                                             "backoffLimit 6 exceeded (7 failures): pod "
                                             "ns/j-worker-1 restarted its containers")}},
        DecideCase{.name = "GroupDisruptionsRestartAtOnceWithoutBudget",
                   .scope = api::RestartScope::kGroup,
                   .disrupted = {disrupted("j-worker-0"), disrupted("j-worker-1")},
                   .retryable = {retryable("j-chief-0")},
                   .failure_count = 2,
                   .want = {.disruptions = 2,
                            .group_restart =
                                RestartDecision::GroupRestart{
                                    std::string(api::reason::kPreempted),
                                    "pod ns/j-worker-0 was preempted and 1 more (no failure budget "
                                    "spent)",
                                    false}}},
        DecideCase{.name = "GroupRetryableFailureSpendsOneAndBacksOff",
                   .scope = api::RestartScope::kGroup,
                   .retryable = {retryable("j-worker-1"), retryable("j-worker-0")},
                   .failure_count = 2,
                   .want = {.failures = 1,
                            .group_restart =
                                RestartDecision::GroupRestart{
                                    std::string(api::reason::kRetryableExit),
                                    "pod ns/j-worker-1 exited 137, failures 3/6", true}}},
        DecideCase{.name = "GroupRetryableFailurePastTheLimitFailsTheJob",
                   .scope = api::RestartScope::kGroup,
                   .retryable = {retryable("j-worker-1")},
                   .failure_count = 6,
                   .want = {.failures = 1,
                            .finish = failed(api::reason::kBackoffLimitExceeded,
                                             "backoffLimit 6 exceeded (7 failures): pod "
                                             "ns/j-worker-1 exited 137")}},
        DecideCase{
            .name = "ReplicaLostReplicasAreReplacedInPlace",
            .scope = api::RestartScope::kReplica,
            .disrupted = {disrupted("j-chief-0")},
            .retryable = {retryable("j-worker-1")},
            .failure_count = 1,
            .want = {.disruptions = 1,
                     .failures = 1,
                     .replica_failures = failed_before("j-worker-1", 1, kNow),
                     .replacements = {{"j-chief-0", std::string(api::reason::kPreempted),
                                       "pod ns/j-chief-0 was preempted (no failure budget spent)"},
                                      {"j-worker-1", std::string(api::reason::kRetryableExit),
                                       "pod ns/j-worker-1 exited 137, failures 2/6"}}},
            .check_failures = true},
        DecideCase{
            .name = "ReplicaExit138RestartsTheGroupWithoutCountingTheReplica",
            .scope = api::RestartScope::kReplica,
            .disrupted = {disrupted("j-worker-0")},
            .retryable = {retryable("j-worker-1"), retryable("j-chief-0", kGroupRestartExitCode)},
            .want = {.disruptions = 1,
                     .failures = 1,
                     .abandoned_recovery =
                         RestartDecision::Reason{
                             std::string(api::reason::kGroupRestartRequested),
                             "pod ns/j-chief-0 exited 138 (a new group attempt was asked for): "
                             "restarting the whole group"},
                     .group_restart =
                         RestartDecision::GroupRestart{
                             std::string(api::reason::kGroupRestartRequested),
                             "pod ns/j-chief-0 exited 138 (a new group attempt was asked for), "
                             "failures 1/6",
                             true}},
            .check_failures = true},
        DecideCase{
            .name = "ReplicaThatKeepsFailingRestartsTheGroup",
            .scope = api::RestartScope::kReplica,
            .retryable = {retryable("j-worker-1")},
            .failure_count = 3,
            .replica_failures = failed_before("j-worker-1", kReplicaFailuresBeforeGroupRestart,
                                              kNow - seconds(60)),
            .want = {.failures = 1,
                     .replica_failures = failed_before(
                         "j-worker-1", kReplicaFailuresBeforeGroupRestart, kNow - seconds(60)),
                     .abandoned_recovery =
                         RestartDecision::Reason{
                             std::string(api::reason::kReplicaKeepsFailing),
                             "pod ns/j-worker-1 exited 137 (replaced in place 3 times within "
                             "600s): restarting the whole group"},
                     .group_restart =
                         RestartDecision::GroupRestart{
                             std::string(api::reason::kReplicaKeepsFailing),
                             "pod ns/j-worker-1 exited 137 (replaced in place 3 times within "
                             "600s), failures 4/6",
                             true}},
            .check_failures = true},
        DecideCase{
            .name = "ReplicaFailuresOfAnEndedWindowAreForgotten",
            .scope = api::RestartScope::kReplica,
            .retryable = {retryable("j-worker-1")},
            .replica_failures = failed_before("j-worker-1", kReplicaFailuresBeforeGroupRestart,
                                              kNow - kReplicaFailureWindow - seconds(1)),
            .want = {.failures = 1,
                     .replica_failures = failed_before("j-worker-1", 1, kNow),
                     .replacements = {{"j-worker-1", std::string(api::reason::kRetryableExit),
                                       "pod ns/j-worker-1 exited 137, failures 1/6"}}},
            .check_failures = true},
        DecideCase{
            .name = "ReplicaBudgetRunsOutMidwayReplacementsBeforeItStand",
            .scope = api::RestartScope::kReplica,
            .retryable = {retryable("j-worker-0"), retryable("j-worker-1")},
            .failure_count = 5,
            .want = {.failures = 2,
                     .replica_failures = {{"j-worker-0", {1, api::format_time(kNow)}},
                                          {"j-worker-1", {1, api::format_time(kNow)}}},
                     .replacements = {{"j-worker-0", std::string(api::reason::kRetryableExit),
                                       "pod ns/j-worker-0 exited 137, failures 6/6"}},
                     .finish = failed(api::reason::kBackoffLimitExceeded,
                                      "backoffLimit 6 exceeded (7 failures): pod ns/j-worker-1 "
                                      "exited 137")},
            .check_failures = true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(CountReplicaFailure, CountsUpToTheLimitThenSaysItKeepsFailing) {
  std::map<std::string, api::ReplicaFailures> failures;
  for (int32_t i = 1; i <= kReplicaFailuresBeforeGroupRestart; ++i) {
    ReplicaFailureCount counted = count_replica_failure(failures, "j-worker-1", kNow);
    EXPECT_FALSE(counted.keeps_failing) << i;
    EXPECT_EQ(counted.failures.at("j-worker-1").count, i);
    failures = std::move(counted.failures);
  }
  const ReplicaFailureCount last = count_replica_failure(failures, "j-worker-1", kNow);
  EXPECT_TRUE(last.keeps_failing);
  EXPECT_EQ(last.failures, failures);  // the failure that restarts the group is not counted
}

TEST(CountReplicaFailure, ChangesNothingItIsGiven) {
  const auto before = failed_before("j-worker-0", 2, kNow - seconds(60));
  const auto copy = before;
  const ReplicaFailureCount counted = count_replica_failure(before, "j-worker-1", kNow);
  EXPECT_EQ(before, copy);
  EXPECT_EQ(counted.failures.size(), 2u);
}

}  // namespace
}  // namespace longhaul::controller
