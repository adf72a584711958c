// Fault injection: counted and probabilistic 5xx/429 (with Retry-After), verb/path matching,
// latency, dropped watches (abort, graceful, periodic) and forced 410 Expired.
#include <gtest/gtest.h>

#include "test_fixture.h"

namespace longhaul::fakeapi::testing {
namespace {

using std::chrono::milliseconds;

TEST_F(FakeApiTest, NextNRequestsFailThenSucceed) {
  server_->add_fault({.verb = "list", .status = 503, .times = 2});
  EXPECT_EQ(client_->get(kPods).status, 503);
  Response second = client_->get(kPods);
  EXPECT_EQ(second.status, 503);
  EXPECT_EQ(second.json_body()["reason"], "ServiceUnavailable");
  EXPECT_EQ(client_->get(kPods).status, 200);
  EXPECT_EQ(server_->injected_fault_count(), 2u);
  EXPECT_EQ(server_->count_requests({.injected = true}), 2u);
}

TEST_F(FakeApiTest, TooManyRequestsCarriesRetryAfter) {
  server_->add_fault({.status = 429, .retry_after_seconds = 3, .times = 1});
  Response r = client_->get(kPods);
  ASSERT_EQ(r.status, 429);
  EXPECT_EQ(r.header("retry-after"), "3");
  json status = r.json_body();
  EXPECT_EQ(status["reason"], "TooManyRequests");
  EXPECT_EQ(status["code"], 429);
  EXPECT_EQ(status["details"]["retryAfterSeconds"], 3);
}

TEST_F(FakeApiTest, FaultsMatchVerbAndPathAndLeaveTheStoreUntouched) {
  int id = server_->add_fault({.verb = "create", .path_regex = "/pods$", .status = 500});
  EXPECT_EQ(client_->post(kPods, pod("a")).status, 500);
  EXPECT_FALSE(server_->try_get("pods", "default", "a").has_value())
      << "a failed create must not create";
  EXPECT_EQ(client_->get(kPods).status, 200) << "other verbs pass";
  EXPECT_EQ(client_
                ->post("/api/v1/namespaces/default/services",
                       {{"metadata", {{"name", "s"}}}, {"spec", json::object()}})
                .status,
            201)
      << "other paths pass";
  server_->remove_fault(id);
  EXPECT_EQ(client_->post(kPods, pod("a")).status, 201);
}

TEST_F(FakeApiTest, ProbabilisticFaultsAreDeterministicForASeed) {
  auto run = [&](uint64_t seed) {
    server_->clear_faults();
    server_->set_fault_seed(seed);
    server_->add_fault({.verb = "get", .status = 500, .probability = 0.3});
    std::string pattern;
    for (int i = 0; i < 40; ++i) pattern += client_->get(kPods + "/x").status == 500 ? 'F' : '.';
    return pattern;
  };
  std::string a = run(7);
  std::string b = run(7);
  EXPECT_EQ(a, b);
  size_t failures = std::count(a.begin(), a.end(), 'F');
  EXPECT_GT(failures, 0u) << a;
  EXPECT_LT(failures, 40u) << a;
  EXPECT_NE(run(8), a) << "another seed gives another sequence";
}

TEST_F(FakeApiTest, LatencyDelaysAnswers) {
  server_->add_fault({.verb = "get", .status = 0, .latency = milliseconds(300)});
  create_pod("a");
  auto start = std::chrono::steady_clock::now();
  Response r = client_->get(kPods + "/a");
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status, 200);
  EXPECT_GE(elapsed, milliseconds(300));
  EXPECT_EQ(server_->injected_fault_count(), 0u) << "latency alone is not an error";
}

TEST_F(FakeApiTest, DroppedWatchesAbortTheConnection) {
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true");
  ASSERT_TRUE(
      server_->wait_for([&] { return server_->open_watch_count() == 1; }, std::chrono::seconds(5)));
  server_->drop_watches(DropMode::kAbort);
  EXPECT_FALSE(watch.next_event(std::chrono::seconds(5)).has_value());
  EXPECT_TRUE(watch.closed());
  EXPECT_FALSE(watch.ended_cleanly()) << "no final chunk: a broken stream";
  EXPECT_TRUE(
      server_->wait_for([&] { return server_->open_watch_count() == 0; }, std::chrono::seconds(5)));
}

TEST_F(FakeApiTest, GracefullyDroppedWatchesEndWithTheFinalChunk) {
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true");
  ASSERT_TRUE(
      server_->wait_for([&] { return server_->open_watch_count() == 1; }, std::chrono::seconds(5)));
  server_->drop_watches(DropMode::kGraceful);
  EXPECT_FALSE(watch.next_event(std::chrono::seconds(5)).has_value());
  EXPECT_TRUE(watch.ended_cleanly());
}

TEST_F(FakeApiTest, PeriodicWatchDropsCloseEveryNewStream) {
  server_->set_watch_drop_interval(milliseconds(100));
  for (int i = 0; i < 2; ++i) {
    TestHttpClient watch(server_->port());
    watch.start_watch(kPods + "?watch=true");
    EXPECT_FALSE(watch.next_event(std::chrono::seconds(5)).has_value());
    EXPECT_TRUE(watch.closed());
    EXPECT_FALSE(watch.timed_out());
  }
  server_->set_watch_drop_interval(milliseconds(0));
  TestHttpClient kept(server_->port());
  kept.start_watch(kPods + "?watch=true");
  EXPECT_FALSE(kept.next_event(milliseconds(300)).has_value());
  EXPECT_TRUE(kept.timed_out()) << "no more drops";
}

TEST_F(FakeApiTest, ExpireHistoryForces410OnTheNextWatch) {
  create_pod("a");
  std::string rv = client_->get(kPods).json_body()["metadata"]["resourceVersion"];
  server_->expire_history();
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true&resourceVersion=" + rv);
  std::optional<json> e = watch.next_event();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["type"], "ERROR");
  EXPECT_EQ((*e)["object"]["code"], 410);

  std::string relisted = client_->get(kPods).json_body()["metadata"]["resourceVersion"];
  EXPECT_NE(relisted, rv);
  TestHttpClient again(server_->port());
  again.start_watch(kPods + "?watch=true&resourceVersion=" + relisted);
  create_pod("b");
  std::optional<json> added = again.next_event();
  ASSERT_TRUE(added);
  EXPECT_EQ((*added)["type"], "ADDED");
}

TEST_F(FakeApiTest, WatchRequestsCanBeFaulted) {
  server_->add_fault({.verb = "watch", .status = 500, .times = 1});
  TestHttpClient watch(server_->port());
  Response head = watch.start_watch(kPods + "?watch=true");
  EXPECT_EQ(head.status, 500);
  EXPECT_EQ(json::parse(head.body)["reason"], "InternalError");
}

TEST_F(FakeApiTest, StopInterruptsInjectedLatency) {
  server_->add_fault({.status = 0, .latency = std::chrono::hours(1)});
  std::thread slow([&] {
    TestHttpClient client(server_->port());
    EXPECT_THROW(client.get(kPods), std::runtime_error);  // the connection is closed
  });
  ASSERT_TRUE(server_->wait_for([&] { return server_->requests_in_flight() == 1; },
                                std::chrono::seconds(5)));
  server_->stop();
  slow.join();
}

}  // namespace
}  // namespace longhaul::fakeapi::testing
