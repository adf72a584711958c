// No peer can stall the group, at any phase (worker/distributed/README.md, "Liveness"): three
// replicas of the longhaul-worker binary on loopback, with the defaults a user gets (no
// recovery_wait_secs, the 300 s collective timeout), one of which stops itself at a chosen phase
// (the test-only LONGHAUL_TEST_STOP_AT, communicator.h): arrived at the rendezvous, before the
// mesh connects, before the state broadcast, inside a regroup, before the end-of-run meeting.
// There the test kills it (SIGKILL), leaves it frozen (SIGSTOP, sockets open) or stops a
// survivor (SIGTERM), and checks what a user sees: the survivors notice within the deadlines
// below (all far under the collective timeout) and carry on, or exit with the documented code
// (138: retry the group; 143: stopped by SIGTERM).
#include <cctype>
#include <chrono>
#include <functional>
#include <regex>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "longhaul/testing/eventually.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr int kWorld = 3;
// Generous for a loaded 2-core machine; the collective timeout (300 s) is far above it.
constexpr seconds kDeadline{120};

// A 1-layer, 32-wide model. Only max_wait_secs is set (a safety net should a test fail); every
// wait and timeout that matters here is the default.
std::string liveness_config(int64_t max_steps) {
  std::ostringstream y;
  y << "model: {preset: tiny, n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}\n"
    << "training: {batch_size: 2, seq_len: 16, max_steps: " << max_steps
    << ", learning_rate: 0.01, warmup_steps: 2, seed: 7}\n"
    << "checkpoint: {save_model_secs: 0, save_model_steps: 10, max_to_keep: 0}\n"
    << "summaries: {every_steps: 0, save_summaries_secs: 0}\n"
    << "log: {every_steps: 1}\n"
    << "eval: {every_steps: 0}\n"
    << "supervisor: {max_wait_secs: 300}\n";
  return y.str();
}

std::string tf_config(int rank) {
  return R"({"cluster": {"chief": ["127.0.0.1:2"], "worker": ["127.0.0.1:2", "127.0.0.1:2"]},)"
         R"( "task": {"type": ")" +
         std::string(rank == 0 ? "chief" : "worker") + R"(", "index": )" +
         std::to_string(rank == 0 ? 0 : rank - 1) + "}}";
}

// The last "step N/" progress step of a replica's stdout, or -1.
int64_t last_step(const std::string& out) {
  static const std::regex re(R"(step +(\d+)/\d+ \| loss)");
  int64_t last = -1;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    last = std::stoll((*it)[1].str());
  }
  return last;
}

bool stderr_has(WorkerProcess& p, const std::string& needle, seconds timeout) {
  return longhaul::testing::eventually([&] { return p.err().find(needle) != std::string::npos; },
                                       timeout, std::chrono::milliseconds(50));
}

void expect_exit(WorkerProcess& p, int code, const std::string& who) {
  EXPECT_EQ(p.wait(kDeadline), code) << who << ":\n" << p.err();
}

// Training goes on: the progress of `p` passes its current step by 5.
void expect_progress(WorkerProcess& p) {
  const int64_t now = last_step(p.out());
  EXPECT_TRUE(longhaul::testing::eventually([&] { return last_step(p.out()) >= now + 5; },
                                            kDeadline, std::chrono::milliseconds(50)))
      << "no progress after step " << now << ":\n"
      << p.err();
}

enum class Phase { kRendezvous, kConnect, kSync, kRegroup, kFinish };
enum class Fault { kKilled, kFrozen, kStopSignal };

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kRendezvous:
      return "rendezvous";
    case Phase::kConnect:
      return "connect";
    case Phase::kSync:
      return "sync";
    case Phase::kRegroup:
      return "regroup";
    case Phase::kFinish:
      return "finish";
  }
  return "?";
}

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kKilled:
      return "Killed";
    case Fault::kFrozen:
      return "Frozen";
    case Fault::kStopSignal:
      return "StopSignal";
  }
  return "?";
}

struct Case {
  Phase phase;
  Fault fault;
};

class DistLivenessTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    write_text(dir_ / "c.yaml", liveness_config(30));
    write_text(dir_ / "long.yaml", liveness_config(1'000'000));
  }

  // Rank `rank` of the group; `stop_at`: the phase where it stops itself (empty: never).
  std::unique_ptr<WorkerProcess> start_rank(int rank, const std::string& config,
                                            const std::string& stop_at = "") {
    std::map<std::string, std::string> env{{"TF_CONFIG", tf_config(rank)},
                                           {"LONGHAUL_RESTART_ATTEMPT", "a0"}};
    if (!stop_at.empty()) env["LONGHAUL_TEST_STOP_AT"] = stop_at;
    return std::make_unique<WorkerProcess>(
        std::vector<std::string>{"train", "--config", (dir_ / config).string(), "--logdir",
                                 (dir_ / "run").string()},
        dir_, dir_, std::move(env));
  }

  // The chief stops itself at c.phase once the workers started, and is then left as c.fault
  // says (killed, or stopped; frozen stays so); the workers waiting for it end: 143 when
  // SIGTERMed, else 138 (a lost peer). The chief is still to be killed by the caller.
  void run_with_the_chief_stopped(const Case& c,
                                  std::vector<std::unique_ptr<WorkerProcess>>& ranks) {
    const std::string stop_at = phase_name(c.phase);
    ranks[0] = start_rank(0, "c.yaml", stop_at);
    for (int r = 1; r < kWorld; ++r) ranks[r] = start_rank(r, "c.yaml");
    ASSERT_TRUE(stderr_has(*ranks[0], "LONGHAUL_TEST_STOP_AT: stopped at " + stop_at, kDeadline))
        << ranks[0]->err();
    if (c.fault == Fault::kKilled) ranks[0]->signal(SIGKILL);
    if (c.fault == Fault::kStopSignal) {
      for (int r = 1; r < kWorld; ++r) ranks[r]->signal(SIGTERM);
    }
    for (int r = 1; r < kWorld; ++r) {
      expect_exit(*ranks[r], c.fault == Fault::kStopSignal ? 143 : 138,
                  "rank " + std::to_string(r));
    }
  }

  longhaul::testing::TestTempDir dir_{"dist_liveness"};
};

// Before the group forms (rendezvous: rank 1 arrived, rank 2 not yet started; connect: every
// rank confirmed, rank 1 stops before its mesh connects): the others' connect fails within
// seconds and they meet again without it. Killed: a replacement joins and the run finishes.
// Frozen: once thawed it joins the new generation and the run finishes. A SIGTERM to the
// waiting survivors ends them at once (143).
void run_before_the_group_forms(Fault fault, std::vector<std::unique_ptr<WorkerProcess>>& ranks,
                                const std::function<std::unique_ptr<WorkerProcess>(int)>& start) {
  WorkerProcess& victim = *ranks[1];
  WorkerProcess& chief = *ranks[0];
  ASSERT_TRUE(stderr_has(chief, "could not connect the group", kDeadline))
      << "the chief did not notice the lost member:\n"
      << chief.err();
  if (fault == Fault::kStopSignal) {
    ranks[0]->signal(SIGTERM);
    ranks[2]->signal(SIGTERM);
    expect_exit(*ranks[0], 143, "rank 0");
    expect_exit(*ranks[2], 143, "rank 2");
    victim.signal(SIGKILL);
    victim.signal(SIGCONT);
    return;
  }
  if (fault == Fault::kKilled) {
    victim.signal(SIGKILL);
    ASSERT_TRUE(victim.wait(kDeadline).has_value());
    ranks[1] = start(1);
  } else {
    victim.signal(SIGCONT);
  }
  for (int r = 0; r < kWorld; ++r) {
    expect_exit(*ranks[r], 0, "rank " + std::to_string(r));
  }
}

