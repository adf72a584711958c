// Multi-process tests of data-parallel replicas of the longhaul-worker binary on loopback:
// equivalence with one process on the same global batch, waiting for a late chief, a chief that
// never comes, a killed or hung peer (exit 138 within the collective timeout), a restart that
// resumes from the latest checkpoint, `launch` restarts and signal forwarding, the evaluator.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include "longhaul/supervisor/events.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/eventually.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

// A 1-layer, 32-wide model; `batch_size` sequences of 16 tokens per replica per step.
// `on_peer_loss`: what survivors do when a peer is lost; these tests check the group restart
// ("exit"); recovery in place is dist_recovery_test.cc's.
std::string replica_config(int64_t max_steps, int64_t batch_size, int64_t save_model_steps,
                           double max_wait_secs = 60, int max_to_keep = 3,
                           const std::string& on_peer_loss = "exit") {
  std::ostringstream y;
  y << "model: {preset: tiny, n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}\n"
    << "training: {batch_size: " << batch_size << ", seq_len: 16, max_steps: " << max_steps
    << ", learning_rate: 0.01, warmup_steps: 2, seed: 7}\n"
    << "checkpoint: {save_model_secs: 0, save_model_steps: " << save_model_steps
    << ", max_to_keep: " << max_to_keep << "}\n"
    << "summaries: {every_steps: 10, save_summaries_secs: 0}\n"
    << "log: {every_steps: 1}\n"
    << "eval: {every_steps: 0, batches: 4}\n"
    << "supervisor: {recovery_wait_secs: 0.05, max_wait_secs: " << max_wait_secs
    << ", on_peer_loss: " << on_peer_loss << "}\n";
  return y.str();
}

// TF_CONFIG of a chief and `workers` workers on 127.0.0.1 (ports are informational).
std::string tf_config(int workers, const std::string& type, int index) {
  std::string cluster = R"("chief": ["127.0.0.1:2222"])";
  if (workers > 0) {
    cluster += R"(, "worker": [)";
    for (int i = 0; i < workers; ++i)
      cluster += (i ? ", " : "") + std::string("\"127.0.0.1:2222\"");
    cluster += "]";
  }
  return R"({"cluster": {)" + cluster + R"(}, "task": {"type": ")" + type + R"(", "index": )" +
         std::to_string(index) + "}}";
}

std::map<std::string, std::string> replica_env(int world, int rank, const std::string& attempt,
                                               double collective_timeout = 10) {
  return {
      {"TF_CONFIG", tf_config(world - 1, rank == 0 ? "chief" : "worker", rank == 0 ? 0 : rank - 1)},
      {"LONGHAUL_RESTART_ATTEMPT", attempt},
      {"LONGHAUL_COLLECTIVE_TIMEOUT_SECS", std::to_string(collective_timeout)}};
}

using longhaul::testing::eventually;

class DistReplicasTest : public ::testing::Test {
 protected:
  std::vector<std::string> train_args(const std::string& config_name, const std::string& logdir) {
    return {"train", "--config", (dir_ / config_name).string(), "--logdir",
            (dir_ / logdir).string()};
  }

  std::unique_ptr<WorkerProcess> start(std::vector<std::string> args,
                                       std::map<std::string, std::string> env) {
    return std::make_unique<WorkerProcess>(std::move(args), dir_, dir_, std::move(env));
  }

  longhaul::testing::TestTempDir dir_{"dist"};
};

// The parameters and moments of a checkpoint.
std::map<std::string, std::vector<float>> read_tensors(const fs::path& path) {
  supervisor::SafetensorsReader reader(path);
  std::map<std::string, std::vector<float>> out;
  for (const auto& name : reader.tensor_names()) {
    auto bytes = reader.data(name);
    std::vector<float> v(bytes.size() / sizeof(float));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    out[name] = std::move(v);
  }
  return out;
}

// Replicas, and whether their gradient all-reduce overlaps the backward pass (the default).
struct Equivalence {
  int world;
  bool overlap;
};

class EquivalenceTest : public DistReplicasTest,
                        public ::testing::WithParamInterface<Equivalence> {};

