// Supervisor::managed_session with a toy TrainingState: restore vs init + init_fn, services,
// errors, clean stops, non-chief waiting, final checkpoints, session logs, signals.
#include "longhaul/supervisor/supervisor.h"

#include <csignal>
#include <future>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/supervisor/signals.h"
#include "test_options.h"
#include "test_util.h"

namespace longhaul::supervisor {
namespace {

using testing::eventually;
using ::testing::HasSubstr;
using testing::list_dir;
using testing::quiet_options;
using testing::TempDir;
using testing::ToyState;

// Trains `steps` steps, calling step_boundary after each.
std::function<void(Supervisor&)> train(ToyState& state, int steps) {
  return [&state, steps](Supervisor& sv) {
    for (int i = 0; i < steps && !sv.should_stop(); ++i) {
      state.train_step();
      sv.step_boundary(state.global_step());
    }
  };
}

std::vector<tensorboard::Event> all_events(const std::filesystem::path& logdir) {
  std::vector<tensorboard::Event> out;
  for (const auto& f : list_events_files(logdir)) {
    for (auto& e : EventsReader::read_all(f)) out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::pair<int, int64_t>> session_logs(const std::filesystem::path& logdir) {
  std::vector<std::pair<int, int64_t>> out;
  for (const auto& e : all_events(logdir)) {
    if (e.has_session_log()) out.emplace_back(e.session_log().status(), e.step());
  }
  return out;
}

bool has_checkpoint(const std::filesystem::path& logdir, int64_t step) {
  return std::filesystem::exists(logdir / ("model.ckpt-" + std::to_string(step) + ".safetensors"));
}

TEST(Supervisor, InitialisesAndRunsInitFnWhenTheLogdirHasNoCheckpoint) {
  TempDir dir;
  ToyState state;
  int init_fn_calls = 0;
  auto opts = quiet_options(dir.path());
  opts.init_fn = [&](TrainingState&) { ++init_fn_calls; };
  Supervisor sv(opts);
  sv.managed_session(state, train(state, 5));
  EXPECT_EQ(state.initialize_calls, 1);
  EXPECT_EQ(init_fn_calls, 1);
  EXPECT_EQ(state.restore_calls, 0);
  EXPECT_FALSE(sv.restored_step());
  EXPECT_TRUE(has_checkpoint(dir.path(), 5)) << "final checkpoint when training ends";
  using SL = tensorboard::SessionLog;
  EXPECT_EQ(session_logs(dir.path()), (std::vector<std::pair<int, int64_t>>{
                                          {SL::START, 0}, {SL::CHECKPOINT, 5}, {SL::STOP, 5}}));
  for (const auto& e : all_events(dir.path())) {
    if (e.has_session_log() && e.session_log().status() == SL::CHECKPOINT) {
      EXPECT_EQ(e.session_log().checkpoint_path(), (dir / "model.ckpt-5.safetensors").string());
    }
  }
}

// worker/distributed recovery in place: a replacement takes its state from the running replicas,
// and a worker that outlived a chief that never came back commits the last step in its place.
TEST(Supervisor, StateFromPeersReadsNoCheckpointAndASuccessorCommitsOnlyWhenTheLockIsFree) {
  TempDir dir;
  ToyState chief_state;
  auto chief_opts = quiet_options(dir.path());
  auto chief = std::make_unique<Supervisor>(chief_opts);
  chief->managed_session(chief_state, train(chief_state, 4));  // checkpoint at step 4
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.is_chief = false;
  opts.state_from_peers = [&](TrainingState& s) {
    auto& toy = static_cast<ToyState&>(s);
    toy.initialize();
    for (int i = 0; i < 6; ++i) toy.train_step();  // "received": step 6
  };
  auto worker_sv = std::make_unique<Supervisor>(opts);
  Supervisor& worker = *worker_sv;
  worker.managed_session(state, [](Supervisor&) {});
  EXPECT_EQ(state.restore_calls, 0) << "no checkpoint read";
  EXPECT_EQ(state.global_step(), 6);
  // The chief is alive (holds the writer lock): the worker writes nothing.
  EXPECT_FALSE(worker.commit_checkpoint_as_successor(state).has_value());
  EXPECT_FALSE(has_checkpoint(dir.path(), 6));
  chief.reset();  // the chief is gone: its lock with it
  const auto written = worker.commit_checkpoint_as_successor(state);
  ASSERT_TRUE(written.has_value());
  EXPECT_TRUE(has_checkpoint(dir.path(), 6));
  EXPECT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-6");
  // Another survivor (one step behind) waits for the lock, and never replaces a later checkpoint.
  ToyState behind;
  behind.initialize();
  for (int i = 0; i < 5; ++i) behind.train_step();
  Supervisor other(opts);
  EXPECT_FALSE(other.commit_checkpoint_as_successor(behind).has_value()) << "lock held";
  worker_sv.reset();
  EXPECT_FALSE(other.commit_checkpoint_as_successor(behind).has_value()) << "step 6 exists";
  EXPECT_FALSE(has_checkpoint(dir.path(), 5));
  EXPECT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-6");
}

// Chief promotion (worker/distributed/README.md): a worker whose chief was lost takes over the
// chief's writes in the middle of its session, but never while the chief still holds the
// writer lock; it removes the chief's half-written checkpoint, opens its own events file at the
// step it took over and ends the session with the final checkpoint.
TEST(Supervisor, PromotedWorkerTakesOverTheChiefsWritesOnlyOnceTheChiefIsGone) {
  TempDir dir;
  ToyState chief_state;
  auto chief = std::make_unique<Supervisor>(quiet_options(dir.path()));
  chief->managed_session(chief_state, train(chief_state, 4));  // final checkpoint at step 4
  const auto half_written = dir.path() / "model.ckpt-5.safetensors.tmp.12345.0";
  testing::write_bytes(half_written, "the chief died here");
  struct Listener : CheckpointListener {
    void on_saved(const CheckpointStats& s) override { saved.push_back(s.step); }
    void on_restored(const RestoredCheckpoint&) override { ++restores; }
    void on_chief_role_taken(const RestoredCheckpoint& latest) override { taken = latest.step; }
    std::vector<int64_t> saved;
    int restores = 0;
    int64_t taken = -1;
  } listener;
  auto opts = quiet_options(dir.path());
  opts.is_chief = false;
  opts.checkpoint_listeners = {&listener};
  opts.state_from_peers = [](TrainingState& s) {
    auto& toy = static_cast<ToyState&>(s);
    toy.initialize();
    for (int i = 0; i < 4; ++i) toy.train_step();
  };
  ToyState state;
  Supervisor worker(opts);
  EXPECT_THROW(worker.promote_to_chief(state, std::chrono::seconds(1)), FailedPrecondition)
      << "only inside a session";
  worker.managed_session(state, [&](Supervisor& sv) {
    train(state, 2)(sv);  // step 6: the worker ran on with the others
    EXPECT_TRUE(sv.events_file().empty());
    EXPECT_THROW(sv.promote_to_chief(state, std::chrono::milliseconds(100)), Aborted)
        << "the chief is alive: never two writers";
    EXPECT_FALSE(sv.is_chief());
    EXPECT_TRUE(std::filesystem::exists(half_written));
    chief.reset();  // the chief is gone, its lock with it
    sv.promote_to_chief(state, std::chrono::seconds(10));
    EXPECT_TRUE(sv.is_chief());
    EXPECT_FALSE(std::filesystem::exists(half_written));
    EXPECT_FALSE(sv.events_file().empty());
    EXPECT_THROW(sv.promote_to_chief(state, std::chrono::seconds(1)), FailedPrecondition);
    train(state, 3)(sv);  // step 9
  });
  EXPECT_EQ(listener.taken, 4) << "the checkpoint gauges show the chief's latest at once";
  EXPECT_EQ(listener.restores, 0) << "nothing was read";
  EXPECT_EQ(listener.saved, std::vector<int64_t>{9}) << "the session ends as a chief's";
  EXPECT_EQ(read_checkpoint_state(dir.path()).value().model_checkpoint_path, "model.ckpt-9");
  EXPECT_EQ(list_events_files(dir.path()).size(), 2u) << "one events file per writer";
  // The chief's session (START 0, its checkpoint, STOP 4), then the new chief's from the step it
  // took over.
  EXPECT_EQ(session_logs(dir.path()),
            (std::vector<std::pair<int, int64_t>>{{tensorboard::SessionLog::START, 0},
                                                  {tensorboard::SessionLog::CHECKPOINT, 4},
                                                  {tensorboard::SessionLog::STOP, 4},
                                                  {tensorboard::SessionLog::START, 6},
                                                  {tensorboard::SessionLog::CHECKPOINT, 9},
                                                  {tensorboard::SessionLog::STOP, 9}}));
}

TEST(Supervisor, RestoresTheLatestCheckpointAndSkipsInitFn) {
  TempDir dir;
  {
    ToyState state;
    Supervisor sv(quiet_options(dir.path()));
    sv.managed_session(state, train(state, 7));
  }
  ToyState state;
  int init_fn_calls = 0;
  auto opts = quiet_options(dir.path());
  opts.init_fn = [&](TrainingState&) { ++init_fn_calls; };
  struct Listener : CheckpointListener {
    void on_saved(const CheckpointStats& s) override { saved.push_back(s.step); }
    void on_restored(const RestoredCheckpoint& r) override {
      restored = r.step;
      restored_info = r;
    }
    std::vector<int64_t> saved;
    int64_t restored = -1;
    RestoredCheckpoint restored_info;
  } listener;
  opts.checkpoint_listeners = {&listener};
  Supervisor sv(opts);
  sv.managed_session(state, train(state, 3));
  EXPECT_EQ(state.restore_calls, 1);
  EXPECT_EQ(state.initialize_calls, 0);
  EXPECT_EQ(init_fn_calls, 0) << "init_fn must not run when a checkpoint exists";
  EXPECT_EQ(sv.restored_step(), 7);
  EXPECT_EQ(listener.restored, 7);
  // The listener learns when that checkpoint was committed and how big it is, so a restarted
  // worker's "last checkpoint" metrics are not empty until its first save.
  CheckpointManager manager({.logdir = dir.path(), .remove_temp_files = false});
  CheckpointEntry seven;
  for (const auto& e : manager.checkpoints()) {
    if (e.step == 7) seven = e;
  }
  ASSERT_EQ(seven.step, 7) << "the checkpoint restored from is still listed";
  EXPECT_EQ(listener.restored_info.file, seven.file);
  EXPECT_EQ(listener.restored_info.wall_time, seven.timestamp);
  EXPECT_GT(listener.restored_info.wall_time, 1.6e9);
  EXPECT_EQ(listener.restored_info.bytes, std::filesystem::file_size(seven.file));
  EXPECT_EQ(listener.saved, std::vector<int64_t>{10});
  EXPECT_EQ(state.values[0][0], 10.0f) << "restored values continued, not re-initialised";
  EXPECT_EQ(list_events_files(dir.path()).size(), 2u) << "a restart opens a new events file";
  using SL = tensorboard::SessionLog;
  auto logs = session_logs(dir.path());
  EXPECT_THAT(logs, ::testing::Contains(std::pair<int, int64_t>{SL::START, 7}));
  EXPECT_THAT(logs, ::testing::Contains(std::pair<int, int64_t>{SL::STOP, 10}));
}

TEST(Supervisor, CheckpointServiceSnapshotsOnTheTrainingThreadAtStepBoundaries) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.save_model_secs = 0.01;
  Supervisor sv(opts);
  std::thread::id training_thread = std::this_thread::get_id();
  sv.managed_session(state, [&](Supervisor& sv) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!sv.should_stop() && sv.checkpoints_saved() < 3) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no periodic checkpoints";
      state.train_step();
      sv.step_boundary(state.global_step());
    }
  });
  EXPECT_GE(sv.checkpoints_saved(), 3);
  MutexLock lock(state.threads_mu);
  for (auto id : state.snapshot_threads) EXPECT_EQ(id, training_thread);
}

