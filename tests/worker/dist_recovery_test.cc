// Recovery in place (worker/distributed/README.md): three data-parallel replicas of the
// longhaul-worker binary on loopback lose one (SIGKILL between steps, SIGKILL in the middle of a
// step's gradient all-reduce, the chief, the chief in the middle of a checkpoint write, a SIGTERM
// preemption notice, two losses in a row); a replacement with the same rank joins, takes the
// survivors' state by broadcast, and the run ends with the parameters of an uninterrupted run of
// the same config in the same environment. No process reads a checkpoint, no step is redone and
// the step counter never goes back. When the chief is lost, the lowest surviving rank takes over
// its writes (chief promotion) and the replacement joins as a worker; checkpoints and events go
// on in the same logdir, one writer at a time. A replacement that never comes ends with a final
// checkpoint of the last completed step and exit 138.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "longhaul/base/error.h"
#include "longhaul/supervisor/checkpoint_state.h"
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
using ::testing::Not;

constexpr int kWorld = 3;

// A 1-layer, 32-wide model, 2 sequences of 16 tokens per replica per step (two gradient
// buckets per step), a checkpoint every 10 steps (so a restart WOULD have one to read).
std::string recovery_config(int64_t max_steps, double regroup_timeout_secs) {
  std::ostringstream y;
  y << "model: {preset: tiny, n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}\n"
    << "training: {batch_size: 2, seq_len: 16, max_steps: " << max_steps
    << ", learning_rate: 0.01, warmup_steps: 2, seed: 7}\n"
    << "checkpoint: {save_model_secs: 0, save_model_steps: 10, max_to_keep: 0}\n"
    << "summaries: {every_steps: 10, save_summaries_secs: 0}\n"
    << "log: {every_steps: 1}\n"
    << "eval: {every_steps: 0, batches: 4}\n"
    << "supervisor: {recovery_wait_secs: 0.05, max_wait_secs: 120, on_peer_loss: regroup, "
    << "regroup_timeout_secs: " << regroup_timeout_secs << "}\n";
  return y.str();
}

std::string tf_config(int rank) {
  std::string workers;
  for (int i = 1; i < kWorld; ++i) workers += (i > 1 ? ", " : "") + std::string("\"127.0.0.1:2\"");
  return R"({"cluster": {"chief": ["127.0.0.1:2"], "worker": [)" + workers +
         R"(]}, "task": {"type": ")" + (rank == 0 ? "chief" : "worker") + R"(", "index": )" +
         std::to_string(rank == 0 ? 0 : rank - 1) + "}}";
}

// What the operator (or the local kubelet) gives a pod: a replacement gets exactly the same.
std::map<std::string, std::string> replica_env(int rank, int collective_timeout_secs = 60) {
  return {{"TF_CONFIG", tf_config(rank)},
          {"LONGHAUL_RESTART_ATTEMPT", "a0"},
          {"LONGHAUL_COLLECTIVE_TIMEOUT_SECS", std::to_string(collective_timeout_secs)}};
}

using longhaul::testing::eventually;

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

// Largest absolute difference between two checkpoints' tensors (parameters and moments).
double max_difference(const fs::path& a, const fs::path& b) {
  const auto x = read_tensors(a), y = read_tensors(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (const auto& [name, want] : x) {
    const auto it = y.find(name);
    if (it == y.end() || it->second.size() != want.size()) {
      ADD_FAILURE() << "tensor " << name << " differs in presence or size";
      return INFINITY;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(it->second[i]) - want[i]));
    }
  }
  return worst;
}

// The steps of the progress lines ("step     12/400 | loss ..."), in order.
std::vector<int64_t> progress_steps(const std::string& out) {
  static const std::regex re(R"(step +(\d+)/\d+ \| loss)");
  std::vector<int64_t> steps;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    steps.push_back(std::stoll((*it)[1]));
  }
  return steps;
}

