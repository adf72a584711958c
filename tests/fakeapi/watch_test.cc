// Watch streams over real HTTP: framing, ordering, resume, bookmarks, 410 Expired, timeouts,
// selector transitions, direct store writes, and stop() with open streams.
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "test_fixture.h"

namespace longhaul::fakeapi::testing {
namespace {

using std::chrono::milliseconds;

std::string list_rv(TestHttpClient& client, const std::string& path) {
  return client.get(path).json_body()["metadata"]["resourceVersion"];
}

TEST_F(FakeApiTest, WatchStreamsAddedModifiedDeletedInOrder) {
  std::string rv = list_rv(*client_, kPods);
  TestHttpClient watch(server_->port());
  Response head = watch.start_watch(kPods + "?watch=true&resourceVersion=" + rv);
  ASSERT_EQ(head.status, 200);
  EXPECT_EQ(head.header("transfer-encoding"), "chunked");
  EXPECT_EQ(head.header("content-type"), "application/json");

  json created = create_pod("a", {}, "node-1");
  client_->patch(kPods + "/a", {{"metadata", {{"labels", {{"x", "1"}}}}}});
  client_->del(kPods + "/a?gracePeriodSeconds=0");

  std::vector<std::string> types;
  uint64_t last = std::stoull(rv);
  for (int i = 0; i < 3; ++i) {
    std::optional<json> e = watch.next_event();
    ASSERT_TRUE(e.has_value()) << "event " << i;
    types.push_back((*e)["type"]);
    const json& object = (*e)["object"];
    EXPECT_EQ(object["kind"], "Pod");
    EXPECT_EQ(object["apiVersion"], "v1");
    EXPECT_EQ(object["metadata"]["name"], "a");
    EXPECT_GT(rv_of(object), last);
    last = rv_of(object);
  }
  EXPECT_EQ(types, (std::vector<std::string>{"ADDED", "MODIFIED", "DELETED"}));
}

TEST_F(FakeApiTest, WatchWithoutVersionStartsWithSyntheticAddedEvents) {
  create_pod("a");
  create_pod("b");
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=1");
  for (const char* name : {"a", "b"}) {
    std::optional<json> e = watch.next_event();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)["type"], "ADDED");
    EXPECT_EQ((*e)["object"]["metadata"]["name"], name);
  }
  create_pod("c");
  std::optional<json> e = watch.next_event();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["object"]["metadata"]["name"], "c");
}

TEST_F(FakeApiTest, SendInitialEventsEndsWithAnAnnotatedBookmark) {
  create_pod("a");
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods +
                    "?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&"
                    "resourceVersionMatch=NotOlderThan");
  std::optional<json> added = watch.next_event();
  std::optional<json> end = watch.next_event();
  ASSERT_TRUE(added && end);
  EXPECT_EQ((*added)["type"], "ADDED");
  EXPECT_EQ((*end)["type"], "BOOKMARK");
  EXPECT_EQ((*end)["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
  EXPECT_EQ((*end)["object"]["metadata"]["resourceVersion"],
            std::to_string(server_->resource_version()));
}

TEST_F(FakeApiTest, WatchResumesFromResourceVersion) {
  json a = create_pod("a");
  create_pod("b");
  client_->patch(kPods + "/a", {{"metadata", {{"labels", {{"x", "1"}}}}}});
  TestHttpClient watch(server_->port());
  watch.start_watch(
      kPods + "?watch=true&resourceVersion=" + a["metadata"]["resourceVersion"].get<std::string>());
  std::optional<json> first = watch.next_event();
  std::optional<json> second = watch.next_event();
  ASSERT_TRUE(first && second);
  EXPECT_EQ((*first)["type"], "ADDED");
  EXPECT_EQ((*first)["object"]["metadata"]["name"], "b");
  EXPECT_EQ((*second)["type"], "MODIFIED");
  EXPECT_EQ((*second)["object"]["metadata"]["name"], "a");
  EXPECT_FALSE(watch.next_event(milliseconds(100)).has_value());
  EXPECT_TRUE(watch.timed_out()) << "nothing else, and the stream stays open";
}

TEST_F(FakeApiTest, BookmarksCarryOnlyTheResourceVersion) {
  create_pod("a");
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true&allowWatchBookmarks=true&resourceVersion=" +
                    std::to_string(server_->resource_version()));
  std::optional<json> e = watch.next_event(std::chrono::seconds(5));
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["type"], "BOOKMARK");
  const json& object = (*e)["object"];
  EXPECT_EQ(object["kind"], "Pod");
  EXPECT_EQ(object["apiVersion"], "v1");
  EXPECT_EQ(object["metadata"],
            (json{{"resourceVersion", std::to_string(server_->resource_version())}}));

  // Without allowWatchBookmarks there are none.
  TestHttpClient plain(server_->port());
  plain.start_watch(kPods +
                    "?watch=true&resourceVersion=" + std::to_string(server_->resource_version()));
  EXPECT_FALSE(plain.next_event(milliseconds(200)).has_value());
  EXPECT_TRUE(plain.timed_out());
}