TEST(Supervisor, RequestCheckpointIsTakenAtTheNextStepBoundary) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.checkpoint_on_stop = false;
  Supervisor sv(opts);
  sv.managed_session(state, [&](Supervisor& sv) {
    for (int i = 0; i < 6; ++i) {
      state.train_step();
      if (state.global_step() == 3) sv.request_checkpoint();
      sv.step_boundary(state.global_step());
    }
  });
  EXPECT_TRUE(has_checkpoint(dir.path(), 3));
  EXPECT_FALSE(has_checkpoint(dir.path(), 6)) << "checkpoint_on_stop=false";
  EXPECT_EQ(state.snapshot_calls, 1);
}

TEST(Supervisor, NoDuplicateFinalCheckpointWhenTheLastStepWasSaved) {
  TempDir dir;
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  sv.managed_session(state, [&](Supervisor& sv) {
    state.train_step();
    sv.request_checkpoint();
    sv.step_boundary(state.global_step());
  });
  EXPECT_EQ(state.snapshot_calls, 1);
  EXPECT_TRUE(has_checkpoint(dir.path(), 1));
}

TEST(Supervisor, BodyErrorStopsServicesAndIsReraisedAfterCleanup) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.save_model_secs = 0.01;
  opts.save_summaries_secs = 0.01;
  Supervisor sv(opts);
  std::atomic<bool> loop_ran{false};
  try {
    sv.managed_session(state, [&](Supervisor& sv) {
      sv.loop(0.005, [&] { loop_ran = true; });
      ASSERT_TRUE(eventually([&] { return loop_ran.load(); }, std::chrono::seconds(10)));
      state.train_step();
      throw Internal("numerical blow-up at step 1");
    });
    FAIL() << "the body's error was swallowed";
  } catch (const Internal& e) {
    EXPECT_THAT(e.what(), HasSubstr("blow-up"));
  }
  EXPECT_TRUE(sv.coord().running_threads().empty()) << "services joined before re-raise";
  EXPECT_FALSE(has_checkpoint(dir.path(), 1)) << "no final checkpoint after an error";
  using SL = tensorboard::SessionLog;
  EXPECT_THAT(session_logs(dir.path()), ::testing::Contains(std::pair<int, int64_t>{SL::STOP, 1}));
}