// The events of one file in order. A file whose writer was SIGKILLed may end in a cut record
// (TensorBoard ignores it too): only with `tail_may_be_cut` is that accepted.
std::vector<tensorboard::Event> read_events(const fs::path& path, bool tail_may_be_cut) {
  supervisor::EventsReader reader(path);
  std::vector<tensorboard::Event> events;
  try {
    while (auto e = reader.next_event()) events.push_back(std::move(*e));
  } catch (const DataLoss& e) {
    if (!tail_may_be_cut) ADD_FAILURE() << path << ": " << e.what();
  }
  return events;
}

// After a run whose chief role moved (`writers`: the processes that held it, in order, the last
// one to the end): the logdir holds one events file per writer; each was written while no other
// was (its events all come after the previous file's); the last one reads cleanly, starts with
// SessionLog START at the step it took over and ends with SessionLog STOP at `steps`, and its
// training scalars are those of the steps after the hand-over. Every checkpoint verifies, none
// is left half-written, and the writer lock names the last writer.
void expect_one_writer_at_a_time(const fs::path& logdir, const std::vector<WorkerProcess*>& writers,
                                 int64_t steps) {
  // In the order they were opened (file names have a one-second resolution).
  auto files = supervisor::list_events_files(logdir);
  ASSERT_EQ(files.size(), writers.size());
  auto opened = [](const fs::path& f) {
    const auto events = read_events(f, true);
    return events.empty() ? INFINITY : events.front().wall_time();
  };
  std::stable_sort(files.begin(), files.end(),
                   [&](const fs::path& a, const fs::path& b) { return opened(a) < opened(b); });
  double previous_end = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const bool last = i + 1 == files.size();
    const auto events = read_events(files[i], /*tail_may_be_cut=*/!last);
    ASSERT_FALSE(events.empty()) << files[i];
    double begin = INFINITY, end = 0;
    int64_t start_step = -1, stop_step = -1, last_loss_index = -1;
    bool device_text = false;
    for (const auto& e : events) {
      if (e.has_file_version()) continue;
      begin = std::min(begin, e.wall_time());
      end = std::max(end, e.wall_time());
      if (e.has_session_log() && e.session_log().status() == tensorboard::SessionLog::START) {
        if (start_step < 0) start_step = e.step();
      }
      if (e.has_session_log() && e.session_log().status() == tensorboard::SessionLog::STOP) {
        stop_step = e.step();
      }
      if (e.has_summary()) {
        for (const auto& v : e.summary().value()) {
          if (v.tag() == "loss") {
            EXPECT_GE(e.step(), start_step) << files[i] << ": a scalar before the hand-over";
            last_loss_index = e.step();
          }
          if (v.tag().starts_with("device")) device_text = true;
        }
      }
    }
    EXPECT_GE(begin, previous_end) << files[i] << " was written while an earlier writer still was";
    previous_end = end;
    if (last) {
      EXPECT_GT(start_step, 0) << "the last writer took over mid-run";
      // Regression: a promoted chief's events file lacked the `device` text summary
      // (TensorBoard's Text tab showed nothing for the rest of the run). Earlier writers were
      // killed, so what they had not flushed yet is lost with them.
      EXPECT_TRUE(device_text) << files[i] << " has no `device` text summary";
      EXPECT_EQ(stop_step, steps);
      EXPECT_EQ(last_loss_index, steps - 10) << "summaries every 10 steps, at the step's index";
    }
  }
  const auto state = supervisor::read_checkpoint_state(logdir);
  ASSERT_TRUE(state.has_value());
  int64_t previous = -1;
  for (const auto& prefix : state->all_model_checkpoint_paths) {
    const int64_t step = supervisor::checkpoint_step(prefix).value_or(-1);
    EXPECT_GT(step, previous) << "the checkpoint list went back";
    previous = step;
  }
  EXPECT_EQ(previous, steps);
  for (const auto& [step, file] : checkpoint_files(logdir)) {
    EXPECT_NO_THROW(supervisor::SafetensorsReader(file).verify_all()) << file;
  }
  for (const auto& e : fs::directory_iterator(logdir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
        << "left half-written: " << e.path();
  }
  EXPECT_THAT(read_text(logdir / ".writer.lock"),
              HasSubstr("pid " + std::to_string(writers.back()->pid()) + ","));
}

