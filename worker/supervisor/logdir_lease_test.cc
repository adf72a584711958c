// The logdir writer lease (logdir_lease.h) through the Supervisor and the checkpoint manager: a
// live holder is never taken over, a dead one is replaced at once, a frozen one (SIGSTOP, as a
// partitioned node looks to the others) is taken over after its lease and, thawed, commits
// nothing and stops with LeaseLost. Leases are shortened here; users get 30 s.
#include "longhaul/supervisor/logdir_lease.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/supervisor/checkpoint_manager.h"
#include "longhaul/supervisor/checkpoint_state.h"
#include "longhaul/supervisor/supervisor.h"
#include "test_options.h"
#include "test_util.h"

namespace longhaul::supervisor {
namespace {

using testing::eventually;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::ToyState;
using namespace std::chrono_literals;

SupervisorOptions chief_options(const std::filesystem::path& logdir, double lease_secs,
                                double heartbeat_secs) {
  SupervisorOptions o = testing::quiet_options(logdir);
  o.lock_lease_secs = lease_secs;
  o.lock_heartbeat_secs = heartbeat_secs;
  return o;
}

LeaseRecord record_in(const std::filesystem::path& logdir) {
  auto r = LeaseRecord::parse(testing::read_bytes(logdir / kWriterLockFile));
  EXPECT_TRUE(r.has_value()) << testing::read_bytes(logdir / kWriterLockFile);
  return r.value_or(LeaseRecord{});
}

bool has_checkpoint(const std::filesystem::path& logdir, int64_t step) {
  return std::filesystem::exists(logdir / ("model.ckpt-" + std::to_string(step) + ".safetensors"));
}

// A child process (fork) running `holder`; the pipe tells the parent when it holds the lock and
// carries one byte from the parent to the child. Killed and reaped by the destructor if alive.
class ChildProcess {
 public:
  explicit ChildProcess(const std::function<int(int ready_fd, int command_fd)>& holder) {
    int to_parent[2], to_child[2];
    if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) throw Internal("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to_parent[0]);
      ::close(to_child[1]);
      int code = 99;
      try {
        code = holder(to_parent[1], to_child[0]);
      } catch (...) {
        code = 98;
      }
      ::_exit(code);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    from_child_ = to_parent[0];
    to_child_ = to_child[1];
  }
  ~ChildProcess() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    ::close(from_child_);
    ::close(to_child_);
  }
  // Blocks until the child wrote its ready byte (false when it exited first).
  bool wait_ready() {
    char c = 0;
    return ::read(from_child_, &c, 1) == 1;
  }
  void send(char c) { ASSERT_EQ(::write(to_child_, &c, 1), 1); }
  void signal(int sig) { ::kill(pid_, sig); }
  void wait_stopped() {
    int st = 0;
    ASSERT_EQ(::waitpid(pid_, &st, WUNTRACED), pid_);
    ASSERT_TRUE(WIFSTOPPED(st));
  }
  // The exit code once it exits within `timeout` (128 + signal when killed), else nullopt.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    eventually(
        [&] {
          int st = 0;
          if (::waitpid(pid_, &st, WNOHANG) == pid_ && (WIFEXITED(st) || WIFSIGNALED(st))) {
            status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          }
          return status_.has_value();
        },
        timeout);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int from_child_ = -1, to_child_ = -1;
  std::optional<int> status_;
};

constexpr int kExitLeaseLost = 40;
constexpr int kExitOtherError = 41;

