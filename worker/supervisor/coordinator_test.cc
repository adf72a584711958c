// Coordinator and Looper semantics (TF's tf.train.Coordinator / LooperThread, with longhaul's
// changes: first Looper run one interval after start; errors after a clean stop are kept).
#include "longhaul/supervisor/coordinator.h"

#include <atomic>
#include <future>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "test_util.h"

namespace longhaul::supervisor {
namespace {

using namespace std::chrono_literals;
using testing::eventually;

TEST(Coordinator, RequestStopWakesWaitersAndShouldStop) {
  Coordinator coord;
  EXPECT_FALSE(coord.should_stop());
  auto waiter = std::async(std::launch::async, [&] { return coord.wait_for_stop(60s); });
  coord.request_stop();
  EXPECT_TRUE(waiter.get());
  EXPECT_TRUE(coord.should_stop());
  EXPECT_EQ(coord.error(), nullptr);
}

TEST(Coordinator, WaitForStopTimesOutWithFalse) {
  Coordinator coord;
  EXPECT_FALSE(coord.wait_for_stop(10ms));
}

TEST(Coordinator, JoinReraisesTheFirstErrorAfterAllThreadsStop) {
  Coordinator coord;
  std::atomic<int> stopped{0};
  for (int i = 0; i < 3; ++i) {
    coord.start_thread("worker" + std::to_string(i), [&] {
      coord.wait_for_stop();
      ++stopped;
    });
  }
  coord.start_thread("failing", [] { throw Internal("boom in failing thread"); });
  try {
    coord.join(10s);
    FAIL() << "join did not re-raise";
  } catch (const Internal& e) {
    EXPECT_STREQ(e.what(), "boom in failing thread");
  }
  EXPECT_EQ(stopped.load(), 3);
  EXPECT_TRUE(coord.running_threads().empty());
}

TEST(Coordinator, FirstErrorWins) {
  Coordinator coord;
  coord.request_stop(std::make_exception_ptr(DataLoss("first")));
  coord.request_stop(std::make_exception_ptr(Internal("second")));
  EXPECT_THROW(coord.join(1s), DataLoss);
}

TEST(Coordinator, OutOfRangeIsACleanStop) {
  Coordinator coord;
  coord.start_thread("input", [] { throw OutOfRange("input exhausted"); });
  EXPECT_NO_THROW(coord.join(10s));
  EXPECT_TRUE(coord.should_stop());
  EXPECT_EQ(coord.error(), nullptr);
}

TEST(Coordinator, ErrorAfterACleanStopIsStillReported) {
  Coordinator coord;
  coord.request_stop();
  coord.request_stop(std::make_exception_ptr(Unavailable("final checkpoint failed")));
  EXPECT_THROW(coord.join(1s), Unavailable);
}

TEST(Coordinator, JoinRaisesDeadlineExceededNamingThreadsThatIgnoreTheStop) {
  Coordinator coord;
  std::promise<void> release;
  auto released = release.get_future().share();
  coord.start_thread("stubborn", [released] { released.wait(); });
  coord.start_thread("polite", [&] { coord.wait_for_stop(); });
  coord.request_stop();
  try {
    coord.join(20ms);
    FAIL() << "join returned with a thread still running";
  } catch (const DeadlineExceeded& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("threads still running"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stubborn"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("polite"), std::string::npos) << msg;
  }
  EXPECT_EQ(coord.running_threads(), std::vector<std::string>{"stubborn"});
  release.set_value();
  EXPECT_NO_THROW(coord.join(10s));
  EXPECT_TRUE(coord.running_threads().empty());
}

TEST(Coordinator, JoinWaitsForThreadsThatEndOnTheirOwn) {
  Coordinator coord;
  std::atomic<bool> ran{false};
  coord.start_thread("short", [&] { ran = true; });
  coord.join(10s);
  EXPECT_TRUE(ran.load());
  EXPECT_FALSE(coord.should_stop());
}

TEST(Coordinator, ClearStopAllowsReuse) {
  Coordinator coord;
  coord.request_stop(std::make_exception_ptr(Internal("x")));
  EXPECT_THROW(coord.join(1s), Internal);
  coord.clear_stop();
  EXPECT_FALSE(coord.should_stop());
  EXPECT_EQ(coord.error(), nullptr);
  EXPECT_NO_THROW(coord.join(1s));
}

TEST(Coordinator, ClearStopRefusesWhileThreadsRun) {
  Coordinator coord;
  coord.start_thread("t", [&] { coord.wait_for_stop(); });
  EXPECT_THROW(coord.clear_stop(), FailedPrecondition);
  coord.request_stop();
  coord.join(10s);
}

TEST(Coordinator, StopOnExceptionRecordsTheError) {
  Coordinator coord;
  EXPECT_TRUE(stop_on_exception(coord, [] {}));
  EXPECT_FALSE(coord.should_stop());
  EXPECT_FALSE(stop_on_exception(coord, [] { throw Aborted("peer lost"); }));
  EXPECT_TRUE(coord.should_stop());
  EXPECT_THROW(coord.raise_requested_exception(), Aborted);
}

TEST(Looper, FirstRunIsOneIntervalAfterStart) {
  Coordinator coord;
  const auto interval = 100ms;
  std::atomic<int> runs{0};
  std::promise<Coordinator::Clock::time_point> first;
  auto start = Coordinator::Clock::now();
  Looper::start(coord, "timer", interval, [&] {
    if (runs++ == 0) first.set_value(Coordinator::Clock::now());
  });
  auto first_run = first.get_future().get();
  EXPECT_GE(first_run - start, interval);
  coord.request_stop();
  coord.join(10s);
}

TEST(Looper, RunsAtAFixedRateUntilStopped) {
  Coordinator coord;
  std::atomic<int> runs{0};
  Looper::start(coord, "timer", 5ms, [&] { ++runs; });
  EXPECT_TRUE(eventually([&] { return runs.load() >= 5; }, std::chrono::seconds(10)));
  coord.request_stop();
  EXPECT_NO_THROW(coord.join(10s));
  EXPECT_TRUE(coord.running_threads().empty());
}

TEST(Looper, StopsPromptlyWhileWaitingForALongInterval) {
  Coordinator coord;
  std::atomic<int> runs{0};
  Looper::start(coord, "hourly", std::chrono::hours(1), [&] { ++runs; });
  coord.request_stop();
  // A Looper that slept instead of waiting on the stop condition would miss this grace.
  EXPECT_NO_THROW(coord.join(5s));
  EXPECT_EQ(runs.load(), 0);
}

TEST(Looper, AnErrorInOneLooperStopsAllAndJoinReraisesIt) {
  Coordinator coord;
  std::atomic<int> runs_a{0}, runs_b{0};
  Looper::start(coord, "a", 2ms, [&] {
    if (++runs_a == 3) throw Internal("service a failed");
  });
  Looper::start(coord, "b", 2ms, [&] { ++runs_b; });
  EXPECT_TRUE(coord.wait_for_stop(10s));
  EXPECT_THROW(coord.join(10s), Internal);
  EXPECT_EQ(runs_a.load(), 3);
  EXPECT_TRUE(coord.running_threads().empty());
}

TEST(Looper, RejectsANonPositiveInterval) {
  Coordinator coord;
  EXPECT_THROW(Looper::start(coord, "x", 0ms, [] {}), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::supervisor