class DistRecoveryTest : public ::testing::Test {
 protected:
  std::vector<std::string> train_args(const std::string& logdir) {
    return {"train", "--config", (dir_ / "c.yaml").string(), "--logdir", (dir_ / logdir).string()};
  }
  std::unique_ptr<WorkerProcess> start_rank(const std::string& logdir, int rank,
                                            std::map<std::string, std::string> extra_env = {}) {
    auto env = replica_env(rank, collective_timeout_secs_);
    for (auto& [k, v] : extra_env) env[k] = v;
    return std::make_unique<WorkerProcess>(train_args(logdir), dir_, dir_, std::move(env));
  }

  // An uninterrupted run of the same config: the reference. The regroup timeout does not change
  // the numbers, so one reference per step count serves the whole suite.
  fs::path reference_run(int64_t max_steps) {
    const fs::path file = reference_dir() / std::to_string(max_steps) /
                          ("model.ckpt-" + std::to_string(max_steps) + ".safetensors");
    if (fs::exists(file)) return file;
    const std::string logdir = (reference_dir() / std::to_string(max_steps)).string();
    fs::create_directories(reference_dir());
    std::vector<std::unique_ptr<WorkerProcess>> ranks;
    for (int r = 0; r < kWorld; ++r) {
      auto env = replica_env(r, collective_timeout_secs_);
      env["LONGHAUL_RESTART_ATTEMPT"] = "ref";
      ranks.push_back(std::make_unique<WorkerProcess>(
          std::vector<std::string>{"train", "--config", (dir_ / "c.yaml").string(), "--logdir",
                                   logdir},
          dir_, dir_, std::move(env)));
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(ranks[r]->wait(seconds(300)), 0)
          << "reference rank " << r << ": " << ranks[r]->err();
    }
    return file;
  }
  // Shared by the suite's tests, removed when the test program ends.
  static const fs::path& reference_dir() {
    static const longhaul::testing::TempDir dir("recovery_reference");
    return dir.path();
  }

  longhaul::testing::TestTempDir dir_{"recovery"};
  int collective_timeout_secs_ = 60;
};

// How a replica is lost.
enum class Loss { kKilledBetweenCollectives, kKilledMidAllreduce, kPreempted };

struct Scenario {
  const char* name;
  int victim;
  Loss loss;
};

class InPlaceRecoveryTest : public DistRecoveryTest,
                            public ::testing::WithParamInterface<Scenario> {};