TEST(Supervisor, ServiceErrorStopsTheBodyAndIsReraised) {
  TempDir dir;
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  EXPECT_THROW(sv.managed_session(state,
                                  [&](Supervisor& sv) {
                                    sv.loop(0.005,
                                            [] { throw Unavailable("metrics push failed"); });
                                    while (!sv.should_stop()) {
                                      state.train_step();
                                      sv.step_boundary(state.global_step());
                                    }
                                  }),
               Unavailable);
}

TEST(Supervisor, OutOfRangeIsACleanEndWithAFinalCheckpoint) {
  TempDir dir;
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  EXPECT_NO_THROW(sv.managed_session(state, [&](Supervisor&) {
    state.train_step();
    state.train_step();
    throw OutOfRange("data exhausted");
  }));
  EXPECT_TRUE(has_checkpoint(dir.path(), 2));
}

TEST(Supervisor, NotReadyErrorListsWhatIsUninitialised) {
  TempDir dir;
  ToyState state;
  state.leave_uninitialized = true;
  Supervisor sv(quiet_options(dir.path()));
  try {
    sv.managed_session(state, [](Supervisor&) { FAIL() << "body ran on an unready model"; });
    FAIL();
  } catch (const FailedPrecondition& e) {
    EXPECT_THAT(e.what(), HasSubstr("transformer.wte.weight"));
    EXPECT_THAT(e.what(), HasSubstr("transformer.h.0.attn.c_attn.weight"));
  }
}

