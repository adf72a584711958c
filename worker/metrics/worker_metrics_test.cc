// WorkerMetrics: the fixed names with the rank label, values after steps and checkpoints, and
// a real scrape over HTTP.
#include "longhaul/metrics/worker_metrics.h"

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/testing/loopback.h"

namespace longhaul::worker_metrics {
namespace {

bool has_line(const std::string& text, const std::string& prefix) {
  size_t pos = 0;
  while ((pos = text.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return true;
    ++pos;
  }
  return false;
}

TEST(WorkerMetricsTest, ExportsTheFixedNamesWithRank) {
  WorkerMetrics m(3, true, "0.1.0", "cpu");
  m.on_restored(
      {.step = 5, .file = "model.ckpt-5.safetensors", .wall_time = 1690000000, .bytes = 2048});
  m.on_step(7, 2.5, 1e-3, 0.75, 1024, 0.5);
  m.set_max_steps(5000);
  supervisor::CheckpointStats stats;
  stats.step = 7;
  stats.wall_time = 1700000000;
  stats.bytes = 4096;
  stats.write_seconds = 0.2;
  stats.stall_seconds = 0.01;
  m.on_saved(stats);
  const std::string t = m.text();
  for (const std::string line : {
           "longhaul_train_global_step{rank=\"3\"} 7",
           "longhaul_train_max_steps{rank=\"3\"} 5000",
           "longhaul_train_steps_total{rank=\"3\"} 1",
           "longhaul_train_tokens_total{rank=\"3\"} 1024",
           "longhaul_train_step_duration_seconds_count{rank=\"3\"} 1",
           "longhaul_train_loss{rank=\"3\"} 2.5",
           "longhaul_train_learning_rate{rank=\"3\"} 0.001",
           "longhaul_train_grad_norm{rank=\"3\"} 0.75",
           "longhaul_train_tokens_per_second{rank=\"3\"} 2048",
           "longhaul_checkpoint_last_step{rank=\"3\"} 7",
           "longhaul_checkpoint_last_timestamp_seconds{rank=\"3\"} 1700000000",
           "longhaul_checkpoint_last_bytes{rank=\"3\"} 4096",
           "longhaul_checkpoint_duration_seconds_count{rank=\"3\"} 1",
           "longhaul_checkpoint_stall_seconds_sum{rank=\"3\"} 0.01",
           "longhaul_checkpoint_written_bytes_total{rank=\"3\"} 4096",
           "longhaul_checkpoint_saves_total{rank=\"3\"} 1",
           "longhaul_checkpoint_restores_total{rank=\"3\"} 1",
           "longhaul_worker_is_chief{rank=\"3\"} 1",
       }) {
    EXPECT_TRUE(has_line(t, line)) << line << "\n" << t;
  }
  EXPECT_NE(t.find("longhaul_worker_build_info{"), std::string::npos);
  EXPECT_NE(t.find("version=\"0.1.0\""), std::string::npos);
  EXPECT_NE(t.find("backend=\"cpu\""), std::string::npos);
}

TEST(WorkerMetricsTest, TheBackendLabelFollowsTheDeviceTheModelLandedOn) {
  // Asked for a GPU (`device: auto`), fell back to the CPU: one build_info series, the true one.
  WorkerMetrics m(0, true, "0.1.0", "cuda");
  m.set_backend("cpu");
  m.set_backend("cpu");  // unchanged: nothing re-registered
  const std::string t = m.text();
  std::vector<std::string> series;
  std::istringstream lines(t);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("longhaul_worker_build_info{")) series.push_back(line);
  }
  ASSERT_EQ(series.size(), 1u) << t;
  EXPECT_NE(series[0].find("backend=\"cpu\""), std::string::npos) << series[0];
  EXPECT_NE(series[0].find("version=\"0.1.0\""), std::string::npos) << series[0];
  EXPECT_TRUE(series[0].ends_with("} 1")) << series[0];
}

TEST(WorkerMetricsTest, BuildInfoCarriesTheKernelChoicesAndSkippedStepsAreCounted) {
  WorkerMetrics m(0, true, "0.1.0", "cuda");
  m.set_kernel_choices({{"attention", "cublas"},
                        {"matmul_epilogues", "separate"},
                        {"self_check", "fallback"},
                        {"not_a_label", "x"}});
  m.on_skipped_step(7);
  m.on_skipped_step(8);
  const std::string t = m.text();
  std::vector<std::string> series;
  std::istringstream lines(t);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("longhaul_worker_build_info{")) series.push_back(line);
  }
  ASSERT_EQ(series.size(), 1u) << t;
  for (const char* label : {"backend=\"cuda\"", "attention=\"cublas\"",
                            "matmul_epilogues=\"separate\"", "self_check=\"fallback\""}) {
    EXPECT_NE(series[0].find(label), std::string::npos) << label << " in " << series[0];
  }
  EXPECT_EQ(series[0].find("not_a_label"), std::string::npos) << series[0];
  EXPECT_TRUE(has_line(t, "longhaul_train_skipped_steps_total{rank=\"0\"} 2")) << t;
  EXPECT_TRUE(has_line(t, "longhaul_train_global_step{rank=\"0\"} 8")) << t;
}