TEST_P(InPlaceRecoveryTest, ReplacementJoinsAndTheRunMatchesAnUninterruptedOne) {
  const Scenario sc = GetParam();
  const int64_t steps = 200;
  const int64_t lose_at = 40;
  write_text(dir_ / "c.yaml", recovery_config(steps, 240));
  const fs::path reference = reference_run(steps);

  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    std::map<std::string, std::string> env;
    if (sc.loss == Loss::kKilledMidAllreduce && r == sc.victim) {
      env["LONGHAUL_TEST_KILL_MID_ALLREDUCE"] = std::to_string(lose_at);
    }
    ranks.push_back(start_rank("run", r, env));
  }
  const int watcher = sc.victim == 0 ? 1 : 0;  // a survivor whose progress we follow
  char line[32];
  std::snprintf(line, sizeof line, "step %6lld/", static_cast<long long>(lose_at));
  if (sc.loss != Loss::kKilledMidAllreduce) {
    ASSERT_TRUE(ranks[watcher]->wait_for_stdout(line, seconds(240))) << ranks[watcher]->err();
    ranks[sc.victim]->signal(sc.loss == Loss::kPreempted ? SIGTERM : SIGKILL);
  }
  const int want_code = sc.loss == Loss::kPreempted ? 143 : 128 + SIGKILL;
  ASSERT_EQ(ranks[sc.victim]->wait(seconds(240)), want_code) << ranks[sc.victim]->err();
  // The replacement: a fresh process with the same rank, attempt and environment.
  auto replacement = start_rank("run", sc.victim);
  for (int r = 0; r < kWorld; ++r) {
    WorkerProcess& p = r == sc.victim ? *replacement : *ranks[r];
    ASSERT_EQ(p.wait(seconds(300)), 0) << "rank " << r << ": " << p.err();
  }

  // Zero steps lost, none redone, no checkpoint read.
  const auto joined_at = start_step(replacement->out());
  ASSERT_TRUE(joined_at.has_value()) << replacement->out();
  EXPECT_GE(*joined_at, sc.loss == Loss::kKilledMidAllreduce ? lose_at - 1 : lose_at);
  EXPECT_THAT(replacement->out(), HasSubstr("state from the running replicas"));
  EXPECT_THAT(replacement->err(), HasSubstr("no checkpoint read"));
  EXPECT_THAT(replacement->err(), Not(HasSubstr("restored checkpoint")));
  for (int r = 0; r < kWorld; ++r) {
    if (r == sc.victim) continue;
    EXPECT_THAT(ranks[r]->err(), HasSubstr("regrouped: training continues in place"))
        << "rank " << r;
    EXPECT_THAT(ranks[r]->err(), Not(HasSubstr("restored checkpoint"))) << "rank " << r;
    // The survivor's step counter only moves forward, one step at a time, to the end.
    const auto seen = progress_steps(ranks[r]->out());
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), steps) << "rank " << r;
    for (size_t i = 1; i < seen.size(); ++i) {
      ASSERT_GT(seen[i], seen[i - 1]) << "rank " << r << " went back or repeated a step";
      // A survivor one step behind the others catches up by taking their state (see
      // data_parallel.h), so at most one progress line is missing.
      ASSERT_LE(seen[i], seen[i - 1] + 2) << "rank " << r << " skipped steps";
    }
  }
  if (sc.loss == Loss::kPreempted) {
    // The leaving replica told the others at its last step boundary (they did not have to notice
    // a broken connection or wait out a collective timeout).
    EXPECT_THAT(ranks[watcher]->err(), HasSubstr("left the data-parallel group"));
  }
  // The same parameters and moments as without the loss. Every replica sums the same three
  // per-rank gradients in the same ring order in both runs, so this is bit-identical in
  // practice; the bound is fp32 noise, far below one step's update (learning_rate 0.01).
  const fs::path mine = dir_ / "run" / ("model.ckpt-" + std::to_string(steps) + ".safetensors");
  ASSERT_TRUE(fs::exists(mine));
  EXPECT_LE(max_difference(reference, mine), 1e-6);
  EXPECT_EQ(read_text(dir_ / "run" / "training.done"), std::to_string(steps) + "\n");
  if (sc.victim == 0) {
    // Chief promotion: rank 1, the lowest survivor, took over the chief's writes; rank 2 and
    // the replacement rank 0 (a worker now) wrote nothing.
    EXPECT_THAT(ranks[1]->err(), HasSubstr("took over as chief"));
    EXPECT_THAT(ranks[2]->err(), Not(HasSubstr("took over as chief")));
    EXPECT_THAT(replacement->err(), Not(HasSubstr("took over as chief")));
    expect_one_writer_at_a_time(dir_ / "run", {ranks[0].get(), ranks[1].get()}, steps);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Losses, InPlaceRecoveryTest,
    ::testing::Values(Scenario{"WorkerKilled", 2, Loss::kKilledBetweenCollectives},
                      Scenario{"WorkerKilledMidAllreduce", 1, Loss::kKilledMidAllreduce},
                      Scenario{"ChiefKilled", 0, Loss::kKilledBetweenCollectives},
                      Scenario{"WorkerPreempted", 2, Loss::kPreempted},
                      Scenario{"ChiefPreempted", 0, Loss::kPreempted}),
    [](const auto& info) { return std::string(info.param.name); });

