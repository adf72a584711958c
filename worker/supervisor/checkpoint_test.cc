// CheckpointState text format, CheckpointManager (commit, retention across restarts,
// latest_valid fallback) and AsyncCheckpointer (one write at a time, errors to the coordinator).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/supervisor/async_checkpointer.h"
#include "longhaul/supervisor/checkpoint_state.h"
#include "longhaul/supervisor/coordinator.h"
#include "test_util.h"

namespace longhaul::supervisor {
namespace {

using ::testing::HasSubstr;
using testing::list_dir;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Snapshot snapshot_at(int64_t step, float fill = 1.0f) {
  Snapshot s;
  s.reshape(testing::toy_specs(3));
  for (auto& b : s.buffers) {
    auto* f = reinterpret_cast<float*>(b.data());
    for (size_t i = 0; i < b.size() / 4; ++i) f[i] = fill + static_cast<float>(i);
  }
  s.step = step;
  return s;
}

std::vector<int64_t> steps_on_disk(const std::filesystem::path& dir) {
  std::vector<int64_t> steps;
  for (const auto& name : list_dir(dir)) {
    if (!name.ends_with(".safetensors")) continue;
    if (auto s = checkpoint_step(name)) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

TEST(CheckpointState, WritesTensorFlowTextFormat) {
  CheckpointState st;
  st.model_checkpoint_path = "model.ckpt-1234";
  st.all_model_checkpoint_paths = {"model.ckpt-1000", "model.ckpt-1234"};
  st.all_model_checkpoint_timestamps = {1763731200.25, 1763731800.5};
  st.last_preserved_timestamp = 1763730000;
  EXPECT_EQ(st.to_text(),
            "model_checkpoint_path: \"model.ckpt-1234\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-1000\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-1234\"\n"
            "all_model_checkpoint_timestamps: 1763731200.25\n"
            "all_model_checkpoint_timestamps: 1763731800.5\n"
            "last_preserved_timestamp: 1763730000\n");
  EXPECT_EQ(CheckpointState::parse(st.to_text()), st);
}

TEST(CheckpointState, RoundTripsEscapesAndFullPrecision) {
  CheckpointState st;
  st.model_checkpoint_path = "odd \"name\"\\x\n\x01";
  st.all_model_checkpoint_paths = {st.model_checkpoint_path};
  st.all_model_checkpoint_timestamps = {1763731200.123456789};
  st.last_preserved_timestamp = 1.5e9;
  EXPECT_EQ(st.to_text().substr(0, st.to_text().find('\n') + 1),
            "model_checkpoint_path: \"odd \\\"name\\\"\\\\x\\n\\001\"\n");
  EXPECT_EQ(CheckpointState::parse(st.to_text()), st);
}

TEST(CheckpointState, ParsesWhatTensorFlowWritesAndSkipsUnknownFields) {
  auto st = CheckpointState::parse(
      "model_checkpoint_path: \"/abs/logdir/model.ckpt-20\"\n"
      "all_model_checkpoint_paths: '/abs/logdir/model.ckpt-10'\n"
      "all_model_checkpoint_paths: \"/abs/logdir/model.ckpt-20\"\n"
      "all_model_checkpoint_timestamps: 1.7e+09\n"
      "all_model_checkpoint_timestamps: 1700000100.5\n"
      "some_future_field: 3\n"
      "\n"
      "last_preserved_timestamp: 1699999999.0\n");
  EXPECT_EQ(st.model_checkpoint_path, "/abs/logdir/model.ckpt-20");
  EXPECT_EQ(st.all_model_checkpoint_paths.size(), 2u);
  EXPECT_EQ(st.all_model_checkpoint_timestamps[0], 1.7e9);
  EXPECT_EQ(st.last_preserved_timestamp, 1699999999.0);
}

TEST(CheckpointState, GarbledTextIsDataLossNamingTheFileAndLine) {
  for (const char* text : {"model_checkpoint_path: \"unterminated\n", "\x01\x02\x03 binary junk\n",
                           "", "all_model_checkpoint_timestamps: x\n",
                           "all_model_checkpoint_paths: \"a\"\nall_model_checkpoint_timestamps: 1\n"
                           "all_model_checkpoint_timestamps: 2\n"}) {
    try {
      CheckpointState::parse(text, "/logdir/checkpoint");
      FAIL() << "accepted: " << text;
    } catch (const DataLoss& e) {
      EXPECT_THAT(e.what(), HasSubstr("/logdir/checkpoint"));
      EXPECT_THAT(e.what(), HasSubstr("line"));
    }
  }
}

TEST(CheckpointState, PrefixesMapToSafetensorsFiles) {
  EXPECT_EQ(checkpoint_file_for("/l", "model.ckpt-1234"), "/l/model.ckpt-1234.safetensors");
  EXPECT_EQ(checkpoint_file_for("/l", "/o/model.ckpt-5"), "/o/model.ckpt-5.safetensors");
  EXPECT_EQ(checkpoint_file_for("/l", "m-5.safetensors"), "/l/m-5.safetensors");
  EXPECT_EQ(checkpoint_prefix_for("/l/model.ckpt-1234.safetensors"), "model.ckpt-1234");
  EXPECT_EQ(checkpoint_step("model.ckpt-1234"), 1234);
  EXPECT_EQ(checkpoint_step("/l/model.ckpt-7.safetensors"), 7);
  EXPECT_EQ(checkpoint_step("model.ckpt-x"), std::nullopt);
  EXPECT_EQ(checkpoint_step("other-5"), std::nullopt);
}

TEST(CheckpointManager, SaveCommitsTheFileThenTheStateFile) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  auto file = m.save(snapshot_at(1234));
  EXPECT_EQ(file, dir / "model.ckpt-1234.safetensors");
  EXPECT_EQ(list_dir(dir.path()),
            (std::vector<std::string>{"checkpoint", "model.ckpt-1234.safetensors"}))
      << "no temp files may remain";
  auto st = read_checkpoint_state(dir.path());
  ASSERT_TRUE(st);
  EXPECT_EQ(st->model_checkpoint_path, "model.ckpt-1234");
  EXPECT_EQ(st->all_model_checkpoint_paths, std::vector<std::string>{"model.ckpt-1234"});
  EXPECT_EQ(m.latest(), file);
  SafetensorsReader r(file, {.require_checksums = true});
  EXPECT_EQ(r.global_step(), 1234);
  EXPECT_NO_THROW(r.verify_all());
}

// A state writer that, once armed, stops inside the write (where the fsyncs are) until released.
class HeldStateWriter {
 public:
  void operator()(const std::filesystem::path& logdir, const CheckpointState& state) {
    std::unique_lock lock(mu_);
    if (armed_) {
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    lock.unlock();
    write_checkpoint_state(logdir, state);
  }
  void arm() {
    std::lock_guard lock(mu_);
    armed_ = true;
  }
  bool wait_entered() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return entered_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool entered_ = false;
  bool released_ = false;
};

// Regression: the manager's lock was held across the state file's write and fsync, so latest()
// (asked by the training thread and by `inspect`) waited on a disk sync.
TEST(CheckpointManager, LatestAnswersWhileAStateFileWriteIsInItsSync) {
  TempDir dir;
  HeldStateWriter writer;
  CheckpointManagerOptions options{dir.path()};
  options.state_writer = [&](const std::filesystem::path& logdir, const CheckpointState& state) {
    writer(logdir, state);
  };
  CheckpointManager m(options);
  const auto first = m.save(snapshot_at(10));
  writer.arm();
  std::future<std::filesystem::path> save =
      std::async(std::launch::async, [&] { return m.save(snapshot_at(20)); });
  ASSERT_TRUE(writer.wait_entered()) << "the save never reached its state file write";
  std::future<std::optional<std::filesystem::path>> latest =
      std::async(std::launch::async, [&] { return m.latest(); });
  const bool answered = latest.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  writer.release();  // whatever happened, let the save finish so that the futures join
  ASSERT_TRUE(answered) << "latest() waited for the state file's sync";
  // Until the state file naming the new checkpoint is committed, the latest is the one the file
  // still names.
  EXPECT_EQ(latest.get(), first);
  const auto second = save.get();
  EXPECT_EQ(m.latest(), second);
  EXPECT_EQ(read_checkpoint_state(dir.path())->model_checkpoint_path, "model.ckpt-20");
  EXPECT_EQ(m.state(), *read_checkpoint_state(dir.path()));
}

// A failed state file write leaves the manager naming what the state file still names.
TEST(CheckpointManager, AFailedStateWriteKeepsThePreviousLatest) {
  TempDir dir;
  bool fail = false;
  CheckpointManagerOptions options{dir.path()};
  options.state_writer = [&](const std::filesystem::path& logdir, const CheckpointState& state) {
    if (fail) throw Unavailable("disk full (test)");
    write_checkpoint_state(logdir, state);
  };
  CheckpointManager m(options);
  const auto first = m.save(snapshot_at(1));
  fail = true;
  EXPECT_THROW(m.save(snapshot_at(2)), Unavailable);
  EXPECT_EQ(m.latest(), first);
  EXPECT_EQ(read_checkpoint_state(dir.path())->model_checkpoint_path, "model.ckpt-1");
  EXPECT_EQ(m.state(), *read_checkpoint_state(dir.path()));
}

TEST(CheckpointManager, KeepsOnlyMaxToKeepNewest) {
  TempDir dir;
  CheckpointManager m({dir.path(), "model.ckpt", 2, 0});
  for (int step = 1; step <= 5; ++step) m.save(snapshot_at(step));
  EXPECT_EQ(steps_on_disk(dir.path()), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(read_checkpoint_state(dir.path())->all_model_checkpoint_paths,
            (std::vector<std::string>{"model.ckpt-4", "model.ckpt-5"}));
}

// Regression: a state file naming absolute paths (as TensorFlow tools write) or `../` paths made
// max_to_keep unlink those files, outside the logdir.
TEST(CheckpointManager, RetentionNeverDeletesFilesOutsideTheLogdirOrNotNamedLikeOurs) {
  TempDir dir;
  const auto logdir = dir.path() / "run";
  const auto elsewhere = dir.path() / "elsewhere";
  std::filesystem::create_directories(logdir);
  std::filesystem::create_directories(elsewhere);
  write_bytes(elsewhere / "model.ckpt-1.safetensors", "precious 1");
  write_bytes(elsewhere / "model.ckpt-2.safetensors", "precious 2");
  write_bytes(logdir / "notes-3.safetensors", "precious 3");
  CheckpointState st;
  st.all_model_checkpoint_paths = {(elsewhere / "model.ckpt-1").string(),
                                   "../elsewhere/model.ckpt-2", "notes-3"};
  st.all_model_checkpoint_timestamps = {1, 2, 3};
  st.model_checkpoint_path = "notes-3";
  write_checkpoint_state(logdir, st);
  CheckpointManager m({logdir, "model.ckpt", 1, 0});
  for (int step = 10; step <= 13; ++step) m.save(snapshot_at(step));
  EXPECT_EQ(read_bytes(elsewhere / "model.ckpt-1.safetensors"), "precious 1");
  EXPECT_EQ(read_bytes(elsewhere / "model.ckpt-2.safetensors"), "precious 2");
  EXPECT_EQ(read_bytes(logdir / "notes-3.safetensors"), "precious 3");
  EXPECT_EQ(steps_on_disk(logdir), (std::vector<int64_t>{13}));
  EXPECT_EQ(read_checkpoint_state(logdir)->all_model_checkpoint_paths,
            (std::vector<std::string>{"model.ckpt-13"}));
}

TEST(CheckpointManager, MaxToKeepZeroKeepsEverything) {
  TempDir dir;
  CheckpointManager m({dir.path(), "model.ckpt", 0, 0});
  for (int step = 1; step <= 4; ++step) m.save(snapshot_at(step));
  EXPECT_EQ(steps_on_disk(dir.path()), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(CheckpointManager, KeepEveryNHoursIsCarriedAcrossARestart) {
  TempDir dir;
  const double t = now_seconds();
  {
    CheckpointManager m({dir.path(), "model.ckpt", 2, 1.0});
    m.save(snapshot_at(1), t + 100);
    m.save(snapshot_at(2), t + 3800);
    m.save(snapshot_at(3), t + 3900);  // 1 leaves: less than an hour after creation: deleted
    m.save(snapshot_at(4), t + 4000);  // 2 leaves: an hour after creation: preserved
    EXPECT_EQ(steps_on_disk(dir.path()), (std::vector<int64_t>{2, 3, 4}));
    EXPECT_DOUBLE_EQ(read_checkpoint_state(dir.path())->last_preserved_timestamp, t + 3800);
  }
  // A restarted process must anchor on the preserved checkpoint (t+3800), not on its own start
  // time: otherwise step 3 (t+3900) would be preserved as well.
  CheckpointManager m({dir.path(), "model.ckpt", 2, 1.0});
  m.save(snapshot_at(5), t + 8000);  // 3 leaves: 100 s after the last preserved: deleted
  m.save(snapshot_at(6), t + 8100);  // 4 leaves: deleted
  m.save(snapshot_at(7), t + 8200);  // 5 leaves: 4200 s after the last preserved: preserved
  EXPECT_EQ(steps_on_disk(dir.path()), (std::vector<int64_t>{2, 5, 6, 7}));
  EXPECT_EQ(read_checkpoint_state(dir.path())->all_model_checkpoint_paths,
            (std::vector<std::string>{"model.ckpt-6", "model.ckpt-7"}));
}

TEST(CheckpointManager, RemovesTempFilesLeftByACrash) {
  TempDir dir;
  write_bytes(dir / "model.ckpt-5.safetensors.tmp.123.0", "partial");
  write_bytes(dir / "checkpoint.tmp.123.1", "partial");
  write_bytes(dir / "notes.txt.tmp.1.1", "not ours");
  CheckpointManager m({dir.path()});
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"notes.txt.tmp.1.1"});
}

TEST(CheckpointManager, LatestValidSkipsACorruptLatestWithAWarning) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  for (int step = 1; step <= 3; ++step) m.save(snapshot_at(step));
  auto latest = dir / "model.ckpt-3.safetensors";
  std::string bytes = read_bytes(latest);
  bytes[bytes.size() - 10] ^= 0x40;  // a flipped bit in the data: only the CRC sees it
  write_bytes(latest, bytes);
  ::testing::internal::CaptureStderr();
  std::vector<std::filesystem::path> skipped;
  auto r = m.latest_valid(&skipped);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->global_step(), 2);
  EXPECT_EQ(skipped, std::vector<std::filesystem::path>{latest});
  EXPECT_THAT(log, HasSubstr("WARN"));
  EXPECT_THAT(log, HasSubstr(latest.string()));
  EXPECT_THAT(log, HasSubstr("CRC-32C"));
}

TEST(CheckpointManager, LatestValidSkipsATruncatedLatest) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  m.save(snapshot_at(1));
  m.save(snapshot_at(2));
  auto latest = dir / "model.ckpt-2.safetensors";
  std::filesystem::resize_file(latest, std::filesystem::file_size(latest) / 2);
  auto r = m.latest_valid();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->global_step(), 1);
}

TEST(CheckpointManager, FallsBackToADirectoryScanWhenTheStateFileIsMissingOrGarbled) {
  TempDir dir;
  {
    CheckpointManager m({dir.path()});
    m.save(snapshot_at(10));
    m.save(snapshot_at(20));
  }
  std::filesystem::remove(dir / "checkpoint");
  {
    CheckpointManager m({dir.path()});
    EXPECT_EQ(m.latest(), dir / "model.ckpt-20.safetensors");
    auto r = m.latest_valid();
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->global_step(), 20);
  }
  write_bytes(dir / "checkpoint", "\x01garbage without fields\n");
  ::testing::internal::CaptureStderr();
  CheckpointManager m({dir.path()});
  auto r = m.latest_valid();
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->global_step(), 20);
  EXPECT_THAT(log, HasSubstr("garbled"));
  m.save(snapshot_at(30));  // the state file is rebuilt
  EXPECT_EQ(read_checkpoint_state(dir.path())->model_checkpoint_path, "model.ckpt-30");
}