TEST(Supervisor, CheckpointOfAnotherShapeIsRefusedNamingTheTensor) {
  TempDir dir;
  {
    ToyState state(3);
    Supervisor sv(quiet_options(dir.path()));
    sv.managed_session(state, train(state, 1));
  }
  ToyState wider(4);
  Supervisor sv(quiet_options(dir.path()));
  try {
    sv.managed_session(wider, [](Supervisor&) {});
    FAIL();
  } catch (const FailedPrecondition& e) {
    EXPECT_THAT(e.what(), HasSubstr("transformer.wte.weight"));
  }
  EXPECT_TRUE(has_checkpoint(dir.path(), 1)) << "the old checkpoint is left intact";
}

TEST(Supervisor, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  TempDir dir;
  {
    ToyState state;
    Supervisor sv(quiet_options(dir.path()));
    sv.managed_session(state, [&](Supervisor& sv) {
      state.train_step();
      sv.request_checkpoint();
      sv.step_boundary(1);
      state.train_step();
    });
  }
  testing::write_bytes(dir / "model.ckpt-2.safetensors", "truncated");
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  sv.managed_session(state, [](Supervisor&) {});
  EXPECT_EQ(sv.restored_step(), 1);
}

TEST(Supervisor, NonChiefGivesUpWithDeadlineExceededAndWritesNothing) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.is_chief = false;
  opts.recovery_wait_secs = 0.01;
  opts.max_wait_secs = 0.05;
  Supervisor sv(opts);
  try {
    sv.managed_session(state, [](Supervisor&) { FAIL() << "body ran without a chief"; });
    FAIL();
  } catch (const DeadlineExceeded& e) {
    EXPECT_THAT(e.what(), HasSubstr("chief"));
    EXPECT_THAT(e.what(), HasSubstr(dir.path().string()));
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(Supervisor, NonChiefRestoresOnceTheChiefHasCheckpointedAndWritesNothing) {
  TempDir dir;
  {
    ToyState chief_state;
    Supervisor chief(quiet_options(dir.path()));
    chief.managed_session(chief_state, train(chief_state, 4));
  }
  auto before = list_dir(dir.path());
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.is_chief = false;
  opts.save_model_secs = 0.01;
  opts.save_summaries_secs = 0.01;
  Supervisor sv(opts);
  sv.managed_session(state, [&](Supervisor& sv) {
    for (int i = 0; i < 3; ++i) {
      state.train_step();
      sv.add_scalar("loss", 1.0, state.global_step());
      sv.request_checkpoint();
      sv.step_boundary(state.global_step());
    }
  });
  EXPECT_EQ(sv.restored_step(), 4);
  EXPECT_EQ(state.snapshot_calls, 0);
  EXPECT_EQ(list_dir(dir.path()), before);
}

TEST(Supervisor, NonChiefWaitsForTheChiefReadyMarker) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.is_chief = false;
  opts.recovery_wait_secs = 0.005;
  opts.max_wait_secs = 30;
  Supervisor sv(opts);
  auto session =
      std::async(std::launch::async, [&] { sv.managed_session(state, [](Supervisor&) {}); });
  testing::write_bytes(dir / std::string(kChiefReadyFile), "step: 0\n");
  session.get();
  EXPECT_EQ(state.initialize_calls, 1);
}

