// The logdir writer lease through the binary (supervisor/logdir_lease.h, issue #23): a chief
// frozen with SIGSTOP — what a chief cut off by a partition looks like to the others, while a
// shared volume keeps its flock — is taken over by a new `train` on the same logdir once its
// lease (shortened here with supervisor.lock_lease_secs; users get 30 s) runs out. Thawed, the
// old chief commits nothing more and exits 140; the new chief's checkpoints stand.
#include <gtest/gtest.h>

#include "longhaul/testing/eventually.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using namespace std::chrono_literals;

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(WorkerLockTest, AFrozenChiefIsTakenOverAndExits140WithoutCommitting) {
  const longhaul::testing::TestTempDir dir("worker_lock");
  // Checkpoints every 25 steps (several per second); never finishes on its own.
  write_text(dir / "lock.yaml", small_model_config(100000000, 25));
  const std::vector<std::string> lease = {"--set", "supervisor.lock_lease_secs=2"};
  std::vector<std::string> old_args = {"train", "--config", "lock.yaml", "--logdir", "run"};
  old_args.insert(old_args.end(), lease.begin(), lease.end());
  WorkerProcess old_chief(old_args, dir, dir);
  ASSERT_TRUE(longhaul::testing::eventually(
      [&] { return state_file_latest_step(dir / "run").value_or(0) >= 50; }, 120s))
      << old_chief.out() << old_chief.err();
  old_chief.signal(SIGSTOP);
  // Let a commit the signal may have interrupted show: the state file no longer changes.
  std::optional<int64_t> frozen_at;
  ASSERT_TRUE(longhaul::testing::eventually(
      [&] {
        const auto now = state_file_latest_step(dir / "run");
        const bool same = now == frozen_at;
        frozen_at = now;
        return same;
      },
      30s, 200ms));
  const std::string old_err_frozen = old_chief.err();
  const size_t saves_before = count(old_err_frozen, "checkpoint saved");

  // A new chief on the same logdir: refused while the lease is fresh, then takes over.
  const int64_t new_max = *frozen_at + 60;
  std::vector<std::string> new_args = old_args;
  new_args.insert(new_args.end(), {"--set", "training.max_steps=" + std::to_string(new_max)});
  const RunOutput next = run_worker(new_args, dir, 180s);
  ASSERT_EQ(next.exit_code, 0) << next.out << next.err;
  EXPECT_NE(next.err.find("taking over the logdir lock"), std::string::npos) << next.err;
  EXPECT_NE(next.err.find("pid " + std::to_string(old_chief.pid())), std::string::npos)
      << "the takeover names the old holder\n"
      << next.err;
  EXPECT_EQ(start_step(next.out), frozen_at) << next.out;
  ASSERT_EQ(state_file_latest_step(dir / "run"), new_max);
  const auto files_after_new_chief = checkpoint_files(dir / "run");

  // Thawed, the old chief finds the lock taken: nothing more is committed, exit 140.
  old_chief.signal(SIGCONT);
  const auto code = old_chief.wait(60s);
  ASSERT_TRUE(code.has_value()) << old_chief.err();
  EXPECT_EQ(*code, 140) << old_chief.err();
  EXPECT_NE(old_chief.err().find("lost the writer lock of logdir"), std::string::npos)
      << old_chief.err();
  EXPECT_EQ(count(old_chief.err(), "checkpoint saved"), saves_before)
      << old_chief.err().substr(old_err_frozen.size());
  EXPECT_EQ(state_file_latest_step(dir / "run"), new_max);
  const auto files = checkpoint_files(dir / "run");
  EXPECT_EQ(files.size(), files_after_new_chief.size());
  for (const auto& [step, path] : files) {
    EXPECT_TRUE(files_after_new_chief.count(step)) << path;
  }
}

}  // namespace
}  // namespace longhaul::worker_test