TEST(WorkerMetricsTest, APeerRecoveredInPlaceIsCountedWithItsDuration) {
  WorkerMetrics m(1, false, "0.1.0", "cpu");
  EXPECT_TRUE(has_line(m.text(), "longhaul_worker_regroups_total{rank=\"1\"} 0"));
  m.on_regrouped(41, 3.5);
  const std::string t = m.text();
  EXPECT_TRUE(has_line(t, "longhaul_worker_regroups_total{rank=\"1\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "longhaul_worker_regroup_duration_seconds_count{rank=\"1\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "longhaul_worker_regroup_duration_seconds_sum{rank=\"1\"} 3.5")) << t;
  EXPECT_TRUE(has_line(t, "longhaul_train_global_step{rank=\"1\"} 41")) << t;
}

TEST(WorkerMetricsTest, ARestartedWorkerShowsTheCheckpointItRestoredFrom) {
  // Before its first save, a restarted worker reports the checkpoint it resumed from, so a
  // "time since the last checkpoint" alert does not fire on every restart.
  WorkerMetrics m(0, true, "0.1.0", "cpu");
  m.on_restored({.step = 1200,
                 .file = "model.ckpt-1200.safetensors",
                 .wall_time = 1690000123,
                 .bytes = 998877});
  const std::string t = m.text();
  for (const std::string line : {
           "longhaul_train_global_step{rank=\"0\"} 1200",
           "longhaul_checkpoint_last_step{rank=\"0\"} 1200",
           "longhaul_checkpoint_last_timestamp_seconds{rank=\"0\"} 1690000123",
           "longhaul_checkpoint_last_bytes{rank=\"0\"} 998877",
           "longhaul_checkpoint_restores_total{rank=\"0\"} 1",
           "longhaul_checkpoint_saves_total{rank=\"0\"} 0",
       }) {
    EXPECT_TRUE(has_line(t, line)) << line << "\n" << t;
  }
}

double gauge_value(const std::string& text, const std::string& series) {
  size_t pos = 0;
  while ((pos = text.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + series.size() + 1));
    ++pos;
  }
  ADD_FAILURE() << series << " not exported:\n" << text;
  return -1;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The chart's LonghaulTrainingStalled and LonghaulJobRestartLoop alerts read these two: when the
// process started, and when its global step last advanced (a skipped step advances it too).
TEST(WorkerMetricsTest, StartTimeAndLastStepTimeAreWallClockSeconds) {
  const double before = unix_now();
  WorkerMetrics m(0, true, "0.1.0", "cpu");
  std::string t = m.text();
  const double started = gauge_value(t, "longhaul_worker_start_time_seconds{rank=\"0\"}");
  EXPECT_GE(started, before - 1);
  EXPECT_LE(started, unix_now() + 1);
  EXPECT_TRUE(has_line(t, "longhaul_train_last_step_timestamp_seconds{rank=\"0\"} 0"));

  m.on_step(1, 2.5, 1e-3, 0.75, 1024, 0.5);
  const double stepped =
      gauge_value(m.text(), "longhaul_train_last_step_timestamp_seconds{rank=\"0\"}");
  EXPECT_GE(stepped, started - 1);
  EXPECT_LE(stepped, unix_now() + 1);

  WorkerMetrics skipping(1, false, "0.1.0", "cpu");
  skipping.on_skipped_step(2);
  EXPECT_GE(gauge_value(skipping.text(), "longhaul_train_last_step_timestamp_seconds{rank=\"1\"}"),
            before - 1);
}

TEST(WorkerMetricsTest, ServesMetricsOverHttp) {
  WorkerMetrics m(0, false, "0.1.0", "cpu");
  m.serve(0);  // civetweb picks a free port for "0"
  ASSERT_GT(m.port(), 0);
  m.on_step(1, 1.0, 1.0, 1.0, 10, 1.0);
  const std::string body = testing::http_get(m.port(), "/metrics").body;
  EXPECT_NE(body.find("longhaul_train_steps_total{rank=\"0\"} 1"), std::string::npos) << body;
  EXPECT_NE(body.find("longhaul_worker_is_chief{rank=\"0\"} 0"), std::string::npos) << body;
}

TEST(WorkerMetricsTest, BusyPortIsUnavailableNamingThePort) {
  WorkerMetrics a(0, true, "0.1.0", "cpu");
  a.serve(0);
  WorkerMetrics b(0, true, "0.1.0", "cpu");
  try {
    b.serve(a.port());
    FAIL() << "second bind succeeded";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(a.port())), std::string::npos);
  }
}

}  // namespace
}  // namespace longhaul::worker_metrics