TEST_P(EquivalenceTest, ReplicasMatchOneProcessWithTheSameGlobalBatch) {
  const int world = GetParam().world;
  const bool overlap = GetParam().overlap;
  const int64_t steps = 8;
  write_text(dir_ / "one.yaml", replica_config(steps, 2 * world, 0));
  write_text(dir_ / "many.yaml", replica_config(steps, 2, 0));
  RunOutput single = run_worker(train_args("one.yaml", "single"), dir_, seconds(120));
  ASSERT_EQ(single.exit_code, 0) << single.err;

  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    auto env = replica_env(world, r, "eq");
    if (!overlap) env["LONGHAUL_ALLREDUCE_OVERLAP"] = "off";
    ranks.push_back(start(train_args("many.yaml", "replicas"), std::move(env)));
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(ranks[r]->wait(seconds(120)), 0) << "rank " << r << ": " << ranks[r]->err();
    // The overlapped path really ran: the 1-layer model's gradients went in two buckets (ln_f +
    // block 0 while the embedding backward ran, then wte + wpe); off: one whole-buffer call.
    EXPECT_THAT(ranks[r]->err(), HasSubstr(overlap ? "buckets_per_step=2" : "buckets_per_step=0"))
        << "rank " << r;
  }
  const auto expected = read_tensors(dir_ / "single" / "model.ckpt-8.safetensors");
  const auto actual = read_tensors(dir_ / "replicas" / "model.ckpt-8.safetensors");
  ASSERT_EQ(expected.size(), actual.size());
  // fp32 rounding: the sums over ranks and over the batch associate differently, and AdamW's
  // m / sqrt(v) magnifies those last-bit differences for near-zero gradients. Each step moves a
  // parameter by up to learning_rate (0.01), so a different batch would differ by ~1e-2; the
  // bound is 1% of one step.
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, want] : expected) {
    const auto& got = actual.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
      if (diff > worst) {
        worst = diff;
        worst_name = name;
      }
    }
  }
  EXPECT_LT(worst, 1e-4) << "worst absolute difference in " << worst_name;
  // The bound is meaningful: one process on the per-replica batch alone ends far away.
  RunOutput half = run_worker(train_args("many.yaml", "half"), dir_, seconds(120));
  ASSERT_EQ(half.exit_code, 0) << half.err;
  const auto other = read_tensors(dir_ / "half" / "model.ckpt-8.safetensors");
  double apart = 0;
  for (const auto& [name, want] : expected) {
    for (size_t i = 0; i < want.size(); ++i) {
      apart = std::max(apart, std::abs(static_cast<double>(other.at(name)[i]) - want[i]));
    }
  }
  EXPECT_GT(apart, 100 * worst);
  // Only the chief wrote events (one file), and the run is marked done for evaluators.
  EXPECT_EQ(supervisor::list_events_files(dir_ / "replicas").size(), 1u);
  EXPECT_EQ(read_text(dir_ / "replicas" / "training.done"), "8\n");
}

INSTANTIATE_TEST_SUITE_P(Worlds, EquivalenceTest,
                         ::testing::Values(Equivalence{2, true}, Equivalence{3, true},
                                           Equivalence{2, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.world) +
                                  (info.param.overlap ? "Overlapped" : "NotOverlapped");
                         });

TEST_F(DistReplicasTest, NonChiefStartedWellBeforeTheChiefWaitsThenProceeds) {
  write_text(dir_ / "c.yaml", replica_config(6, 2, 0));
  auto worker = start(train_args("c.yaml", "run"), replica_env(2, 1, "late"));
  // The worker announced itself at the rendezvous and keeps waiting for the chief.
  ASSERT_TRUE(
      eventually([&] { return fs::exists(dir_ / "run/.rendezvous/late/present.1"); }, seconds(30)))
      << worker->err();
  EXPECT_FALSE(worker->wait(milliseconds(500))) << "the worker gave up: " << worker->err();
  auto chief = start(train_args("c.yaml", "run"), replica_env(2, 0, "late"));
  EXPECT_EQ(chief->wait(seconds(120)), 0) << chief->err();
  EXPECT_EQ(worker->wait(seconds(120)), 0) << worker->err();
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 6);
}