// A live holder keeps renewing: however long a contender keeps trying, it is refused, naming
// the holder and how recently it renewed; the holder still commits afterwards.
TEST(LogdirLease, ALiveHolderIsNeverTakenOver) {
  TempDir dir;
  ToyState state;
  // A lease of 2 s renewed every 50 ms: the holder's heartbeat would have to be starved of the
  // CPU for 2 s to lapse, even on a loaded machine.
  Supervisor holder(chief_options(dir.path(), /*lease=*/2, /*heartbeat=*/0.05));
  const auto until = std::chrono::steady_clock::now() + 6500ms;  // more than three leases
  int refusals = 0;
  while (std::chrono::steady_clock::now() < until) {
    try {
      Supervisor contender(chief_options(dir.path(), 2, 0.05));
      FAIL() << "a live holder was taken over after " << refusals << " refusals";
    } catch (const AlreadyExists& e) {
      EXPECT_THAT(e.what(), HasSubstr("pid " + std::to_string(::getpid())));
      EXPECT_THAT(e.what(), HasSubstr("renewed its lease"));
      ++refusals;
    }
    std::this_thread::sleep_for(50ms);  // a contender's retry interval, not a synchronisation
  }
  EXPECT_GT(refusals, 10);
  EXPECT_EQ(record_in(dir.path()).generation, 1);
  holder.managed_session(state, [&](Supervisor& sv) {
    state.train_step();
    sv.step_boundary(state.global_step());
  });
  EXPECT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-1");
}

// A holder that died (kill -9) released its flock with its process: the next chief takes over
// at once, however long the lease (as before leases existed).
TEST(LogdirLease, AHolderThatDiedIsReplacedAtOnce) {
  TempDir dir;
  const double hour = 3600;
  {
    ChildProcess child([&](int ready, int command) {
      Supervisor sv(chief_options(dir.path(), hour, 0));
      char c = 'r';
      if (::write(ready, &c, 1) != 1) return 1;
      return static_cast<int>(::read(command, &c, 1));  // until killed
    });
    ASSERT_TRUE(child.wait_ready());
    child.signal(SIGKILL);
    ASSERT_EQ(child.wait_exit(60s), 128 + SIGKILL);
  }
  EXPECT_EQ(record_in(dir.path()).generation, 1);
  Supervisor next(chief_options(dir.path(), hour, 0));  // no wait, no lease ran out
  const LeaseRecord r = record_in(dir.path());
  EXPECT_EQ(r.generation, 2);
  EXPECT_THAT(r.holder, HasSubstr("pid " + std::to_string(::getpid())));
}

// The regression this lease exists for: a chief frozen (SIGSTOP; a partitioned node looks the
// same from the shared filesystem, which keeps its flock) is taken over once its lease runs
// out. Thawed, it finds it lost the lock, commits nothing — not the checkpoint it was asked for
// — and its session ends with LeaseLost; the new chief's checkpoint and state file stand.
TEST(LogdirLease, AFrozenHolderIsTakenOverAndNeverCommitsAgain) {
  TempDir dir;
  const double lease = 1.0;
  ChildProcess child([&](int ready, int command) {
    ToyState state;
    Supervisor sv(chief_options(dir.path(), lease, 0.1));
    try {
      sv.managed_session(state, [&](Supervisor& sv) {
        char c = 'r';
        if (::write(ready, &c, 1) != 1) throw Internal("cannot tell the parent");
        if (::read(command, &c, 1) != 1) throw Internal("no command");  // thawed here
        state.train_step();                                             // step 1, then a checkpoint
        sv.request_checkpoint();
        sv.step_boundary(state.global_step());
        while (!sv.should_stop()) sv.coord().wait_for_stop(10ms);
      });
    } catch (const LeaseLost&) {
      return kExitLeaseLost;
    } catch (...) {
      return kExitOtherError;
    }
    return 0;
  });
  ASSERT_TRUE(child.wait_ready());
  child.signal(SIGSTOP);
  child.wait_stopped();

  std::unique_ptr<Supervisor> next;
  ASSERT_TRUE(eventually(
      [&] {
        try {
          next = std::make_unique<Supervisor>(chief_options(dir.path(), lease, 0.1));
          return true;
        } catch (const AlreadyExists&) {
          return false;
        }
      },
      60s))
      << "the frozen holder was never taken over";
  EXPECT_EQ(record_in(dir.path()).generation, 2);
  ToyState state;
  next->managed_session(state, [&](Supervisor& sv) {
    for (int i = 0; i < 3; ++i) {
      state.train_step();
      sv.step_boundary(state.global_step());
    }
  });
  ASSERT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-3");

  child.send('c');  // read as soon as it runs again: it tries to checkpoint step 1
  child.signal(SIGCONT);
  EXPECT_EQ(child.wait_exit(60s), kExitLeaseLost);
  EXPECT_FALSE(has_checkpoint(dir.path(), 1));
  EXPECT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-3");
  for (const auto& name : testing::list_dir(dir.path())) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  }
  EXPECT_EQ(record_in(dir.path()).generation, 2) << "the old holder never rewrote the lock";
}

