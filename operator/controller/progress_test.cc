// Training progress: parsing the chief's metrics, finding its endpoint, the rate limit on
// status.progress with a fake clock, the tracker's reads off the reconcile path, and the HTTP
// read against real loopback servers (answering, failing, silent, closed).
#include "longhaul/controller/progress.h"

#include <atomic>
#include <future>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/http_server.h"

namespace longhaul::controller {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

// What longhaul-worker's /metrics says (abridged, the real families and labels).
constexpr const char* kWorkerExposition =
    R"(# HELP longhaul_train_global_step Optimizer steps taken so far.
# TYPE longhaul_train_global_step gauge
longhaul_train_global_step{rank="0"} 1200
# HELP longhaul_train_max_steps The step at which training ends (training.max_steps).
# TYPE longhaul_train_max_steps gauge
longhaul_train_max_steps{rank="0"} 5000
# TYPE longhaul_train_steps_total counter
longhaul_train_steps_total{rank="0"} 300
# TYPE longhaul_checkpoint_last_step gauge
longhaul_checkpoint_last_step{rank="0"} 1000
# TYPE longhaul_checkpoint_last_timestamp_seconds gauge
longhaul_checkpoint_last_timestamp_seconds{rank="0"} 1763730000
longhaul_worker_build_info{rank="0",version="0.1.0",backend="cpu",attention="",matmul_epilogues="",self_check=""} 1
)";

struct ParseCase {
  std::string name;
  std::string text;
  std::optional<ProgressSample> want;
};
void PrintTo(const ParseCase& c, std::ostream* os) { *os << c.name; }

class ParseTest : public ::testing::TestWithParam<ParseCase> {};

TEST_P(ParseTest, ReadsTheChiefsProgress) {
  const ParseCase& c = GetParam();
  EXPECT_EQ(parse_progress_metrics(c.text), c.want);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseTest,
    ::testing::Values(ParseCase{"WorkerExposition", kWorkerExposition,
                                ProgressSample{1200, 5000, 1000, 1763730000}},
                      ParseCase{"ChiefRoleGauge",
                                "longhaul_train_global_step{rank=\"2\"} 7\n"
                                "longhaul_worker_is_chief{rank=\"2\"} 0\n",
                                ProgressSample{7, 0, 0, 0, 0}},
                      ParseCase{"BeforeTheFirstCheckpoint",
                                "longhaul_train_global_step{rank=\"0\"} 7\n"
                                "longhaul_train_max_steps{rank=\"0\"} 160\n"
                                "longhaul_checkpoint_last_step{rank=\"0\"} 0\n"
                                "longhaul_checkpoint_last_timestamp_seconds{rank=\"0\"} 0\n",
                                ProgressSample{7, 160, 0, 0}},
                      ParseCase{"AnOlderWorkerWithoutMaxSteps", "longhaul_train_global_step 42\n",
                                ProgressSample{42, 0, 0, 0}},
                      ParseCase{"NotALonghaulWorker",
                                "# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3\n",
                                std::nullopt},
                      ParseCase{"Empty", "", std::nullopt},
                      ParseCase{"NaNAndNegativeAreAbsent",
                                "longhaul_train_global_step 3\nlonghaul_train_max_steps NaN\n"
                                "longhaul_checkpoint_last_step -1\n"
                                "longhaul_checkpoint_last_timestamp_seconds 1763730000\n",
                                ProgressSample{3, 0, 0, 1763730000}},
                      ParseCase{"AStepThatIsNotANumberIsNoProgress",
                                "longhaul_train_global_step +Inf\n", std::nullopt}));

json chief_pod(const std::string& phase, const std::string& ip, const json& ports,
               const std::string& name = "j-chief-0") {
  json pod = {{"metadata", {{"name", name}}}};
  pod["spec"]["containers"] =
      json::array({json{{"name", "sidecar"}}, json{{"name", "trainer"}, {"ports", ports}}});
  pod["status"] = {{"phase", phase}, {"podIP", ip}};
  return pod;
}

TEST(MetricsEndpointTest, IsTheRunningChiefsPortNamedMetrics) {
  const json ports = {{{"name", "http"}, {"containerPort", 80}},
                      {{"name", "metrics"}, {"containerPort", 9400}}};
  EXPECT_EQ(metrics_endpoint(chief_pod("Running", "10.1.2.3", ports)),
            (MetricsEndpoint{"10.1.2.3", 9400, "j-chief-0"}));
  EXPECT_EQ(metrics_endpoint(chief_pod("Running", "fd00::5", ports, "j-worker-3")),
            (MetricsEndpoint{"fd00::5", 9400, "j-worker-3"}));
  EXPECT_EQ(metrics_endpoint(chief_pod("Pending", "10.1.2.3", ports)), std::nullopt);
  EXPECT_EQ(metrics_endpoint(chief_pod("Running", "", ports)), std::nullopt);
  EXPECT_EQ(metrics_endpoint(
                chief_pod("Running", "10.1.2.3", {{{"name", "http"}, {"containerPort", 9400}}})),
            std::nullopt);
  EXPECT_EQ(metrics_endpoint(chief_pod("Running", "10.1.2.3",
                                       {{{"name", "metrics"}, {"containerPort", "9400"}}})),
            std::nullopt);
  EXPECT_EQ(metrics_endpoint(json::object()), std::nullopt);
}