// Replicas that would cut the gradients into different all-reduce buckets (overlap on the chief,
// off on the worker) must not train: both exit 2 (a configuration error) before the first step.
TEST_F(DistReplicasTest, ReplicasWithDifferentOverlapSettingsExitWithUsageError) {
  write_text(dir_ / "c.yaml", replica_config(4, 2, 0));
  auto chief = start(train_args("c.yaml", "run"), replica_env(2, 0, "mix"));
  auto worker_env = replica_env(2, 1, "mix");
  worker_env["LONGHAUL_ALLREDUCE_OVERLAP"] = "off";
  auto worker = start(train_args("c.yaml", "run"), worker_env);
  EXPECT_EQ(chief->wait(seconds(120)), 2) << chief->err();
  EXPECT_EQ(worker->wait(seconds(120)), 2) << worker->err();
  EXPECT_THAT(worker->err(), HasSubstr("--allreduce-overlap"));
  EXPECT_FALSE(fs::exists(dir_ / "run" / "model.ckpt-1.safetensors"));
}

// Replicas that would react differently to a lost peer (one regroups, one exits) must not train.
TEST_F(DistReplicasTest, ReplicasWithDifferentPeerLossPoliciesExitWithUsageError) {
  write_text(dir_ / "exit.yaml", replica_config(4, 2, 0, 60, 3, "exit"));
  write_text(dir_ / "regroup.yaml", replica_config(4, 2, 0, 60, 3, "regroup"));
  auto chief = start(train_args("exit.yaml", "run"), replica_env(2, 0, "policy"));
  auto worker = start(train_args("regroup.yaml", "run"), replica_env(2, 1, "policy"));
  EXPECT_EQ(chief->wait(seconds(120)), 2) << chief->err();
  EXPECT_EQ(worker->wait(seconds(120)), 2) << worker->err();
  EXPECT_THAT(worker->err(), HasSubstr("give every replica the same supervisor.on_peer_loss"));
  EXPECT_FALSE(fs::exists(dir_ / "run" / "model.ckpt-1.safetensors"));
}

TEST_F(DistReplicasTest, ChiefThatNeverComesIsDeadlineExceededNamingMissingRanks) {
  write_text(dir_ / "c.yaml", replica_config(6, 2, 0, /*max_wait_secs=*/1));
  auto worker = start(train_args("c.yaml", "run"), replica_env(3, 1, "nochief"));
  const auto code = worker->wait(seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(*code, 138) << "a missing chief is not a retryable peer loss";
  EXPECT_THAT(worker->err(), HasSubstr("DeadlineExceeded"));
  EXPECT_THAT(worker->err(),
              HasSubstr("rank(s) 0 (the chief never opened the rendezvous), 2 never arrived"));
}

// Starts a 3-replica run that checkpoints every 5 steps and waits for the first checkpoint.
std::vector<std::unique_ptr<WorkerProcess>> start_long_run(DistReplicasTest& t, const fs::path& dir,
                                                           double collective_timeout) {
  write_text(dir / "long.yaml", replica_config(1'000'000, 2, 5, 60, 0));
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<WorkerProcess>(
        std::vector<std::string>{"train", "--config", (dir / "long.yaml").string(), "--logdir",
                                 (dir / "run").string()},
        dir, dir, replica_env(3, r, "a0", collective_timeout)));
  }
  (void)t;
  EXPECT_TRUE(eventually([&] { return state_file_latest_step(dir / "run").value_or(0) >= 10; },
                         seconds(60)))
      << ranks[0]->err();
  return ranks;
}