TEST(Supervisor, SummaryServiceStepCounterAndScalarsReachTheEventsFile) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.save_summaries_secs = 0.01;
  std::atomic<int> summary_fn_calls{0};
  std::thread::id summary_thread;
  opts.summary_fn = [&](Supervisor& sv) {
    summary_thread = std::this_thread::get_id();
    sv.add_scalar("from_summary_fn", 1.0, 0);
    ++summary_fn_calls;
  };
  Supervisor sv(opts);
  // The step counter runs on a thread of its own: on a loaded machine the summary thread can run
  // three times before it runs once, so the loop also waits for its first value in the file. A
  // read that meets a record the writer has not finished flushing counts as "not yet".
  auto events_hold = [&](const std::string& tag) {
    try {
      for (const auto& e : all_events(dir.path())) {
        for (const auto& v : e.summary().value()) {
          if (v.tag() == tag) return true;
        }
      }
    } catch (const DataLoss&) {
    }
    return false;
  };
  sv.managed_session(state, [&](Supervisor& sv) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (summary_fn_calls < 3 || !events_hold("global_step/sec")) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
      state.train_step();
      sv.add_scalar("loss", 0.5, state.global_step());
      tensorboard::Summary summary;
      auto* v = summary.add_value();
      v->set_tag("computed_in_loop");
      v->set_simple_value(2.0f);
      sv.summary_computed(summary, state.global_step());
      sv.step_boundary(state.global_step());
    }
  });
  EXPECT_NE(summary_thread, std::this_thread::get_id());
  std::set<std::string> tags;
  for (const auto& e : all_events(dir.path())) {
    for (const auto& v : e.summary().value()) tags.insert(v.tag());
  }
  EXPECT_TRUE(tags.contains("loss"));
  EXPECT_TRUE(tags.contains("from_summary_fn"));
  EXPECT_TRUE(tags.contains("computed_in_loop"));
  EXPECT_TRUE(tags.contains("global_step/sec"));
}