// ---- the rate limit, on a fake clock

api::Time at(const char* rfc3339) { return api::parse_time(rfc3339); }
int64_t unix_of(const char* rfc3339) {
  return std::chrono::duration_cast<std::chrono::seconds>(at(rfc3339).time_since_epoch()).count();
}

TEST(ApplyProgressTest, WritesTheSampleOnceWithTheStepColumnAndCheckpointTime) {
  api::TrainingJobStatus st;
  const api::Time now = at("2026-11-21T13:00:00Z");
  EXPECT_EQ(apply_progress(st, {1200, 5000, 1000, 1763730000}, 30s, now), std::nullopt);
  ASSERT_TRUE(st.progress);
  EXPECT_EQ(st.progress->steps, "1200/5000");
  EXPECT_EQ(st.progress->step, 1200);
  EXPECT_EQ(st.progress->max_steps, 5000);
  EXPECT_EQ(st.progress->last_checkpoint_step, 1000);
  EXPECT_EQ(st.progress->last_checkpoint_time, "2025-11-21T13:00:00Z");
  EXPECT_EQ(st.progress->observed_time, "2026-11-21T13:00:00Z");
  // The status round-trips through JSON unchanged (the reconciler compares JSON to skip writes).
  EXPECT_EQ(api::parse_status(api::to_json(st)), st);
  EXPECT_EQ(api::to_json(st)["progress"],
            json::parse(R"({"step": 1200, "maxSteps": 5000, "steps": "1200/5000",
                            "lastCheckpointStep": 1000,
                            "lastCheckpointTime": "2025-11-21T13:00:00Z",
                            "observedTime": "2026-11-21T13:00:00Z"})"));

  // No max steps, no checkpoint: only the step; the JSON says nothing about the rest.
  api::TrainingJobStatus bare;
  apply_progress(bare, {7, 0, 0, 0}, 30s, now);
  EXPECT_EQ(bare.progress->steps, "7");
  EXPECT_EQ(api::to_json(bare)["progress"],
            json::parse(R"({"step": 7, "steps": "7", "observedTime": "2026-11-21T13:00:00Z"})"));
  EXPECT_EQ(api::parse_status(api::to_json(bare)), bare);

  // The pod that answered is recorded (status.progress.pod) and round-trips.
  api::TrainingJobStatus from;
  apply_progress(from, {7, 0, 0, 0, 1, "j-worker-0"}, 30s, now);
  EXPECT_EQ(api::to_json(from)["progress"]["pod"], "j-worker-0");
  EXPECT_EQ(api::parse_status(api::to_json(from)), from);
}

TEST(ApplyProgressTest, UnchangedValuesChangeNothingEvenAfterTheInterval) {
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  apply_progress(st, {10, 100, 0, 0}, 30s, now);
  const api::TrainingJobStatus written = st;
  for (int i = 0; i < 100; ++i) {
    now += 7s;
    EXPECT_EQ(apply_progress(st, {10, 100, 0, 0}, 30s, now), std::nullopt);
  }
  EXPECT_EQ(st, written) << "observedTime must not move while the values stay the same";
}

TEST(ApplyProgressTest, AChangeWaitsOutTheIntervalAndSaysHowLong) {
  api::TrainingJobStatus st;
  const api::Time t0 = at("2026-11-21T13:00:00Z");
  apply_progress(st, {10, 100, 0, 0}, 30s, t0);
  const api::TrainingJobStatus first = st;
  // 10 s later the step moved: held back for 30 s + 1 s (second precision) from t0.
  EXPECT_EQ(apply_progress(st, {20, 100, 0, 0}, 30s, t0 + 10s), std::chrono::milliseconds(21000));
  EXPECT_EQ(st, first);
  EXPECT_EQ(apply_progress(st, {30, 100, 0, 0}, 30s, t0 + 30s), std::chrono::milliseconds(1000));
  EXPECT_EQ(st, first);
  EXPECT_EQ(apply_progress(st, {30, 100, 0, 0}, 30s, t0 + 31s), std::nullopt);
  EXPECT_EQ(st.progress->step, 30);
  EXPECT_EQ(st.progress->observed_time, "2026-11-21T13:00:31Z");
}

TEST(ApplyProgressTest, AtMostOneChangePerIntervalOverTenMinutesOfSteadyTraining) {
  // Every 250 ms of fake time a step finishes and the status is offered the new sample; count
  // how often status.progress actually changes (= progress writes) and how far apart they are.
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00.000Z");
  std::vector<api::Time> changes;
  std::string last_observed;
  for (int64_t step = 1; step <= 4 * 600; ++step) {
    now += 250ms;
    apply_progress(st, {step, 5000, 0, 0}, 30s, now);
    if (st.progress->observed_time != last_observed) {
      changes.push_back(now);
      last_observed = st.progress->observed_time;
    }
  }
  ASSERT_GE(changes.size(), 2u);
  EXPECT_LE(changes.size(), 600u / 30u);
  EXPECT_GE(changes.size(), 600u / 32u) << "the progress must keep moving, not only once";
  for (size_t i = 1; i < changes.size(); ++i) {
    EXPECT_GE(changes[i] - changes[i - 1], 30s) << "changes " << i - 1 << " and " << i;
  }
}