TEST_F(DistReplicasTest, KilledWorkerMakesTheOthersExit138ThenAllResumeTogether) {
  const double timeout_secs = 5;
  auto ranks = start_long_run(*this, dir_, timeout_secs);
  const auto killed_at = std::chrono::steady_clock::now();
  ranks[2]->signal(SIGKILL);
  for (int r : {0, 1}) {
    EXPECT_EQ(ranks[r]->wait(seconds(static_cast<int>(timeout_secs) + 20)), 138)
        << "rank " << r << ": " << ranks[r]->err();
    EXPECT_THAT(ranks[r]->err(), HasSubstr("Aborted"));
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(took, timeout_secs + 20);
  EXPECT_EQ(ranks[2]->wait(seconds(5)), 137);

  // Nothing partial: the state file names a readable checkpoint, no temp file is left.
  const auto latest = state_file_latest_step(dir_ / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_NO_THROW(
      supervisor::SafetensorsReader(checkpoint_files(dir_ / "run").at(*latest)).verify_all());

  // Restart all (a new attempt): every replica resumes at the latest checkpoint.
  write_text(dir_ / "resume.yaml", replica_config(*latest + 5, 2, 5, 60, 0));
  std::vector<std::unique_ptr<WorkerProcess>> again;
  for (int r = 0; r < 3; ++r) {
    again.push_back(start(train_args("resume.yaml", "run"), replica_env(3, r, "a1")));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(again[r]->wait(seconds(120)), 0) << "rank " << r << ": " << again[r]->err();
    EXPECT_EQ(start_step(again[r]->out()), *latest) << again[r]->out();
  }
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), *latest + 5);
  EXPECT_FALSE(fs::exists(dir_ / "run/.rendezvous/a0")) << "the chief removes stale attempts";
}

TEST_F(DistReplicasTest, HungWorkerMakesTheOthersExit138AfterTheCollectiveTimeout) {
  const double timeout_secs = 2;
  auto ranks = start_long_run(*this, dir_, timeout_secs);
  ranks[1]->signal(SIGSTOP);  // alive, connections open, but silent: like a cut network
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks[r]->wait(seconds(static_cast<int>(timeout_secs) + 30)), 138)
        << "rank " << r << ": " << ranks[r]->err();
  }
  ranks[1]->signal(SIGKILL);
  ranks[1]->signal(SIGCONT);
  EXPECT_TRUE(ranks[1]->wait(seconds(10)).has_value());
}

TEST_F(DistReplicasTest, SigtermToOneWorkerStopsAllAtOneStepWithAFinalCheckpoint) {
  auto ranks = start_long_run(*this, dir_, 10);
  ranks[1]->signal(SIGTERM);  // a preempted worker pod
  EXPECT_EQ(ranks[1]->wait(seconds(60)), 143) << ranks[1]->err();
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks[r]->wait(seconds(60)), 138) << "rank " << r << ": " << ranks[r]->err();
    EXPECT_THAT(ranks[r]->err(), HasSubstr("because another replica stopped"));
  }
  // The chief committed a final checkpoint at the step where every replica stopped.
  const auto latest = state_file_latest_step(dir_ / "run");
  ASSERT_TRUE(latest.has_value());
  char last_line[32];
  std::snprintf(last_line, sizeof last_line, "step %6lld/", static_cast<long long>(*latest));
  EXPECT_THAT(ranks[0]->out(), HasSubstr(last_line))
      << "the chief's last step is the checkpointed one";
  EXPECT_FALSE(fs::exists(dir_ / "run" / "training.done"));
}

TEST_F(DistReplicasTest, LaunchDoesNotRestartAPermanentFailure) {
  auto launch =
      start({"launch", "--replicas", "2", "--max-restarts", "3", "--", "train", "--config",
             (dir_ / "missing.yaml").string(), "--logdir", (dir_ / "run").string()},
            {});
  EXPECT_EQ(launch->wait(seconds(60)), 2) << launch->err();
  EXPECT_THAT(launch->err(), HasSubstr("not restarting"));
  EXPECT_THAT(launch->err(), ::testing::Not(HasSubstr("restarting the whole group")));
}

// Pids of the running children of `parent` (from /proc).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

TEST_F(DistReplicasTest, LaunchRestartsTheGroupAfterAKilledReplica) {
  write_text(dir_ / "l.yaml", replica_config(400, 2, 5, 60, 0));
  auto launch =
      start({"launch", "--replicas", "2", "--max-restarts", "1", "--grace-secs", "10", "--",
             "train", "--config", (dir_ / "l.yaml").string(), "--logdir", (dir_ / "run").string()},
            {{"LONGHAUL_COLLECTIVE_TIMEOUT_SECS", "5"}});
  ASSERT_TRUE(eventually([&] { return state_file_latest_step(dir_ / "run").value_or(0) >= 5; },
                         seconds(60)))
      << launch->err();
  auto children = children_of(launch->pid());
  ASSERT_EQ(children.size(), 2u);
  ::kill(children.back(), SIGKILL);
  EXPECT_EQ(launch->wait(seconds(240)), 0) << launch->err();
  EXPECT_THAT(launch->err(), HasSubstr("restarting the whole group"));
  EXPECT_THAT(launch->out(), HasSubstr("resuming at step"));
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 400);
}