TEST(Supervisor, WriteEventsOffWritesNoEventsFile) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.write_events = false;
  Supervisor sv(opts);
  sv.managed_session(state, train(state, 2));
  EXPECT_TRUE(list_events_files(dir.path()).empty());
  EXPECT_TRUE(has_checkpoint(dir.path(), 2));
}

TEST(Supervisor, ServicesThatIgnoreTheStopRaiseDeadlineExceededAfterTheGrace) {
  TempDir dir;
  ToyState state;
  auto opts = quiet_options(dir.path());
  opts.stop_grace_secs = 0.02;
  auto sv = std::make_unique<Supervisor>(opts);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<bool> entered{false};
  try {
    sv->managed_session(state, [&](Supervisor& sv) {
      sv.loop(
          0.001,
          [&, released] {
            entered = true;
            released.wait();
          },
          "stubborn_loop");
      ASSERT_TRUE(eventually([&] { return entered.load(); }, std::chrono::seconds(10)));
    });
    FAIL();
  } catch (const DeadlineExceeded& e) {
    EXPECT_THAT(e.what(), HasSubstr("stubborn_loop"));
  }
  release.set_value();
  sv.reset();  // joins the straggler
}

TEST(Supervisor, SigtermTakesAFinalCheckpointAndStopsCleanly) {
  TempDir dir;
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  SignalHandler signals(sv);
  sv.managed_session(state, [&](Supervisor& sv) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!sv.should_stop()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "SIGTERM did not stop the loop";
      state.train_step();
      if (state.global_step() == 3) std::raise(SIGTERM);
      sv.step_boundary(state.global_step());
    }
  });
  EXPECT_EQ(signals.signal_received(), SIGTERM);
  EXPECT_TRUE(has_checkpoint(dir.path(), state.global_step()));
  using SL = tensorboard::SessionLog;
  EXPECT_THAT(session_logs(dir.path()),
              ::testing::Contains(std::pair<int, int64_t>{SL::STOP, state.global_step()}));
}