// Two losses in a row, both of the chief: rank 0 is lost, rank 1 takes over as chief and rank
// 0's replacement joins as a worker; then rank 1 is lost, and rank 0 — the lowest survivor now —
// takes over, while rank 1's replacement joins as a worker. The run still ends where an
// uninterrupted one does, and each writer's checkpoints and events follow the previous one's.
TEST_F(DistRecoveryTest, TwoLossesInARowOfTheChiefPromoteTheLowestSurvivorEachTime) {
  const int64_t steps = 200;
  write_text(dir_ / "c.yaml", recovery_config(steps, 240));
  const fs::path reference = reference_run(steps);
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(start_rank("run", r));
  ASSERT_TRUE(ranks[1]->wait_for_stdout("step     40/", seconds(240))) << ranks[1]->err();
  ranks[0]->signal(SIGKILL);
  ASSERT_EQ(ranks[0]->wait(seconds(60)), 128 + SIGKILL);
  std::unique_ptr<WorkerProcess> first_chief = std::move(ranks[0]);
  ranks[0] = start_rank("run", 0);
  // The replacement trains (it printed a step after joining) and rank 1 writes as the chief;
  // then rank 1 goes too.
  ASSERT_TRUE(ranks[0]->wait_for_stdout("state from the running replicas", seconds(240)))
      << ranks[0]->err();
  ASSERT_TRUE(ranks[0]->wait_for_stdout(" | loss ", seconds(240))) << ranks[0]->err();
  ASSERT_TRUE(
      eventually([&] { return ranks[1]->err().find("took over as chief") != std::string::npos; },
                 seconds(120)))
      << ranks[1]->err();
  ranks[1]->signal(SIGKILL);
  ASSERT_EQ(ranks[1]->wait(seconds(60)), 128 + SIGKILL);
  std::unique_ptr<WorkerProcess> second_chief = std::move(ranks[1]);
  ranks[1] = start_rank("run", 1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(ranks[r]->wait(seconds(300)), 0) << "rank " << r << ": " << ranks[r]->err();
    EXPECT_THAT(ranks[r]->err(), Not(HasSubstr("restored checkpoint"))) << "rank " << r;
  }
  EXPECT_THAT(ranks[0]->err(), HasSubstr("took over as chief"));
  EXPECT_THAT(ranks[1]->err(), Not(HasSubstr("took over as chief")));
  EXPECT_THAT(ranks[2]->err(), Not(HasSubstr("took over as chief")));
  // Rank 2 regrouped twice, each time without going back.
  EXPECT_THAT(ranks[2]->err(), HasSubstr("regroups=2"));
  const auto seen = progress_steps(ranks[2]->out());
  for (size_t i = 1; i < seen.size(); ++i) ASSERT_GT(seen[i], seen[i - 1]);
  const fs::path mine = dir_ / "run" / ("model.ckpt-" + std::to_string(steps) + ".safetensors");
  EXPECT_LE(max_difference(reference, mine), 1e-6);
  EXPECT_EQ(read_text(dir_ / "run" / "training.done"), std::to_string(steps) + "\n");
  expect_one_writer_at_a_time(dir_ / "run", {first_chief.get(), second_chief.get(), ranks[0].get()},
                              steps);
}