TEST(ApplyProgressTest, AnObservedTimeFromAClockFarAheadDoesNotFreezeTheProgress) {
  api::TrainingJobStatus st;
  const api::Time now = at("2026-11-21T13:00:00Z");
  apply_progress(st, {10, 100, 0, 0}, 30s, now + std::chrono::hours(5));  // a skewed replica
  EXPECT_EQ(apply_progress(st, {20, 100, 0, 0}, 30s, now), std::nullopt);
  EXPECT_EQ(st.progress->step, 20);
  EXPECT_EQ(st.progress->observed_time, "2026-11-21T13:00:00Z");
  // A little ahead (within one interval) still counts, as any recent write does.
  EXPECT_EQ(apply_progress(st, {30, 100, 0, 0}, 30s, now - 20s), std::chrono::milliseconds(51000));
}

// Found by the end-to-end flagship: a restarted chief serves step 0 until it has restored, and
// a job that finished soon after showed STEP 0/160 and no LAST-CKPT.
TEST(ApplyProgressTest, ARestartedChiefThatHasNotRestoredYetIsNoStepBack) {
  api::TrainingJobStatus st;
  const api::Time t0 = at("2026-11-21T13:00:00Z");
  apply_progress(st, {0, 160, 0, 0}, 5s, t0);
  EXPECT_EQ(st.progress->steps, "0/160") << "a new job's chief is up at step 0";
  apply_progress(st, {150, 160, 140, 1763730000}, 5s, t0 + 10s);
  const api::TrainingJobStatus before_restart = st;
  EXPECT_EQ(apply_progress(st, {0, 160, 0, 0}, 5s, t0 + 20s), std::nullopt);
  EXPECT_EQ(st, before_restart);
  // Once restored (from the checkpoint at 140), the step may go back: that is the truth.
  apply_progress(st, {141, 160, 140, 1763730000}, 5s, t0 + 30s);
  EXPECT_EQ(st.progress->steps, "141/160");
}

// ---- the tracker: reads off the caller's thread

struct FakeChief {
  std::mutex mu;
  std::condition_variable cv;
  std::string exposition = kWorkerExposition;
  bool reachable = true;
  bool hold = false;  // blocks reads until released
  int reads = 0;
  std::string fetch(const MetricsEndpoint&) {
    std::unique_lock lock(mu);
    ++reads;
    cv.wait(lock, [&] { return !hold; });
    if (!reachable) throw Unavailable("connection refused");
    return exposition;
  }
  void release() {
    {
      std::lock_guard lock(mu);
      hold = false;
    }
    cv.notify_all();
  }
};

ProgressTrackerOptions options_for(FakeChief& chief, std::atomic<int>* updates = nullptr) {
  ProgressTrackerOptions o;
  o.fetch = [&chief](const MetricsEndpoint& e, std::chrono::milliseconds) {
    return chief.fetch(e);
  };
  o.on_update = [updates](const std::string&) {
    if (updates) ++*updates;
  };
  return o;
}

const json kRunningChief =
    chief_pod("Running", "10.0.0.7", {{{"name", "metrics"}, {"containerPort", 9400}}});

TEST(ProgressTrackerTest, TrackNeverWaitsForASlowChief) {
  FakeChief chief;
  chief.hold = true;
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  const api::Time now = at("2026-11-21T13:00:00Z");
  // The read hangs; track() returns at once with nothing to apply and a time to come back.
  const auto wait = tracker.track("ns/j", &kRunningChief, 30s, st, now);
  EXPECT_EQ(wait, std::chrono::milliseconds(30000));
  EXPECT_FALSE(st.progress);
  EXPECT_FALSE(tracker.wait_idle(50ms)) << "the read should still be in flight";
  // A second reconcile while the read hangs starts no second read.
  tracker.track("ns/j", &kRunningChief, 30s, st, now + 40s);
  chief.release();
  ASSERT_TRUE(tracker.wait_idle(10s));
  EXPECT_EQ(chief.reads, 1);
  tracker.track("ns/j", &kRunningChief, 30s, st, now + 41s);
  ASSERT_TRUE(st.progress);
  EXPECT_EQ(st.progress->steps, "1200/5000");
}

TEST(ProgressTrackerTest, ReadsOncePerIntervalAndReportsOnlyNewValues) {
  FakeChief chief;
  std::atomic<int> updates{0};
  ProgressTracker tracker(options_for(chief, &updates));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  // Ten minutes of reconciles every 2 s of fake time, the chief's values unchanged.
  for (int i = 0; i < 300; ++i) {
    tracker.track("ns/j", &kRunningChief, 30s, st, now);
    ASSERT_TRUE(tracker.wait_idle(10s));
    now += 2s;
  }
  EXPECT_EQ(chief.reads, 20) << "one read per 30 s in 600 s";
  EXPECT_EQ(updates.load(), 1) << "only the first read brought new values";
}