class SmallHistoryTest : public FakeApiTest {
 protected:
  Options options() override {
    Options o = FakeApiTest::options();
    o.event_history_size = 3;
    return o;
  }
};

TEST_F(SmallHistoryTest, WatchFromBeforeTheHistoryGetsExpired410) {
  json first = create_pod("p0");
  for (int i = 1; i < 8; ++i) create_pod("p" + std::to_string(i));
  TestHttpClient watch(server_->port());
  Response head = watch.start_watch(kPods + "?watch=true&resourceVersion=" +
                                    first["metadata"]["resourceVersion"].get<std::string>());
  EXPECT_EQ(head.status, 200);
  std::optional<json> e = watch.next_event();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["type"], "ERROR");
  EXPECT_EQ((*e)["object"]["kind"], "Status");
  EXPECT_EQ((*e)["object"]["code"], 410);
  EXPECT_EQ((*e)["object"]["reason"], "Expired");
  EXPECT_FALSE(watch.next_event().has_value());
  EXPECT_TRUE(watch.ended_cleanly());

  // Relist and watch again from the list's version: works.
  std::string rv = list_rv(*client_, kPods);
  TestHttpClient again(server_->port());
  again.start_watch(kPods + "?watch=true&resourceVersion=" + rv);
  create_pod("fresh");
  std::optional<json> added = again.next_event();
  ASSERT_TRUE(added);
  EXPECT_EQ((*added)["type"], "ADDED");
}

TEST_F(FakeApiTest, WatchTimeoutSecondsEndsTheStreamCleanly) {
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true&timeoutSeconds=1&resourceVersion=" +
                    std::to_string(server_->resource_version()));
  EXPECT_FALSE(watch.next_event(std::chrono::seconds(10)).has_value());
  EXPECT_TRUE(watch.ended_cleanly());
  EXPECT_FALSE(watch.timed_out());
}

TEST_F(FakeApiTest, LabelSelectorWatchSeesObjectsEnterAndLeave) {
  create_pod("a", {{"role", "worker"}});
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true&labelSelector=role%3Dchief&resourceVersion=" +
                    std::to_string(server_->resource_version()));
  create_pod("other", {{"role", "worker"}});  // never matches: no event
  client_->patch(kPods + "/a", {{"metadata", {{"labels", {{"role", "chief"}}}}}});
  client_->patch(kPods + "/a", {{"metadata", {{"annotations", {{"n", "1"}}}}}});
  client_->patch(kPods + "/a", {{"metadata", {{"labels", {{"role", "worker"}}}}}});
  std::vector<std::string> types;
  for (int i = 0; i < 3; ++i) {
    std::optional<json> e = watch.next_event();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)["object"]["metadata"]["name"], "a");
    types.push_back((*e)["type"]);
  }
  EXPECT_EQ(types, (std::vector<std::string>{"ADDED", "MODIFIED", "DELETED"}));
  EXPECT_FALSE(watch.next_event(milliseconds(100)).has_value());
}

TEST_F(FakeApiTest, WatchIsScopedToNamespaceAndFieldSelector) {
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods + "?watch=true&fieldSelector=metadata.name%3Db&resourceVersion=" +
                    std::to_string(server_->resource_version()));
  ASSERT_EQ(client_->post("/api/v1/namespaces/other/pods", pod("b")).status, 201);
  create_pod("a");
  create_pod("b");
  std::optional<json> e = watch.next_event();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["object"]["metadata"]["namespace"], "default");
  EXPECT_EQ((*e)["object"]["metadata"]["name"], "b");
  EXPECT_FALSE(watch.next_event(milliseconds(100)).has_value());

  // Legacy single-object watch path and an all-namespaces watch.
  TestHttpClient legacy(server_->port());
  legacy.start_watch("/api/v1/watch/namespaces/default/pods/a?resourceVersion=" +
                     std::to_string(server_->resource_version()));
  TestHttpClient everywhere(server_->port());
  everywhere.start_watch("/api/v1/pods?watch=true&resourceVersion=" +
                         std::to_string(server_->resource_version()));
  client_->del(kPods + "/a");
  std::optional<json> deleted = legacy.next_event();
  ASSERT_TRUE(deleted);
  EXPECT_EQ((*deleted)["type"], "DELETED");
  std::optional<json> seen = everywhere.next_event();
  ASSERT_TRUE(seen);
  EXPECT_EQ((*seen)["object"]["metadata"]["name"], "a");
}

TEST_F(FakeApiTest, DirectStoreWritesReachWatchersLikeHttpWrites) {
  TestHttpClient watch(server_->port());
  watch.start_watch(kPods +
                    "?watch=true&resourceVersion=" + std::to_string(server_->resource_version()));
  json created = server_->create("pods", "default", pod("a", {}, "node-1"));
  json running = server_->patch_status("pods", "default", "a", {{"phase", "Running"}});
  json terminating = server_->remove("pods", "default", "a");
  server_->finalize_pod_deletion("default", "a");
  std::vector<std::pair<std::string, uint64_t>> seen;
  for (int i = 0; i < 4; ++i) {
    std::optional<json> e = watch.next_event();
    ASSERT_TRUE(e);
    seen.emplace_back((*e)["type"], rv_of((*e)["object"]));
  }
  EXPECT_EQ(seen[0], std::make_pair(std::string("ADDED"), rv_of(created)));
  EXPECT_EQ(seen[1], std::make_pair(std::string("MODIFIED"), rv_of(running)));
  EXPECT_EQ(seen[2], std::make_pair(std::string("MODIFIED"), rv_of(terminating)));
  EXPECT_EQ(seen[3].first, "DELETED");
  EXPECT_EQ(seen[3].second, server_->resource_version());
}