// The chief is lost in the middle of a checkpoint write: LONGHAUL_TEST_PAUSE_CHECKPOINT_WRITE
// holds its writer thread inside model.ckpt-30 (temp file half written) and the test kills it
// there. The half-written file never becomes a checkpoint: the latest stays step 20 until rank
// 1, now the chief, removes the temp file and commits its own; the run ends as an uninterrupted
// one.
TEST_F(DistRecoveryTest, ChiefKilledInTheMiddleOfACheckpointWrite) {
  const int64_t steps = 200;
  write_text(dir_ / "c.yaml", recovery_config(steps, 240));
  const fs::path reference = reference_run(steps);
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  ranks.push_back(start_rank(
      "run", 0, {{"LONGHAUL_TEST_PAUSE_CHECKPOINT_WRITE", "model.ckpt-30.safetensors"}}));
  for (int r = 1; r < kWorld; ++r) ranks.push_back(start_rank("run", r));
  ASSERT_TRUE(eventually(
      [&] {
        return ranks[0]->err().find("paused in the middle of a checkpoint write") !=
               std::string::npos;
      },
      seconds(240)))
      << ranks[0]->err();
  bool half_written = false;
  for (const auto& e : fs::directory_iterator(dir_ / "run")) {
    half_written |= e.path().filename().string().starts_with("model.ckpt-30.safetensors.tmp.");
  }
  EXPECT_TRUE(half_written) << "the chief is inside the write of model.ckpt-30";
  ranks[0]->signal(SIGKILL);
  ASSERT_EQ(ranks[0]->wait(seconds(60)), 128 + SIGKILL);
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 20);
  std::unique_ptr<WorkerProcess> first_chief = std::move(ranks[0]);
  ranks[0] = start_rank("run", 0);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(ranks[r]->wait(seconds(300)), 0) << "rank " << r << ": " << ranks[r]->err();
    EXPECT_THAT(ranks[r]->err(), Not(HasSubstr("restored checkpoint"))) << "rank " << r;
  }
  EXPECT_THAT(ranks[1]->err(), HasSubstr("took over as chief"));
  EXPECT_THAT(ranks[1]->err(), HasSubstr("removing temp file left by an interrupted checkpoint"));
  const fs::path mine = dir_ / "run" / ("model.ckpt-" + std::to_string(steps) + ".safetensors");
  EXPECT_LE(max_difference(reference, mine), 1e-6);
  expect_one_writer_at_a_time(dir_ / "run", {first_chief.get(), ranks[1].get()}, steps);
}

// The second worker dies while the survivors wait for the first one's replacement: the
// generation being formed names a dead process, so connecting it fails (after the collective
// timeout, 5 s here) and everyone — the chief and a replacement that already arrived — moves on
// to the next generation instead of giving up.
TEST_F(DistRecoveryTest, ALossDuringTheRegroupIsRecoveredToo) {
  collective_timeout_secs_ = 5;
  const int64_t steps = 200;
  write_text(dir_ / "c.yaml", recovery_config(steps, 240));
  const fs::path reference = reference_run(steps);
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(start_rank("run", r));
  ASSERT_TRUE(ranks[0]->wait_for_stdout("step     40/", seconds(240))) << ranks[0]->err();
  ranks[2]->signal(SIGKILL);
  ASSERT_EQ(ranks[2]->wait(seconds(60)), 128 + SIGKILL);
  ASSERT_TRUE(
      eventually([&] { return ranks[1]->err().find("regrouping: waiting") != std::string::npos; },
                 seconds(120)))
      << ranks[1]->err();
  ranks[1]->signal(SIGKILL);
  ASSERT_EQ(ranks[1]->wait(seconds(60)), 128 + SIGKILL);
  ranks[2] = start_rank("run", 2);
  ranks[1] = start_rank("run", 1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(ranks[r]->wait(seconds(300)), 0) << "rank " << r << ": " << ranks[r]->err();
    EXPECT_THAT(ranks[r]->err(), Not(HasSubstr("restored checkpoint"))) << "rank " << r;
  }
  EXPECT_THAT(ranks[1]->out(), HasSubstr("state from the running replicas"));
  EXPECT_THAT(ranks[2]->out(), HasSubstr("state from the running replicas"));
  const auto seen = progress_steps(ranks[0]->out());
  for (size_t i = 1; i < seen.size(); ++i) ASSERT_GT(seen[i], seen[i - 1]);
  const fs::path mine = dir_ / "run" / ("model.ckpt-" + std::to_string(steps) + ".safetensors");
  EXPECT_LE(max_difference(reference, mine), 1e-6);
}