TEST(CheckpointManager, LatestValidIsNullWhenEverythingIsCorrupt) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  EXPECT_EQ(m.latest_valid(), nullptr);
  m.save(snapshot_at(1));
  write_bytes(dir / "model.ckpt-1.safetensors", "junk");
  std::vector<std::filesystem::path> skipped;
  EXPECT_EQ(m.latest_valid(&skipped), nullptr);
  EXPECT_EQ(skipped.size(), 1u);
}

TEST(CheckpointManager, RestoringAnotherShapeNamesTheFirstMismatchedTensor) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  m.save(snapshot_at(1));
  testing::ToyState wider(5);
  auto r = m.latest_valid();
  ASSERT_NE(r, nullptr);
  try {
    wider.restore(*r);
    FAIL();
  } catch (const FailedPrecondition& e) {
    EXPECT_THAT(e.what(), HasSubstr("transformer.wte.weight"));
  }
}

// Blocks the writer thread inside on_saved until released, and counts overlapping writes.
class BlockingListener : public CheckpointListener {
 public:
  void on_saved(const CheckpointStats& stats) override {
    int now = ++in_flight;
    max_in_flight = std::max(max_in_flight.load(), now);
    {
      std::unique_lock lock(mu);
      saved.push_back(stats);
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
    }
    --in_flight;
  }
  void on_restored(const RestoredCheckpoint&) override {}
  void release() {
    std::lock_guard lock(mu);
    released = true;
    cv.notify_all();
  }
  size_t wait_saved(size_t n) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return saved.size() >= n; });
    return saved.size();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::vector<CheckpointStats> saved;
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};
};

