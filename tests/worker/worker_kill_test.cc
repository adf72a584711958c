// kill -9 at random instants while a worker checkpoints several times a second, at least 50
// times: after every kill the state file names a fully valid checkpoint (structure + every
// CRC-32C), and every restart restores exactly the checkpoint the state file named at the time
// of the kill — never a broken one, never an older one.
#include <random>

#include <gtest/gtest.h>

#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using namespace std::chrono_literals;

TEST(WorkerKillTest, EveryRestartAfterKill9RestoresTheNewestCommittedCheckpoint) {
  const longhaul::testing::TestTempDir dir("worker_kill");
  // Checkpoints every 25 steps (several per second) and every second; never finishes.
  write_text(dir / "kill.yaml", small_model_config(100000000, 25, 1));
  std::mt19937 rng(20240520);
  std::uniform_int_distribution<int> delay_ms(0, 700);
  constexpr int kCycles = 55;
  int restores = 0;
  std::optional<int64_t> committed;  // the state file's latest at the last kill
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    WorkerProcess p({"train", "--config", "kill.yaml", "--logdir", "run"}, dir, dir);
    ASSERT_TRUE(p.wait_for_stdout("at step", 60s)) << p.out() << p.err();
    const auto started = start_step(p.out());
    ASSERT_TRUE(started.has_value()) << p.out();
    if (committed) {
      // The restart restored exactly the checkpoint the state file named.
      EXPECT_EQ(*started, *committed) << p.out() << p.err();
      EXPECT_NE(p.out().find("resuming at step"), std::string::npos);
      ++restores;
    } else {
      EXPECT_EQ(*started, 0);
    }
    if (!committed) {  // make sure the first kill lands after the first commit
      ASSERT_TRUE(p.wait_for_stdout("step     30/", 60s)) << p.out() << p.err();
    }
    // Let it train and checkpoint for a random time, then kill -9.
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    p.signal(SIGKILL);
    ASSERT_EQ(p.wait(30s), 128 + SIGKILL);

    committed = state_file_latest_step(dir / "run");
    if (committed) {
      const auto files = checkpoint_files(dir / "run");
      ASSERT_TRUE(files.count(*committed)) << "state file names a missing checkpoint";
      supervisor::SafetensorsReader reader(
          files.at(*committed), supervisor::SafetensorsReader::Options{.require_checksums = true});
      EXPECT_NO_THROW(reader.verify_all()) << files.at(*committed);
      EXPECT_EQ(reader.global_step(), *committed);
      // Monotonic: a restart never loses committed progress.
      ASSERT_GE(*committed, started.value_or(0));
    }
  }
  EXPECT_GE(restores, 40) << "too few kills landed after the first checkpoint";
}

}  // namespace
}  // namespace longhaul::worker_test