TEST_F(DistRecoveryTest, ReplacementThatNeverComesEndsWithAFinalCheckpointAndExit138) {
  write_text(dir_ / "c.yaml", recovery_config(1'000'000, /*regroup_timeout_secs=*/3));
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(start_rank("run", r));
  ASSERT_TRUE(ranks[0]->wait_for_stdout("step     25/", seconds(240))) << ranks[0]->err();
  ranks[2]->signal(SIGKILL);
  ASSERT_EQ(ranks[2]->wait(seconds(60)), 128 + SIGKILL);
  for (int r : {0, 1}) {
    EXPECT_EQ(ranks[r]->wait(seconds(120)), 138) << "rank " << r << ": " << ranks[r]->err();
    EXPECT_THAT(ranks[r]->err(), HasSubstr("not replaced within supervisor.regroup_timeout_secs"));
  }
  // The chief committed its last completed step (the last progress line it printed), so a
  // group restart loses nothing.
  const auto seen = progress_steps(ranks[0]->out());
  ASSERT_FALSE(seen.empty());
  const auto latest = state_file_latest_step(dir_ / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, seen.back());
  EXPECT_GE(*latest, 25);
  EXPECT_NO_THROW(
      supervisor::SafetensorsReader(checkpoint_files(dir_ / "run").at(*latest)).verify_all());
  EXPECT_FALSE(fs::exists(dir_ / "run" / "training.done"));
}

// The chief is lost and never replaced: nobody holds the logdir's writer lock any more, so a
// surviving worker commits the last step the survivors completed before exiting 138.
// A hung replica (alive, sockets open, silent: SIGSTOP) is declared lost after the collective
// timeout; nobody replaces a process that still runs, so the survivors give up after the regroup
// timeout with a final checkpoint and exit 138 — they never hang with it.
TEST_F(DistRecoveryTest, HungReplicaEndsInAFinalCheckpointAndExit138) {
  collective_timeout_secs_ = 2;
  write_text(dir_ / "c.yaml", recovery_config(1'000'000, /*regroup_timeout_secs=*/3));
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(start_rank("run", r));
  ASSERT_TRUE(ranks[0]->wait_for_stdout("step     25/", seconds(240))) << ranks[0]->err();
  ranks[1]->signal(SIGSTOP);
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks[r]->wait(seconds(120)), 138) << "rank " << r << ": " << ranks[r]->err();
  }
  ranks[1]->signal(SIGKILL);
  ranks[1]->signal(SIGCONT);
  EXPECT_TRUE(ranks[1]->wait(seconds(30)).has_value());
  const auto seen = progress_steps(ranks[0]->out());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), seen.back());
}

TEST_F(DistRecoveryTest, ChiefNeverReplacedAWorkerCommitsTheLastCompletedStep) {
  write_text(dir_ / "c.yaml", recovery_config(1'000'000, /*regroup_timeout_secs=*/3));
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(start_rank("run", r));
  ASSERT_TRUE(ranks[1]->wait_for_stdout("step     25/", seconds(240))) << ranks[1]->err();
  ranks[0]->signal(SIGKILL);
  ASSERT_EQ(ranks[0]->wait(seconds(60)), 128 + SIGKILL);
  int64_t lowest_last = INT64_MAX, highest_last = 0;
  for (int r : {1, 2}) {
    EXPECT_EQ(ranks[r]->wait(seconds(120)), 138) << "rank " << r << ": " << ranks[r]->err();
    const auto seen = progress_steps(ranks[r]->out());
    ASSERT_FALSE(seen.empty());
    lowest_last = std::min(lowest_last, seen.back());
    highest_last = std::max(highest_last, seen.back());
  }
  // Survivors differ by at most one step; the checkpoint is one of their last completed steps
  // (not the last periodic one, every 10 steps), written by exactly one of them.
  EXPECT_LE(highest_last - lowest_last, 1);
  const auto latest = state_file_latest_step(dir_ / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_GE(*latest, lowest_last);
  EXPECT_LE(*latest, highest_last);
  EXPECT_NO_THROW(
      supervisor::SafetensorsReader(checkpoint_files(dir_ / "run").at(*latest)).verify_all());
  const std::string both = ranks[1]->err() + ranks[2]->err();
  EXPECT_THAT(both, HasSubstr("committed a checkpoint in place of the lost chief"));
}

}  // namespace
}  // namespace longhaul::worker_test