TEST(ProgressTrackerTest, AnUnreachableChiefKeepsTheLastProgressAndIsNoError) {
  FakeChief chief;
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  tracker.track("ns/j", &kRunningChief, 10s, st, now);
  ASSERT_TRUE(tracker.wait_idle(10s));
  tracker.track("ns/j", &kRunningChief, 10s, st, now);
  ASSERT_TRUE(st.progress);
  const api::TrainingJobStatus good = st;
  {
    std::lock_guard lock(chief.mu);
    chief.reachable = false;
  }
  for (int i = 0; i < 5; ++i) {
    now += 11s;
    EXPECT_NO_THROW(tracker.track("ns/j", &kRunningChief, 10s, st, now));
    ASSERT_TRUE(tracker.wait_idle(10s));
  }
  EXPECT_EQ(chief.reads, 6) << "an unreachable chief is still tried once per interval";
  EXPECT_EQ(st, good);
  // Garbage instead of metrics is no progress either.
  {
    std::lock_guard lock(chief.mu);
    chief.reachable = true;
    chief.exposition = "<html>not metrics</html>";
  }
  now += 11s;
  tracker.track("ns/j", &kRunningChief, 10s, st, now);
  ASSERT_TRUE(tracker.wait_idle(10s));
  tracker.track("ns/j", &kRunningChief, 10s, st, now);
  EXPECT_EQ(st, good);
}

TEST(ProgressTrackerTest, ANewChiefIncarnationIsReadAtOnceAndNoChiefStartsNoRead) {
  FakeChief chief;
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  const api::Time now = at("2026-11-21T13:00:00Z");
  EXPECT_EQ(tracker.track("ns/j", nullptr, 30s, st, now), std::nullopt);
  const json pending = chief_pod("Pending", "", {{{"name", "metrics"}, {"containerPort", 9400}}});
  EXPECT_EQ(tracker.track("ns/j", &pending, 30s, st, now), std::nullopt);
  ASSERT_TRUE(tracker.wait_idle(10s));
  EXPECT_EQ(chief.reads, 0);
  tracker.track("ns/j", &kRunningChief, 30s, st, now);
  ASSERT_TRUE(tracker.wait_idle(10s));
  const json restarted =
      chief_pod("Running", "10.0.0.99", {{{"name", "metrics"}, {"containerPort", 9400}}});
  tracker.track("ns/j", &restarted, 30s, st, now + 1s);
  ASSERT_TRUE(tracker.wait_idle(10s));
  EXPECT_EQ(chief.reads, 2);
}

