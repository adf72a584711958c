// Stop requests against longhaul-worker as a process: a signal inside a step that cannot finish
// in the grace period, during a rendezvous wait, SIGHUP, and a final checkpoint that cannot be
// written. Each test is named after the defect it guards against.
#include <chrono>
#include <cstring>
#include <memory>

#include <gtest/gtest.h>

#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/loopback.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using namespace std::chrono_literals;
using supervisor::SafetensorsReader;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

void expect_same_parameters(const fs::path& a, const fs::path& b) {
  SafetensorsReader ra(a), rb(b);
  ASSERT_EQ(ra.tensor_names(), rb.tensor_names());
  for (const auto& name : ra.tensor_names()) {
    auto da = ra.data(name), db = rb.data(name);
    ASSERT_EQ(da.size(), db.size()) << name;
    EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size()), 0) << name << " differs";
  }
  for (const char* key : {"step", "optimizer_step_count", "data_position", "train_tokens"}) {
    EXPECT_EQ(ra.metadata().at(key), rb.metadata().at(key)) << key;
  }
}

class WorkerStopTest : public ::testing::Test {
 protected:
  void SetUp() override { write_text(dir_ / "small.yaml", small_model_config(20, 0)); }
  // The small model with one optimizer step of 10^10 micro-batches (days of work).
  static std::vector<std::string> endless_step_args(const std::string& logdir) {
    return {"train",
            "--config",
            "small.yaml",
            "--logdir",
            logdir,
            "--set",
            "training.total_batch_tokens=320000000000",
            "--set",
            "grace_period_secs=30"};
  }
  longhaul::testing::TestTempDir dir_{"worker_stop"};
};

// Regression: a SIGTERM inside a step of 10^10 micro-batches was logged and then ignored; the
// process was still training 75 minutes later. The step must be abandoned, the last completed
// step committed with the data position of its end, and a resume must train exactly as an
// uninterrupted run.
TEST_F(WorkerStopTest, SigtermInsideAStepThatCannotFinishCommitsTheLastCompletedStep) {
  {
    WorkerProcess p(endless_step_args("b"), dir_, dir_);
    ASSERT_TRUE(p.wait_for_stdout("starting at step 0/20", 120s)) << p.out() << p.err();
    p.signal(SIGTERM);
    // Bounded by the grace period (30 s) plus a generous margin for a loaded machine.
    ASSERT_EQ(p.wait(90s), 143) << p.err();
    EXPECT_TRUE(contains(p.err(), "abandoned")) << p.err();
    // Such a config is not accepted silently: the step's duration and size are called out.
    EXPECT_TRUE(contains(p.err(), "more tokens than the training data holds")) << p.err();
  }
  EXPECT_EQ(state_file_latest_step(dir_ / "b"), 0);
  // The committed step-0 state resumes exactly like a run that was never interrupted.
  RunOutput resumed = run_worker({"train", "--config", "small.yaml", "--logdir", "b"}, dir_);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(start_step(resumed.out), 0);
  RunOutput straight = run_worker({"train", "--config", "small.yaml", "--logdir", "a"}, dir_);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  expect_same_parameters(dir_ / "a" / "model.ckpt-20.safetensors",
                         dir_ / "b" / "model.ckpt-20.safetensors");
}

// Regression: a SIGTERM during the final-checkpoint save of a full disk was followed by "final
// checkpoint committed" and exit 143, with no checkpoint of that step in the logdir. A write
// failure must win: exit 138 (retryable), the message says it was not committed.
TEST_F(WorkerStopTest, FinalCheckpointThatCannotBeWrittenExits138AndClaimsNoCommit) {
  // The step-0 checkpoint's name is taken by a folder (holding a file): its rename must fail.
  fs::create_directories(dir_ / "b" / "model.ckpt-0.safetensors");
  write_text(dir_ / "b" / "model.ckpt-0.safetensors" / "in-the-way", "x");
  WorkerProcess p(endless_step_args("b"), dir_, dir_);
  ASSERT_TRUE(p.wait_for_stdout("starting at step 0/20", 120s)) << p.out() << p.err();
  p.signal(SIGTERM);
  ASSERT_EQ(p.wait(90s), 138) << p.err();
  EXPECT_TRUE(contains(p.err(), "was not committed")) << p.err();
  EXPECT_FALSE(contains(p.err(), "final checkpoint committed")) << p.err();
  EXPECT_FALSE(state_file_latest_step(dir_ / "b").has_value());
}

// Regression: the same when training ends at max_steps: the last save failing is not success.
TEST_F(WorkerStopTest, FinalCheckpointThatCannotBeWrittenAtMaxStepsIsNotSuccess) {
  fs::create_directories(dir_ / "b" / "model.ckpt-20.safetensors");
  write_text(dir_ / "b" / "model.ckpt-20.safetensors" / "in-the-way", "x");
  RunOutput r = run_worker({"train", "--config", "small.yaml", "--logdir", "b"}, dir_);
  EXPECT_EQ(r.exit_code, 138) << r.err;
  EXPECT_TRUE(contains(r.err, "final checkpoint at step 20 was not committed")) << r.err;
}