TEST(AsyncCheckpointer, NeverWritesTwoCheckpointsAtOnce) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  Coordinator coord;
  BlockingListener listener;
  AsyncCheckpointer ckpt(m, &coord, {&listener});
  auto fill = [](int64_t step) { return [step](Snapshot& s) { s = snapshot_at(step); }; };
  ASSERT_TRUE(ckpt.request(fill(1), AsyncCheckpointer::Mode::kQueue));
  ASSERT_EQ(listener.wait_saved(1), 1u);  // write 1 is now held inside the writer thread
  EXPECT_FALSE(ckpt.idle());
  EXPECT_FALSE(ckpt.request(fill(2), AsyncCheckpointer::Mode::kSkipIfBusy))
      << "a periodic save must be skipped while a write is in flight";
  EXPECT_TRUE(ckpt.request(fill(3), AsyncCheckpointer::Mode::kQueue))
      << "a requested save is snapshotted into the second slot and queued";
  {
    std::lock_guard lock(listener.mu);
    EXPECT_EQ(listener.saved.size(), 1u) << "the queued write must wait for the first";
  }
  listener.release();
  ckpt.wait_idle();
  EXPECT_EQ(ckpt.saves(), 2);
  EXPECT_EQ(listener.max_in_flight.load(), 1);
  EXPECT_EQ(steps_on_disk(dir.path()), (std::vector<int64_t>{1, 3}));
  auto stats = ckpt.last_stats();
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->step, 3);
  EXPECT_EQ(stats->bytes, std::filesystem::file_size(dir / "model.ckpt-3.safetensors"));
  EXPECT_GT(stats->write_seconds, 0);
  EXPECT_GE(stats->stall_seconds, 0);
  EXPECT_GT(stats->wall_time, 1.6e9);
  ckpt.stop();
  EXPECT_FALSE(coord.should_stop());
}

