// StoreClient: the fake API server's store as a kube::Client (no HTTP). What a test relying on
// it would notice: the store's answers as the typed kube errors, the clock it stamps, the write
// counts, and pods left Terminating until a kubelet (erase) or a force delete removes them.
#include "longhaul/fakeapi/store_client.h"

#include <gtest/gtest.h>

namespace longhaul::fakeapi {
namespace {

namespace res = kube::resources;
using json = kube::json;

json pod(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"spec", {{"containers", {{{"name", "c"}, {"image", "i:1"}}}}}}};
}

TEST(StoreClientTest, StoreAnswersArriveAsTheTypedKubeErrors) {
  StoreClient client;
  const json created = client.create(res::kPods, "ns", pod("p"));
  EXPECT_THROW(client.create(res::kPods, "ns", pod("p")), kube::AlreadyExistsError);
  EXPECT_THROW(client.get(res::kPods, "ns", "missing"), kube::NotFoundError);
  json stale = created;
  client.patch(res::kPods, "ns", "p", {{"metadata", {{"labels", {{"a", "b"}}}}}},
               kube::PatchType::kMerge, false);
  EXPECT_THROW(client.update(res::kPods, "ns", stale), kube::ConflictError);
  try {
    client.patch(res::kPods, "ns", "p", {{"metadata", {{"uid", "someone-else"}}}},
                 kube::PatchType::kMerge, false);
    FAIL() << "a patch changed metadata.uid";
  } catch (const kube::InvalidError& e) {
    EXPECT_EQ(e.http_status(), 422);
    EXPECT_NE(std::string(e.what()).find("patch pods ns/p"), std::string::npos) << e.what();
  }
  EXPECT_THROW(client.watch(res::kPods, "ns", {}), Unavailable);
}

TEST(StoreClientTest, StampsTheTestsClockAndCountsWritesRefusedOrNot) {
  StoreClient client;
  client.now_text = "2026-11-21T13:00:05Z";
  EXPECT_EQ(client.create(res::kPods, "ns", pod("p"))["metadata"]["creationTimestamp"],
            "2026-11-21T13:00:05Z");
  EXPECT_THROW(client.create(res::kPods, "ns", pod("p")), kube::AlreadyExistsError);
  client.before_create = [](const kube::Resource&, const json&) {
    throw kube::InvalidError(403, "exceeded quota");
  };
  EXPECT_THROW(client.create(res::kPods, "ns", pod("q")), kube::InvalidError);
  EXPECT_FALSE(client.has(res::kPods, "ns", "q"));
  EXPECT_EQ(client.writes_of("create", "pods"), 2) << "a refused create is not made";
  client.put(res::kPods, client.get(res::kPods, "ns", "p"));  // a kubelet's write: not counted
  EXPECT_EQ(client.writes(), 2);
  client.reset_counts();
  EXPECT_EQ(client.writes(), 0);
}

TEST(StoreClientTest, GracefulPodDeletionLeavesThePodTerminatingUntilErasedOrForced) {
  StoreClient client;
  client.graceful_pod_deletion = true;
  client.create(res::kPods, "ns", pod("a"));
  client.create(res::kPods, "ns", pod("b"));
  client.remove(res::kPods, "ns", "a", {});
  ASSERT_TRUE(client.has(res::kPods, "ns", "a"));
  EXPECT_EQ(client.get(res::kPods, "ns", "a")["metadata"]["deletionTimestamp"], client.now_text);
  client.erase(res::kPods, "ns", "a");  // the kubelet confirms
  EXPECT_FALSE(client.has(res::kPods, "ns", "a"));

  // A pod a test marked Terminating by hand (no grace period recorded) goes on a force delete.
  json b = client.get(res::kPods, "ns", "b");
  b["metadata"]["deletionTimestamp"] = client.now_text;
  client.put(res::kPods, b);
  kube::DeleteOptions force;
  force.grace_period_seconds = 0;
  client.remove(res::kPods, "ns", "b", force);
  EXPECT_FALSE(client.has(res::kPods, "ns", "b"));
  EXPECT_EQ(client.writes_of("delete", "pods"), 2);
}

}  // namespace
}  // namespace longhaul::fakeapi