TEST(SupervisorDeathTest, ExitDeadlineEndsAProcessThatDoesNotStopInTime) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const longhaul::testing::ChildTempDirsInside children(dir);
  EXPECT_EXIT(
      {
        Supervisor sv(quiet_options(dir.path()));
        SignalHandler signals(sv, {SIGUSR1}, 0.05);
        std::raise(SIGUSR1);
        // A training loop that never checks should_stop(): only the deadline ends it.
        std::this_thread::sleep_for(std::chrono::seconds(60));
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kAbortedExitCode), "still running");
}

// Regression: a second signal logged "exiting at once without a final checkpoint" but exited
// 128+signo (143/130), the codes that mean "committed".
TEST(SupervisorDeathTest, SecondSignalExitsAtOnceWithACodeThatClaimsNoCommit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const longhaul::testing::ChildTempDirsInside children(dir);
  EXPECT_EXIT(
      {
        Supervisor sv(quiet_options(dir.path()));
        SignalHandler signals(sv, {SIGUSR1}, 3600);
        std::raise(SIGUSR1);
        std::raise(SIGUSR1);
        std::this_thread::sleep_for(std::chrono::seconds(60));
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kAbortedExitCode), "second signal");
}

// A signal that arrives before any supervisor exists (start-up) is delivered when one attaches.
TEST(Supervisor, ASignalBeforeAttachIsDeliveredOnAttach) {
  TempDir dir;
  ToyState state;
  SignalHandler signals({SIGUSR2}, 0);
  std::raise(SIGUSR2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!signals.stop_requested() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(signals.stop_requested());
  Supervisor sv(quiet_options(dir.path()));
  signals.attach(sv);
  EXPECT_TRUE(sv.should_stop());
  signals.detach();
}

// Regression: two chiefs on one logdir both ran, both claimed commits, and retention orphaned
// each other's files. The second is refused naming the holder; once the first is gone (as when
// its process dies: the kernel drops the flock) a new one starts.
TEST(Supervisor, ASecondWriterOnTheLogdirIsRefusedNamingTheHolder) {
  TempDir dir;
  auto first = std::make_unique<Supervisor>(quiet_options(dir.path()));
  try {
    Supervisor second(quiet_options(dir.path()));
    FAIL() << "a second writer was accepted";
  } catch (const AlreadyExists& e) {
    EXPECT_THAT(e.what(), HasSubstr("in use by another training process"));
    EXPECT_THAT(e.what(), HasSubstr("pid " + std::to_string(::getpid())));
  }
  first.reset();
  EXPECT_NO_THROW(Supervisor third(quiet_options(dir.path())));
}

TEST(Supervisor, AStopRequestedBeforeTheSessionIsKept) {
  TempDir dir;
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  // As a SIGTERM during start-up would: the session must not erase it.
  sv.request_checkpoint();
  sv.request_stop(std::make_exception_ptr(Cancelled("SIGTERM during start-up")));
  int steps = 0;
  EXPECT_NO_THROW(sv.managed_session(state, [&](Supervisor& sv) {
    while (!sv.should_stop() && steps < 1000) {
      ++steps;
      state.train_step();
      sv.step_boundary(state.global_step());
    }
  }));
  EXPECT_EQ(steps, 0);
}

TEST(Supervisor, ASecondSessionStartsAfresh) {
  TempDir dir;
  ToyState state;
  Supervisor sv(quiet_options(dir.path()));
  sv.managed_session(state, train(state, 2));
  EXPECT_TRUE(sv.should_stop());
  sv.managed_session(state, train(state, 3));
  EXPECT_EQ(state.global_step(), 5);
  EXPECT_TRUE(has_checkpoint(dir.path(), 5));
  EXPECT_EQ(sv.restored_step(), 2);
}

TEST(Supervisor, RejectsBadOptions) {
  TempDir dir;
  auto opts = quiet_options(dir.path());
  opts.save_model_secs = -1;
  EXPECT_THROW(Supervisor{opts}, InvalidArgument);
  opts = quiet_options("");
  EXPECT_THROW(Supervisor{opts}, InvalidArgument);
}

}  // namespace
}  // namespace longhaul::supervisor