// Chief promotion (worker/distributed/README.md): the chief replica was lost, the lowest
// surviving worker took over the chief's writes, and the re-created chief pod joined as a
// worker. The tracker finds the pod that says longhaul_worker_is_chief 1 and keeps reading it,
// one read per interval again once found.
TEST(ProgressTrackerTest, FollowsTheChiefRoleToAPromotedWorkerPod) {
  struct Pods {
    std::mutex mu;
    std::map<std::string, std::string> exposition;  // by pod IP; absent: unreachable
    std::map<std::string, int> reads;
  } pods;
  auto worker = [](int64_t step, int is_chief) {
    std::string text = "longhaul_train_global_step{rank=\"1\"} " + std::to_string(step) +
                       "\nlonghaul_train_max_steps{rank=\"1\"} 5000\n";
    if (is_chief >= 0) {
      text += "longhaul_worker_is_chief{rank=\"1\"} " + std::to_string(is_chief) + "\n";
    }
    return text;
  };
  ProgressTrackerOptions o;
  o.fetch = [&pods](const MetricsEndpoint& e, std::chrono::milliseconds) {
    std::lock_guard lock(pods.mu);
    ++pods.reads[e.host];
    auto it = pods.exposition.find(e.host);
    if (it == pods.exposition.end()) throw Unavailable("connection refused");
    return it->second;
  };
  ProgressTracker tracker(o);
  const json ports = {{{"name", "metrics"}, {"containerPort", 9400}}};
  const json chief = chief_pod("Running", "10.0.0.7", ports);
  const json worker0 = chief_pod("Running", "10.0.0.8", ports, "j-worker-0");
  const json worker1 = chief_pod("Running", "10.0.0.9", ports, "j-worker-1");
  {
    std::lock_guard lock(pods.mu);
    pods.exposition = {
        {"10.0.0.7", worker(100, 1)}, {"10.0.0.8", worker(100, 0)}, {"10.0.0.9", worker(100, 0)}};
  }
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  auto reconcile = [&](const json* chief_pod) {
    tracker.track("ns/j", chief_pod, 10s, st, now, {&worker0, &worker1});
    ASSERT_TRUE(tracker.wait_idle(10s));
    tracker.track("ns/j", chief_pod, 10s, st, now, {&worker0, &worker1});
  };
  reconcile(&chief);
  ASSERT_TRUE(st.progress);
  EXPECT_EQ(st.progress->step, 100);
  EXPECT_EQ(st.progress->pod, "j-chief-0");
  EXPECT_EQ(pods.reads["10.0.0.8"], 0) << "a steady chief costs one read";

  // The chief pod is gone (being re-created): the workers are asked; worker 0 holds the role.
  {
    std::lock_guard lock(pods.mu);
    pods.exposition.erase("10.0.0.7");
    pods.exposition["10.0.0.8"] = worker(150, 1);
    pods.exposition["10.0.0.9"] = worker(150, 0);
  }
  now += 11s;
  reconcile(nullptr);
  EXPECT_EQ(st.progress->step, 150);
  EXPECT_EQ(st.progress->pod, "j-worker-0") << "status names the pod that holds the role now";

  // The re-created chief pod runs as a worker (says 0, its step still 0): the tracker stays
  // with worker 0 and reads only it, once per interval.
  const json rejoined = chief_pod("Running", "10.0.0.17", ports);
  {
    std::lock_guard lock(pods.mu);
    pods.exposition["10.0.0.17"] = worker(0, 0);
    pods.exposition["10.0.0.8"] = worker(170, 1);
    pods.reads.clear();
  }
  for (int i = 0; i < 3; ++i) {
    now += 11s;
    reconcile(&rejoined);
  }
  EXPECT_EQ(st.progress->step, 170);
  EXPECT_EQ(st.progress->pod, "j-worker-0");
  EXPECT_EQ(pods.reads["10.0.0.8"], 3);
  EXPECT_EQ(pods.reads["10.0.0.17"], 0);
  EXPECT_EQ(pods.reads["10.0.0.9"], 0);

  // Worker 0 is lost too; nobody says 1 yet, and a pod without the gauge is the chief only when
  // it is the TF_CONFIG chief: the progress stays as it was.
  {
    std::lock_guard lock(pods.mu);
    pods.exposition.erase("10.0.0.8");
    pods.exposition["10.0.0.9"] = worker(180, -1);
  }
  now += 11s;
  reconcile(&rejoined);
  EXPECT_EQ(st.progress->step, 170);
  // Then the re-created chief pod, now the lowest survivor, takes the role.
  {
    std::lock_guard lock(pods.mu);
    pods.exposition["10.0.0.17"] = worker(190, 1);
  }
  now += 11s;
  reconcile(&rejoined);
  EXPECT_EQ(st.progress->step, 190);
  EXPECT_EQ(st.progress->pod, "j-chief-0");
}

// ---- rate and ETA

TEST(ProgressTrackerTest, RateAndEtaComeFromTwoReadsAndAStalledChiefCostsOneChange) {
  FakeChief chief;
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  auto read_at = [&](int64_t step) {
    {
      std::lock_guard lock(chief.mu);
      chief.exposition = "longhaul_train_global_step " + std::to_string(step) +
                         "\nlonghaul_train_max_steps 5000\n";
    }
    tracker.track("ns/j", &kRunningChief, 30s, st, now);
    EXPECT_TRUE(tracker.wait_idle(10s));
    tracker.track("ns/j", &kRunningChief, 30s, st, now);
  };
  read_at(1000);
  EXPECT_EQ(st.progress->steps_per_second, 0) << "one read is no rate";
  EXPECT_EQ(st.progress->eta, "");
  EXPECT_EQ(st.progress->last_step_time, "2026-11-21T13:00:00Z");
  now += 31s;
  read_at(1310);  // 10 steps/s: 3690 steps left take 369 s
  EXPECT_EQ(st.progress->steps_per_second, 10);
  EXPECT_EQ(st.progress->eta, "6m09s");
  EXPECT_EQ(st.progress->estimated_completion_time, "2026-11-21T13:06:40Z");
  EXPECT_EQ(st.progress->last_step_time, "2026-11-21T13:00:31Z");
  const json j = api::to_json(st)["progress"];
  EXPECT_EQ(j["stepsPerSecond"], 10.0);
  EXPECT_EQ(j["eta"], "6m09s");
  EXPECT_EQ(api::parse_status(api::to_json(st)), st);
  now += 31s;
  read_at(1930);  // 20 steps/s now, smoothed: half of 10 + half of 20
  EXPECT_EQ(st.progress->steps_per_second, 15);
  EXPECT_EQ(st.progress->eta, "3m25s");

  // The chief stops advancing: the next read says so (no rate, no ETA, the last step's time
  // stays) and after that nothing changes, however long it stays so.
  now += 31s;
  read_at(1930);
  EXPECT_EQ(st.progress->steps_per_second, 0);
  EXPECT_EQ(st.progress->eta, "");
  EXPECT_EQ(st.progress->estimated_completion_time, "");
  EXPECT_EQ(st.progress->last_step_time, "2026-11-21T13:01:02Z");
  const api::TrainingJobStatus stalled = st;
  for (int i = 0; i < 20; ++i) {
    now += 31s;
    read_at(1930);
  }
  EXPECT_EQ(st, stalled) << "a stalled chief must cost no status writes";
}