TEST_F(FakeApiTest, CascadingDeletionEmitsDeletedEventsForDependents) {
  json job = client_->post(kJobs, training_job("j")).json_body();
  for (const char* name : {"j-worker-0", "j-worker-1"}) {
    json p = pod(name);
    p["metadata"]["ownerReferences"] = json::array({owner_ref(job)});
    ASSERT_EQ(client_->post(kPods, p).status, 201);
  }
  TestHttpClient pods_watch(server_->port());
  pods_watch.start_watch(
      kPods + "?watch=true&resourceVersion=" + std::to_string(server_->resource_version()));
  TestHttpClient jobs_watch(server_->port());
  jobs_watch.start_watch(
      kJobs + "?watch=true&resourceVersion=" + std::to_string(server_->resource_version()));
  ASSERT_EQ(client_->del(kJobs + "/j").status, 200);
  std::optional<json> job_deleted = jobs_watch.next_event();
  ASSERT_TRUE(job_deleted);
  EXPECT_EQ((*job_deleted)["type"], "DELETED");
  std::vector<std::string> deleted;
  for (int i = 0; i < 2; ++i) {
    std::optional<json> e = pods_watch.next_event();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)["type"], "DELETED");
    EXPECT_GT(rv_of((*e)["object"]), rv_of((*job_deleted)["object"]));
    deleted.push_back((*e)["object"]["metadata"]["name"]);
  }
  EXPECT_EQ(deleted, (std::vector<std::string>{"j-worker-0", "j-worker-1"}));
}

TEST_F(FakeApiTest, ConcurrentWritersAreSeenByEveryWatcherOnceInVersionOrder) {
  constexpr int kWriters = 4;
  constexpr int kPodsEach = 20;
  std::string rv = std::to_string(server_->resource_version());
  std::vector<std::unique_ptr<TestHttpClient>> watches;
  for (int i = 0; i < 2; ++i) {
    watches.push_back(std::make_unique<TestHttpClient>(server_->port()));
    watches.back()->start_watch("/api/v1/pods?watch=true&resourceVersion=" + rv);
  }
  std::vector<std::thread> writers;
  for (int t = 0; t < kWriters; ++t) {
    writers.emplace_back([&, t] {
      TestHttpClient client(server_->port());
      for (int i = 0; i < kPodsEach; ++i) {
        std::string ns = t % 2 == 0 ? "default" : "other";
        client.post("/api/v1/namespaces/" + ns + "/pods",
                    pod("p-" + std::to_string(t) + "-" + std::to_string(i)));
      }
    });
  }
  for (auto& w : writers) w.join();
  for (auto& watch : watches) {
    std::set<std::string> seen;
    uint64_t last = 0;
    for (int i = 0; i < kWriters * kPodsEach; ++i) {
      std::optional<json> e = watch->next_event();
      ASSERT_TRUE(e) << "event " << i;
      EXPECT_EQ((*e)["type"], "ADDED");
      EXPECT_GT(rv_of((*e)["object"]), last);
      last = rv_of((*e)["object"]);
      seen.insert((*e)["object"]["metadata"]["name"].get<std::string>());
    }
    EXPECT_EQ(seen.size(), size_t{kWriters * kPodsEach});
    EXPECT_FALSE(watch->next_event(milliseconds(50)).has_value());
  }
}

TEST_F(FakeApiTest, StopEndsOpenWatchesAndJoins) {
  std::vector<std::unique_ptr<TestHttpClient>> watches;
  for (int i = 0; i < 3; ++i) {
    watches.push_back(std::make_unique<TestHttpClient>(server_->port()));
    watches.back()->start_watch(kPods + "?watch=true&allowWatchBookmarks=true");
  }
  ASSERT_TRUE(
      server_->wait_for([&] { return server_->open_watch_count() == 3; }, std::chrono::seconds(5)));
  server_->stop();
  EXPECT_FALSE(server_->running());
  EXPECT_EQ(server_->open_watch_count(), 0u);
  for (auto& w : watches) {
    // Drain anything sent before the stop; then the connection is closed.
    while (w->next_event(std::chrono::seconds(5)).has_value()) {
    }
    EXPECT_FALSE(w->timed_out());
  }
  // The store survives a restart (on a new ephemeral port).
  server_->create("pods", "default", pod("kept"));
  server_->start();
  TestHttpClient after(server_->port());
  EXPECT_EQ(after.get(kPods + "/kept").status, 200);
}

}  // namespace
}  // namespace longhaul::fakeapi::testing
