// End-to-end tests of the numerical watchdog (worker/trainer/watchdog.h) through the binary: a
// NaN injected into the gradients at step 7 (LONGHAUL_TEST_NAN_GRADIENT_AT_STEP, test-only)
// stops the run with exit 5 before the step is applied, no checkpoint after step 5 is written,
// and a resume trains on from the good checkpoint; with training.on_nonfinite: skip_step the run
// drops that one update, says so, counts it, and finishes.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class WorkerNumericsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Checkpoints every 5 steps, but not the final one on an error: 5 is the last good state.
    write_text(dir_ / "small.yaml", small_model_config(10, 5));
  }
  longhaul::testing::TestTempDir dir_{"worker_numerics"};
};

TEST_F(WorkerNumericsTest, NanGradientStopsBeforeTheStepIsAppliedAndResumeWorks) {
  RunOutput bad = run_worker({"train", "--config", "small.yaml", "--logdir", "run"}, dir_, 120s,
                             {{"LONGHAUL_TEST_NAN_GRADIENT_AT_STEP", "7"}});
  EXPECT_EQ(bad.exit_code, 5) << bad.out << bad.err;
  EXPECT_TRUE(contains(bad.err, "step 7: non-finite gradient norm (nan)")) << bad.err;
  EXPECT_TRUE(contains(bad.err, "not checkpointed")) << bad.err;
  EXPECT_TRUE(contains(bad.err, "training.on_nonfinite: skip_step")) << bad.err;
  EXPECT_TRUE(contains(bad.out, "step      6/10")) << bad.out;
  EXPECT_FALSE(contains(bad.out, "step      7/10")) << bad.out;
  // The last checkpoint is the good one: nothing at or after the bad step, no final save.
  const auto files = checkpoint_files(dir_ / "run");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files.begin()->first, 5);
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 5);
  supervisor::SafetensorsReader good(files.begin()->second);  // CRC-checked, finite weights
  for (const auto& name : good.tensor_names()) {
    if (name.rfind("transformer.", 0) != 0) continue;
    const auto bytes = good.data(name);
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      float x;
      std::memcpy(&x, bytes.data() + i, 4);
      ASSERT_TRUE(std::isfinite(x)) << name << "[" << i / 4 << "]";
    }
  }

  // Without the fault, the run resumes at 5 and finishes.
  RunOutput resumed = run_worker({"train", "--config", "small.yaml", "--logdir", "run"}, dir_);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_EQ(start_step(resumed.out), 5);
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 10);
}

TEST_F(WorkerNumericsTest, SkipStepDropsTheBadUpdateCountsItAndFinishes) {
  RunOutput r = run_worker({"train", "--config", "small.yaml", "--logdir", "run", "--set",
                            "training.on_nonfinite=skip_step"},
                           dir_, 120s, {{"LONGHAUL_TEST_NAN_GRADIENT_AT_STEP", "7"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out,
                       "step      7/10 | SKIPPED (non-finite gradient norm (nan)) | 1 "
                       "skipped so far"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "step      8/10 | loss")) << r.out;
  EXPECT_TRUE(contains(r.err, "numerical watchdog: step skipped")) << r.err;
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 10);
  // The skipped update left the moments' bias-correction count one behind the global step.
  supervisor::SafetensorsReader last(checkpoint_files(dir_ / "run").rbegin()->second);
  EXPECT_EQ(last.metadata().at("step"), "10");
  EXPECT_EQ(last.metadata().at("optimizer_step_count"), "9");
}

TEST_F(WorkerNumericsTest, DataParallelReplicasStopTogetherAndLaunchDoesNotRestart) {
  // Both replicas see the NaN (the environment is inherited); the all-reduced norm and the
  // averaged loss make them reach the same verdict at the same step, and exit 5 is permanent.
  RunOutput r =
      run_worker({"launch", "--replicas", "2", "--max-restarts", "3", "--", "train", "--config",
                  "small.yaml", "--logdir", "dp", "--set", "supervisor.recovery_wait_secs=0.2"},
                 dir_, 240s, {{"LONGHAUL_TEST_NAN_GRADIENT_AT_STEP", "7"}});
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "step 7: non-finite gradient norm (nan)")) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting the whole group")) << r.err;
  EXPECT_EQ(state_file_latest_step(dir_ / "dp"), 5);
  ASSERT_EQ(checkpoint_files(dir_ / "dp").size(), 1u);
}

TEST_F(WorkerNumericsTest, BadPolicyValueIsAConfigError) {
  RunOutput r = run_worker({"train", "--config", "small.yaml", "--logdir", "run", "--set",
                            "training.on_nonfinite=ignore"},
                           dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "training.on_nonfinite must be one of stop, skip_step")) << r.err;
}

}  // namespace
}  // namespace longhaul::worker_test