// Zero writes at rest across an operator restart: the new tracker has no previous read, and the
// first read of a stalled chief must not move lastStepTime (nor write anything).
TEST(ProgressTrackerTest, AnOperatorRestartDoesNotTouchAStalledJobsProgress) {
  FakeChief chief;
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  {
    ProgressTracker before(options_for(chief));
    before.track("ns/j", &kRunningChief, 30s, st, now);
    ASSERT_TRUE(before.wait_idle(10s));
    before.track("ns/j", &kRunningChief, 30s, st, now);
  }
  ASSERT_TRUE(st.progress);
  const api::TrainingJobStatus recorded = st;
  now += std::chrono::hours(2);
  ProgressTracker after(options_for(chief));
  after.track("ns/j", &kRunningChief, 30s, st, now);
  ASSERT_TRUE(after.wait_idle(10s));
  after.track("ns/j", &kRunningChief, 30s, st, now);
  EXPECT_EQ(st, recorded);
}

TEST(ProgressEtaTest, ReadsLikeADuration) {
  auto eta_for = [](int64_t left, double rate) {
    api::TrainingJobStatus st;
    ProgressSample s{100, 100 + left, 0, 0};
    s.steps_per_second = rate;
    s.eta_seconds = static_cast<int64_t>(static_cast<double>(left) / rate);
    apply_progress(st, s, 30s, at("2026-11-21T13:00:00Z"));
    return st.progress->eta;
  };
  EXPECT_EQ(eta_for(40, 1), "40s");
  EXPECT_EQ(eta_for(7500, 1), "2h05m");
  EXPECT_EQ(eta_for(3 * 86400 + 4 * 3600 + 59, 1), "3d04h");
}

// ---- the chief's termination message (worker/cli/termination_message.h)

constexpr const char* kFinalMessage =
    R"({"chief":true,"lastCheckpointStep":1500,"lastCheckpointTime":"2026-11-21T13:09:59Z",)"
    R"("lastStepTime":"2026-11-21T13:10:00Z","maxSteps":1500,"step":1500,"stepsPerSecond":2.5})";

TEST(TerminationMessageTest, ParsesTheWorkersMessageAndNothingElse) {
  const auto s = parse_termination_message(kFinalMessage);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->step, 1500);
  EXPECT_EQ(s->max_steps, 1500);
  EXPECT_EQ(s->last_checkpoint_step, 1500);
  EXPECT_EQ(s->last_checkpoint_unix, unix_of("2026-11-21T13:09:59Z"));
  EXPECT_EQ(s->last_step_unix, unix_of("2026-11-21T13:10:00Z"));
  EXPECT_EQ(s->steps_per_second, 2.5);
  EXPECT_EQ(s->is_chief, 1);
  EXPECT_EQ(parse_termination_message(R"({"step":3})")->is_chief, -1);
  EXPECT_EQ(parse_termination_message(R"({"step":3,"chief":false})")->is_chief, 0);
  for (const char* other : {"", "Error: out of memory", "{}", R"({"step":-1})", R"({"step":"3"})",
                            "[1,2]", R"({"step":1.5})"}) {
    EXPECT_EQ(parse_termination_message(other), std::nullopt) << other;
  }
}

json terminated_chief(const std::string& message, const std::string& finished_at,
                      const std::string& phase = "Succeeded") {
  json pod = chief_pod(phase, "10.0.0.7", {{{"name", "metrics"}, {"containerPort", 9400}}});
  json terminated = {{"exitCode", phase == "Succeeded" ? 0 : 1},
                     {"finishedAt", finished_at},
                     {"message", message}};
  json container = {{"name", "trainer"}, {"state", {{"terminated", terminated}}}};
  pod["status"]["containerStatuses"] = json::array({container});
  return pod;
}

TEST(TerminationMessageTest, IsFoundInTheTerminatedContainersStatus) {
  const auto t = terminated_progress(terminated_chief(kFinalMessage, "2026-11-21T13:10:01Z"));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->sample.step, 1500);
  EXPECT_EQ(t->sample.pod, "j-chief-0");
  EXPECT_EQ(t->termination, "j-chief-0/trainer@2026-11-21T13:10:01Z");
  EXPECT_EQ(terminated_progress(kRunningChief), std::nullopt);
  // Found on the real API server: an unset time is null there (startedAt, finishedAt), and a
  // reconcile failed on it.
  json unset = terminated_chief(kFinalMessage, "");
  unset["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = nullptr;
  unset["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"] = nullptr;
  ASSERT_NO_THROW(terminated_progress(unset));
  EXPECT_EQ(terminated_progress(unset)->termination, "j-chief-0/trainer@");
  EXPECT_EQ(terminated_progress(terminated_chief("Error: boom", "2026-11-21T13:10:01Z")),
            std::nullopt);
}