// Regression: SIGHUP (a closed terminal, some supervisors' "stop") killed the worker with 129 and
// no final checkpoint. It is handled like SIGTERM: final checkpoint, then 129.
TEST_F(WorkerStopTest, SighupCommitsAFinalCheckpointLikeSigterm) {
  write_text(dir_ / "long.yaml", small_model_config(1000000, 0));
  WorkerProcess p({"train", "--config", "long.yaml", "--logdir", "b"}, dir_, dir_);
  ASSERT_TRUE(p.wait_for_stdout("step     20/", 120s)) << p.out() << p.err();
  p.signal(SIGHUP);
  ASSERT_EQ(p.wait(90s), 129) << p.err();
  const auto step = state_file_latest_step(dir_ / "b");
  ASSERT_TRUE(step.has_value());
  EXPECT_GE(*step, 20);
  EXPECT_TRUE(contains(p.err(), "final checkpoint committed")) << p.err();
}

// Regression: a SIGTERM while a replica waited for its peers at the rendezvous was only noticed
// when the wait ended (max_wait_secs later). It ends the wait at once.
TEST_F(WorkerStopTest, SigtermWhileWaitingForPeersAtTheRendezvousStopsAtOnce) {
  WorkerProcess p(
      {"train", "--config", "small.yaml", "--logdir", "b", "--rank", "0", "--world-size", "2",
       "--set", "supervisor.max_wait_secs=3600", "--set", "supervisor.recovery_wait_secs=0.05"},
      dir_, dir_, {{"LONGHAUL_HOST_OVERRIDE", "127.0.0.1"}});
  // The chief has opened the rendezvous: its generation file exists.
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (!fs::exists(dir_ / "b" / ".rendezvous" / "0" / "generation") &&
         std::chrono::steady_clock::now() < deadline && p.running()) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(fs::exists(dir_ / "b" / ".rendezvous" / "0" / "generation")) << p.err();
  p.signal(SIGTERM);
  ASSERT_EQ(p.wait(60s), 143) << p.err();
  EXPECT_TRUE(contains(p.err(), "stopped at the rendezvous")) << p.err();
}

// Regression: two `train` processes on one logdir both ran and both claimed commits. The second
// is refused at start naming the holder, and the first trains on undisturbed. The refusal is
// exit 144, retryable: on a cluster the holder is the chief of a group being replaced, and a
// permanent code (it was 1) made the operator fail the whole job.
TEST_F(WorkerStopTest, ASecondTrainOnTheSameLogdirIsRefusedNamingTheHolder) {
  write_text(dir_ / "long.yaml", small_model_config(1000000, 0));
  WorkerProcess first({"train", "--config", "long.yaml", "--logdir", "b"}, dir_, dir_);
  ASSERT_TRUE(first.wait_for_stdout("step     10/", 120s)) << first.out() << first.err();
  RunOutput second = run_worker({"train", "--config", "long.yaml", "--logdir", "b"}, dir_);
  EXPECT_EQ(second.exit_code, 144) << second.err;
  EXPECT_TRUE(contains(second.err, "in use by another training process")) << second.err;
  EXPECT_TRUE(contains(second.err, "kind=\"logdir busy\"")) << second.err;
  EXPECT_TRUE(contains(second.err, "pid " + std::to_string(first.pid()))) << second.err;
  EXPECT_TRUE(first.running());
  first.signal(SIGTERM);
  ASSERT_EQ(first.wait(90s), 143) << first.err();
}

// Regression (#23): connections held open on --metrics-port without a request (anything in the
// pod network can hold them) filled the metrics server: 100 made a scrape take seconds, 200 kept
// a new connection from being accepted at all. With 500 held, a scrape still answers and SIGTERM
// still commits the final checkpoint and exits inside the grace period.
TEST_F(WorkerStopTest, HeldOpenMetricsConnectionsDelayNeitherAScrapeNorTheSigterm) {
  longhaul::testing::raise_open_files_limit();  // 500 held + the worker's share of them
  write_text(dir_ / "long.yaml", small_model_config(1000000, 0));
  // A free port can be taken by a parallel test between the probe and the worker's bind; the
  // worker then exits naming the port, and another is tried.
  int port = 0;
  std::unique_ptr<WorkerProcess> worker;
  for (int attempt = 0; attempt < 5; ++attempt) {
    port = longhaul::testing::free_loopback_port();
    worker = std::make_unique<WorkerProcess>(
        std::vector<std::string>{"train", "--config", "long.yaml", "--logdir", "b",
                                 "--metrics-port", std::to_string(port), "--set",
                                 "grace_period_secs=30"},
        dir_, dir_);
    if (worker->wait_for_stdout("step     20/", 120s)) break;
    ASSERT_TRUE(!worker->running() && contains(worker->err(), "cannot serve Prometheus"))
        << worker->err();
    worker.reset();
  }
  ASSERT_NE(worker, nullptr) << "no free metrics port after 5 attempts";
  longhaul::testing::HeldConnections held(port, 500);
  ASSERT_EQ(held.size(), 500u);
  // http_get gives up on a reply that stalls for 5 s: half of Prometheus's scrape timeout.
  const auto scrape = longhaul::testing::http_get(port, "/metrics");
  EXPECT_EQ(scrape.status, 200);
  EXPECT_TRUE(contains(scrape.body, "longhaul_train_global_step{rank=\"0\"}")) << scrape.body;
  worker->signal(SIGTERM);
  // Bounded by the grace period (30 s) plus a generous margin for a loaded machine.
  ASSERT_EQ(worker->wait(90s), 143) << worker->err();
  EXPECT_TRUE(contains(worker->err(), "final checkpoint committed")) << worker->err();
  const auto step = state_file_latest_step(dir_ / "b");
  ASSERT_TRUE(step.has_value());
  EXPECT_GE(*step, 20);
}

}  // namespace
}  // namespace longhaul::worker_test