// The fence itself: a holder whose heartbeat stalled (here: never runs) is taken over; its
// next commit is refused before the rename, nothing of it becomes visible, and the loss is
// reported once.
TEST(LogdirLease, ATakenOverHolderCannotCommitOrDelete) {
  TempDir dir;
  const auto path = dir.path() / kWriterLockFile;
  std::atomic<int> reported{0};
  auto old = LogdirLease::acquire(LeaseOptions{path, 0.2, /*heartbeat=*/3600},
                                  [&](std::exception_ptr) { ++reported; });
  CheckpointManagerOptions mo{dir.path(), "model.ckpt", 1, 10000, true};
  mo.fence = [&] { old->check_held(); };
  CheckpointManager manager(mo);
  ToyState state;
  state.initialize();
  Snapshot snapshot;
  state.snapshot(snapshot);
  manager.save(snapshot);  // step 0: still held
  EXPECT_NO_THROW(old->check_held());

  std::unique_ptr<LogdirLease> next;
  ASSERT_TRUE(eventually(
      [&] {
        try {
          next = LogdirLease::acquire(LeaseOptions{path, 0.2, 0.02}, nullptr);
          return true;
        } catch (const AlreadyExists&) {
          return false;
        }
      },
      60s));
  EXPECT_EQ(next->generation(), 2);
  state.train_step();
  state.snapshot(snapshot);
  try {
    manager.save(snapshot);
    FAIL() << "a taken-over holder committed a checkpoint";
  } catch (const LeaseLost& e) {
    EXPECT_THAT(e.what(), HasSubstr("took the logdir lock over"));
    EXPECT_THAT(e.what(), HasSubstr("generation 2"));
  }
  EXPECT_TRUE(old->lost());
  EXPECT_EQ(reported.load(), 1);
  EXPECT_THROW(old->check_held(), LeaseLost);
  EXPECT_EQ(reported.load(), 1) << "reported once";
  EXPECT_FALSE(has_checkpoint(dir.path(), 1));
  EXPECT_TRUE(has_checkpoint(dir.path(), 0)) << "max_to_keep 1 must not have deleted step 0";
  EXPECT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-0");
  EXPECT_NO_THROW(next->check_held());
}

TEST(LogdirLease, RecordsRoundTripAndTornOnesAreRejected) {
  LeaseRecord r;
  r.holder = "host h, pid 7, boot_id b, since 1";
  r.generation = 12;
  r.renewed = 1764240000.25;
  r.lease_secs = 30;
  const std::string text = r.to_text();
  const auto back = LeaseRecord::parse(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->holder, r.holder);
  EXPECT_EQ(back->generation, 12);
  EXPECT_DOUBLE_EQ(back->renewed, r.renewed);
  EXPECT_DOUBLE_EQ(back->lease_secs, 30);
  std::string torn = text;
  torn[text.find("renewed: ") + 12] ^= 1;
  EXPECT_FALSE(LeaseRecord::parse(torn).has_value());
  EXPECT_FALSE(LeaseRecord::parse("host h, pid 7, boot_id b, since 1").has_value())
      << "the single-line lock file of earlier versions is not a lease: never judged stale";
}

}  // namespace
}  // namespace longhaul::supervisor