TEST_P(DistLivenessTest, NoPeerStallsTheGroup) {
  const Case c = GetParam();
  const std::string stop_at = phase_name(c.phase);
  std::vector<std::unique_ptr<WorkerProcess>> ranks(kWorld);
  switch (c.phase) {
    case Phase::kRendezvous:
    case Phase::kConnect: {
      ranks[0] = start_rank(0, "c.yaml");
      ranks[1] = start_rank(1, "c.yaml", stop_at);
      // Rendezvous: rank 2 comes only once rank 1 stopped there, so the group is not formed.
      if (c.phase == Phase::kConnect) ranks[2] = start_rank(2, "c.yaml");
      ASSERT_TRUE(stderr_has(*ranks[1], "LONGHAUL_TEST_STOP_AT: stopped at " + stop_at, kDeadline))
          << ranks[1]->err();
      if (c.phase == Phase::kRendezvous) ranks[2] = start_rank(2, "c.yaml");
      run_before_the_group_forms(c.fault, ranks, [this](int r) { return start_rank(r, "c.yaml"); });
      return;
    }
    case Phase::kSync: {
      // The chief stops before it sends its state; the workers wait for it in the broadcast.
      ASSERT_NO_FATAL_FAILURE(run_with_the_chief_stopped(c, ranks));
      if (c.fault == Fault::kFrozen) {
        EXPECT_THAT(ranks[1]->err() + ranks[2]->err(), HasSubstr("did not refresh its heartbeat"));
      }
      ranks[0]->signal(SIGKILL);
      ranks[0]->signal(SIGCONT);
      return;
    }
    case Phase::kRegroup: {
      // Rank 1 is lost mid-run and replaced; rank 2 stops inside the regroup, a member of the
      // new generation, before the group agrees on its state.
      ranks[0] = start_rank(0, "long.yaml");
      ranks[1] = start_rank(1, "long.yaml");
      ranks[2] = start_rank(2, "long.yaml", stop_at);
      ASSERT_TRUE(ranks[0]->wait_for_stdout("step     10/", kDeadline)) << ranks[0]->err();
      ranks[1]->signal(SIGKILL);
      ASSERT_TRUE(ranks[1]->wait(kDeadline).has_value());
      ranks[1] = start_rank(1, "long.yaml");
      ASSERT_TRUE(stderr_has(*ranks[2], "LONGHAUL_TEST_STOP_AT: stopped at regroup", kDeadline))
          << ranks[2]->err();
      if (c.fault == Fault::kStopSignal) {
        ranks[0]->signal(SIGTERM);
        ranks[1]->signal(SIGTERM);
        expect_exit(*ranks[0], 143, "rank 0");
        expect_exit(*ranks[1], 143, "rank 1 (replacement)");
        ranks[2]->signal(SIGKILL);
        ranks[2]->signal(SIGCONT);
        return;
      }
      if (c.fault == Fault::kKilled) {
        ranks[2]->signal(SIGKILL);
        ASSERT_TRUE(ranks[2]->wait(kDeadline).has_value());
        ranks[2] = start_rank(2, "long.yaml");
      } else {
        ASSERT_TRUE(stderr_has(*ranks[0], "a peer was lost again while regrouping", kDeadline))
            << "rank 0 did not notice the frozen member:\n"
            << ranks[0]->err();
        ranks[2]->signal(SIGCONT);
      }
      expect_progress(*ranks[0]);
      for (auto& r : ranks) r->signal(SIGTERM);
      for (int r = 0; r < kWorld; ++r) expect_exit(*ranks[r], 143, "rank " + std::to_string(r));
      return;
    }
    case Phase::kFinish: {
      // The chief committed its final checkpoint and stops before the end-of-run meeting; the
      // workers wait for it there.
      ASSERT_NO_FATAL_FAILURE(run_with_the_chief_stopped(c, ranks));
      EXPECT_TRUE(fs::exists(dir_ / "run" / "training.done"));
      ranks[0]->signal(SIGKILL);
      ranks[0]->signal(SIGCONT);
      return;
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Phase p :
       {Phase::kRendezvous, Phase::kConnect, Phase::kSync, Phase::kRegroup, Phase::kFinish}) {
    for (Fault f : {Fault::kKilled, Fault::kFrozen, Fault::kStopSignal}) cases.push_back({p, f});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Phases, DistLivenessTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string phase = phase_name(info.param.phase);
                           phase[0] = static_cast<char>(std::toupper(phase[0]));
                           return phase + fault_name(info.param.fault);
                         });

}  // namespace
}  // namespace longhaul::worker_test