// Found in the field: a job that trained 1,500 of 1,500 steps ended Succeeded with STEP 749/1500:
// the last read of the metrics came half-way, and nothing was read once the chief had finished.
TEST(ProgressTrackerTest, AFinishedJobShowsTheStepTheChiefEndedAtNotTheLastRead) {
  FakeChief chief;
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  {
    std::lock_guard lock(chief.mu);
    chief.exposition = "longhaul_train_global_step 749\nlonghaul_train_max_steps 1500\n";
  }
  tracker.track("ns/j", &kRunningChief, 30s, st, now);
  ASSERT_TRUE(tracker.wait_idle(10s));
  tracker.track("ns/j", &kRunningChief, 30s, st, now);
  ASSERT_EQ(st.progress->steps, "749/1500");

  // 5 s later (well inside the rate limit) the chief has exited and the job is finished.
  now += 5s;
  st.phase = "Succeeded";
  const json done = terminated_chief(kFinalMessage, "2026-11-21T13:00:04Z");
  EXPECT_EQ(tracker.track("ns/j", &done, 30s, st, now), std::nullopt);
  EXPECT_EQ(st.progress->steps, "1500/1500");
  EXPECT_EQ(st.progress->last_checkpoint_step, 1500);
  EXPECT_EQ(st.progress->last_checkpoint_time, "2026-11-21T13:09:59Z");
  EXPECT_EQ(st.progress->last_step_time, "2026-11-21T13:10:00Z");
  EXPECT_EQ(st.progress->steps_per_second, 2.5);
  EXPECT_EQ(st.progress->eta, "");
  EXPECT_EQ(st.progress->observed_time, "2026-11-21T13:00:05Z");
  // A finished job is read no more, and the same message again changes nothing.
  const api::TrainingJobStatus final_status = st;
  const int reads = chief.reads;
  for (int i = 0; i < 5; ++i) {
    now += 31s;
    EXPECT_EQ(tracker.track("ns/j", &done, 30s, st, now), std::nullopt);
    EXPECT_EQ(tracker.track("ns/j", nullptr, 30s, st, now), std::nullopt);
  }
  ASSERT_TRUE(tracker.wait_idle(10s));
  EXPECT_EQ(chief.reads, reads);
  EXPECT_EQ(st, final_status);

  // A chief that failed before it restored anything (step 0, no checkpoint) does not wipe
  // the recorded progress of a failed job either.
  st.phase = "Failed";
  const json early =
      terminated_chief(R"({"step":0,"chief":true})", "2026-11-21T13:20:00Z", "Failed");
  tracker.track("ns/j", &early, 30s, st, now);
  EXPECT_EQ(st.progress, final_status.progress);
}

TEST(ProgressTrackerTest, ATerminatedChiefOfARunningJobIsAppliedOnceAndOnlyForward) {
  FakeChief chief;
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  // The chief's container ended (other replicas still run): applied at once.
  const json done = terminated_chief(kFinalMessage, "2026-11-21T13:00:00Z");
  tracker.track("ns/j", &done, 30s, st, now);
  EXPECT_EQ(st.progress->step, 1500);
  // A worker that says it is not the chief is never taken for it.
  api::TrainingJobStatus other;
  const json worker =
      terminated_chief(R"({"step":99,"chief":false})", "2026-11-21T13:00:00Z", "Failed");
  tracker.track("ns/k", nullptr, 30s, other, now, {&worker});
  EXPECT_FALSE(other.progress);
  // The role moved on to a promoted worker that trains further: once applied, the same
  // termination is not applied again over the newer values.
  {
    std::lock_guard lock(chief.mu);
    chief.exposition = "longhaul_train_global_step 1600\nlonghaul_worker_is_chief 1\n";
  }
  const json promoted = chief_pod("Running", "10.0.0.8",
                                  {{{"name", "metrics"}, {"containerPort", 9400}}}, "j-worker-0");
  now += 40s;
  tracker.track("ns/j", &done, 30s, st, now, {&promoted});
  ASSERT_TRUE(tracker.wait_idle(10s));
  tracker.track("ns/j", &done, 30s, st, now, {&promoted});
  EXPECT_EQ(st.progress->step, 1600);
  EXPECT_EQ(st.progress->pod, "j-worker-0");
  now += 5s;
  tracker.track("ns/j", &done, 30s, st, now, {&promoted});
  EXPECT_EQ(st.progress->step, 1600);
}

// ---- failed reads