// supervisor.on_peer_loss: regroup (the default): launch replaces the lost replica alone and the
// others recover in place: nobody restarts from a checkpoint.
TEST_F(DistReplicasTest, LaunchReplacesALostReplicaAloneAndTheOthersKeepTraining) {
  write_text(dir_ / "l.yaml", replica_config(300, 2, 5, 60, 0, "regroup"));
  auto launch =
      start({"launch", "--replicas", "3", "--max-restarts", "1", "--grace-secs", "10", "--",
             "train", "--config", (dir_ / "l.yaml").string(), "--logdir", (dir_ / "run").string()},
            {{"LONGHAUL_COLLECTIVE_TIMEOUT_SECS", "60"}});
  ASSERT_TRUE(eventually([&] { return state_file_latest_step(dir_ / "run").value_or(0) >= 5; },
                         seconds(60)))
      << launch->err();
  auto children = children_of(launch->pid());
  ASSERT_EQ(children.size(), 3u);
  ::kill(children.back(), SIGKILL);
  EXPECT_EQ(launch->wait(seconds(240)), 0) << launch->err();
  EXPECT_THAT(launch->err(), HasSubstr("starting a replacement that joins the others in place"));
  EXPECT_THAT(launch->err(), HasSubstr("regrouped: training continues in place"));
  EXPECT_THAT(launch->err(), ::testing::Not(HasSubstr("restarting the whole group")));
  EXPECT_THAT(launch->err(), ::testing::Not(HasSubstr("restored checkpoint")));
  EXPECT_THAT(launch->out(), HasSubstr("state from the running replicas, no checkpoint read"));
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 300);
}

TEST_F(DistReplicasTest, LaunchForwardsSigtermAndReapsEveryChild) {
  write_text(dir_ / "l.yaml", replica_config(1'000'000, 2, 5, 60, 0));
  auto launch = start({"launch", "--replicas", "3", "--", "train", "--config",
                       (dir_ / "l.yaml").string(), "--logdir", (dir_ / "run").string()},
                      {});
  ASSERT_TRUE(eventually([&] { return state_file_latest_step(dir_ / "run").value_or(0) >= 5; },
                         seconds(60)))
      << launch->err();
  const auto children = children_of(launch->pid());
  ASSERT_EQ(children.size(), 3u);
  const int64_t before = *state_file_latest_step(dir_ / "run");
  launch->signal(SIGTERM);
  EXPECT_EQ(launch->wait(seconds(60)), 143) << launch->err();
  for (pid_t pid : children) EXPECT_NE(::kill(pid, 0), 0) << "child " << pid << " outlived launch";
  EXPECT_GT(state_file_latest_step(dir_ / "run").value_or(0), before)
      << "the chief commits a final checkpoint on SIGTERM";
}

TEST_F(DistReplicasTest, EvaluatorWritesValLossForEveryCheckpoint) {
  write_text(dir_ / "e.yaml", replica_config(40, 2, 10, 60, 0));
  auto launch = start({"launch", "--replicas", "2", "--evaluator", "--", "train", "--config",
                       (dir_ / "e.yaml").string(), "--logdir", (dir_ / "run").string()},
                      {});
  ASSERT_EQ(launch->wait(seconds(120)), 0) << launch->err();
  std::set<int64_t> evaluated;
  for (const auto& file : supervisor::list_events_files(dir_ / "run" / "eval")) {
    for (const auto& event : supervisor::EventsReader::read_all(file)) {
      for (const auto& value : event.summary().value()) {
        if (value.tag() == "val_loss") {
          evaluated.insert(event.step());
          EXPECT_GT(value.simple_value(), 0.0f);
        }
      }
    }
  }
  std::set<int64_t> checkpoints;
  for (const auto& [step, path] : checkpoint_files(dir_ / "run")) checkpoints.insert(step);
  EXPECT_EQ(evaluated, checkpoints);
  EXPECT_EQ(evaluated, (std::set<int64_t>{10, 20, 30, 40}));
}

}  // namespace
}  // namespace longhaul::worker_test