TEST(AsyncCheckpointer, PreallocatedSlotIsFilledWithoutReallocation) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  AsyncCheckpointer ckpt(m, nullptr);
  ckpt.preallocate(testing::toy_specs(3));
  const std::byte* seen = nullptr;
  size_t seen_size = 0;
  ASSERT_TRUE(ckpt.request(
      [&](Snapshot& s) {
        ASSERT_EQ(s.buffers.size(), 3u) << "the slot was not preallocated";
        seen = s.buffers[0].data();
        seen_size = s.buffers[0].size();
        s.reshape(testing::toy_specs(3));
        EXPECT_EQ(s.buffers[0].data(), seen);
        Snapshot filled = snapshot_at(1);
        for (size_t i = 0; i < 3; ++i) {
          std::memcpy(s.buffers[i].data(), filled.buffers[i].data(), s.buffers[i].size());
        }
        s.step = 1;
      },
      AsyncCheckpointer::Mode::kQueue));
  ckpt.stop();
  EXPECT_EQ(seen_size, 4u * 3 * 4);
  EXPECT_EQ(steps_on_disk(dir.path()), std::vector<int64_t>{1});
}

TEST(AsyncCheckpointer, StopFinishesTheQueuedWrites) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  AsyncCheckpointer ckpt(m, nullptr);
  ASSERT_TRUE(
      ckpt.request([](Snapshot& s) { s = snapshot_at(1); }, AsyncCheckpointer::Mode::kQueue));
  ASSERT_TRUE(
      ckpt.request([](Snapshot& s) { s = snapshot_at(2); }, AsyncCheckpointer::Mode::kQueue));
  ckpt.stop();
  EXPECT_EQ(steps_on_disk(dir.path()), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(m.latest(), dir / "model.ckpt-2.safetensors");
  EXPECT_FALSE(
      ckpt.request([](Snapshot& s) { s = snapshot_at(3); }, AsyncCheckpointer::Mode::kQueue));
}

TEST(AsyncCheckpointer, AWriteErrorStopsTheCoordinatorWithThatError) {
  TempDir dir;
  CheckpointManager m({dir.path()});
  Coordinator coord;
  AsyncCheckpointer ckpt(m, &coord);
  ckpt.request(
      [](Snapshot& s) {
        s = snapshot_at(9);
        s.buffers[0].resize(1);  // inconsistent with its spec: the writer refuses it
      },
      AsyncCheckpointer::Mode::kQueue);
  EXPECT_TRUE(coord.wait_for_stop(std::chrono::seconds(10)));
  EXPECT_THROW(coord.raise_requested_exception(), InvalidArgument);
  ckpt.stop();
  EXPECT_EQ(ckpt.failures(), 1);
  EXPECT_FALSE(std::filesystem::exists(dir / "checkpoint")) << "a failed save is never listed";
}

}  // namespace
}  // namespace longhaul::supervisor