// A job shorter than one interval never showed progress: the read right after the chief started
// failed (connection refused) and the next came a whole interval later.
TEST(ProgressTrackerTest, AFailedReadIsRetriedSoonNotAWholeIntervalLater) {
  FakeChief chief;
  {
    std::lock_guard lock(chief.mu);
    chief.reachable = false;
  }
  std::atomic<int> updates{0};
  ProgressTracker tracker(options_for(chief, &updates));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  EXPECT_EQ(tracker.track("ns/j", &kRunningChief, 30s, st, now), 30000ms);
  ASSERT_TRUE(tracker.wait_idle(10s));
  EXPECT_EQ(updates.load(), 1) << "a failed read has the job reconciled to schedule the retry";
  EXPECT_EQ(tracker.track("ns/j", &kRunningChief, 30s, st, now), 1000ms);
  // The retries back off: 1 s, 2 s, 4 s, ... at most the interval; no status change meanwhile.
  std::vector<std::chrono::milliseconds> waits;
  for (int i = 0; i < 7; ++i) {
    now += waits.empty() ? 1000ms : waits.back();
    tracker.track("ns/j", &kRunningChief, 30s, st, now);
    ASSERT_TRUE(tracker.wait_idle(10s));
    waits.push_back(*tracker.track("ns/j", &kRunningChief, 30s, st, now));
  }
  EXPECT_EQ(waits, (std::vector<std::chrono::milliseconds>{2000ms, 4000ms, 8000ms, 16000ms, 30000ms,
                                                           30000ms, 30000ms}));
  EXPECT_EQ(chief.reads, 8);
  EXPECT_FALSE(st.progress);
  EXPECT_EQ(updates.load(), 1) << "only the first failure of a streak needs a reconcile";
  // The chief answers: read at the next retry, and the interval applies again after it.
  {
    std::lock_guard lock(chief.mu);
    chief.reachable = true;
  }
  now += 30s;
  tracker.track("ns/j", &kRunningChief, 30s, st, now);
  ASSERT_TRUE(tracker.wait_idle(10s));
  EXPECT_EQ(tracker.track("ns/j", &kRunningChief, 30s, st, now), 30000ms);
  ASSERT_TRUE(st.progress);
  EXPECT_EQ(st.progress->steps, "1200/5000");
}

// A job shorter than one interval showed "0/N" (the chief up, loading) until it ended: the next
// read came a whole interval later, and its change waited out the interval after the 0.
TEST(ProgressTrackerTest, AChiefNotTrainingYetIsReadAgainSoonAndItsFirstStepShowsAtOnce) {
  FakeChief chief;
  auto serve = [&](int64_t step) {
    std::lock_guard lock(chief.mu);
    chief.exposition =
        "longhaul_train_global_step " + std::to_string(step) + "\nlonghaul_train_max_steps 160\n";
  };
  ProgressTracker tracker(options_for(chief));
  api::TrainingJobStatus st;
  api::Time now = at("2026-11-21T13:00:00Z");
  auto reconcile = [&] {
    tracker.track("ns/j", &kRunningChief, 30s, st, now);
    EXPECT_TRUE(tracker.wait_idle(10s));
    return tracker.track("ns/j", &kRunningChief, 30s, st, now);
  };
  serve(0);
  EXPECT_EQ(reconcile(), 1000ms) << "step 0: read again in a second";
  EXPECT_EQ(st.progress->steps, "0/160");
  now += 1s;
  serve(0);
  EXPECT_EQ(reconcile(), 2000ms);
  now += 2s;
  serve(9);
  EXPECT_EQ(reconcile(), 30000ms) << "training: back to one read per interval";
  EXPECT_EQ(st.progress->steps, "9/160") << "the first step replaces the 0 at once";
  EXPECT_EQ(st.progress->observed_time, "2026-11-21T13:00:03Z");
  // From here on the rate limit holds as ever.
  now += 30s;
  serve(99);
  reconcile();
  EXPECT_EQ(st.progress->steps, "9/160");
  now += 1s;
  reconcile();
  EXPECT_EQ(st.progress->steps, "99/160");
}

// ---- fetch_metrics against real sockets

TEST(FetchMetricsTest, ReadsTheBodyOfA200) {
  http::Server server("test metrics", "127.0.0.1", 0, [](std::string_view, std::string_view path) {
    return path == "/metrics" ? http::Response{200, "text/plain", kWorkerExposition}
                              : http::Response{404, "text/plain", "no"};
  });
  server.start();
  const std::string body = fetch_metrics({"127.0.0.1", server.port()}, 5000ms);
  EXPECT_EQ(body, kWorkerExposition);
  EXPECT_EQ(parse_progress_metrics(body), (ProgressSample{1200, 5000, 1000, 1763730000}));
}

TEST(FetchMetricsTest, FailuresAreUnavailableNamingTheEndpoint) {
  http::Server server("test metrics", "127.0.0.1", 0, [](std::string_view, std::string_view) {
    return http::Response{500, "text/plain", "boom"};
  });
  server.start();
  try {
    fetch_metrics({"127.0.0.1", server.port()}, 5000ms);
    ADD_FAILURE() << "a 500 was accepted";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(server.port()) +
                                         "/metrics: HTTP status 500"),
              std::string::npos)
        << e.what();
  }
  const int closed = server.port();
  server.stop();
  EXPECT_THROW(fetch_metrics({"127.0.0.1", closed}, 5000ms), Unavailable);
  EXPECT_THROW(fetch_metrics({"not-an-ip", 9400}, 5000ms), Unavailable);
}

TEST(FetchMetricsTest, ASilentChiefCostsAtMostTheDeadline) {
  // A socket that listens but never accepts: the connection completes in the backlog and no
  // byte ever comes back.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  try {
    fetch_metrics({"127.0.0.1", port}, 300ms);
    ADD_FAILURE() << "a silent server answered";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("reading the chief's progress from http://127.0.0.1:" +
                                         std::to_string(port) + "/metrics"),
              std::string::npos)
        << e.what();
  }
  ::close(fd);
}

}  // namespace
}  // namespace longhaul::controller
