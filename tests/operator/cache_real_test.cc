// The operator's informer caches drop metadata.managedFields (and for pods, Services and claims
// more), and the reconciler writes a job's status from its cached copy. On the REAL API server
// that write must keep what the job holds: the annotation `kubectl apply` needs for its next
// three-way merge, and every writer's field ownership (the server keeps managedFields that a
// write omits; a PUT that omits kubectl's annotation, even to /status, takes its creator's
// ownership of it away, which is why the job cache keeps the annotation).
#include <set>

#include <gtest/gtest.h>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/controller.h"
#include "longhaul/envtest/gtest.h"
#include "scenario.h"

namespace longhaul::envtest {
namespace {

using namespace std::chrono_literals;
namespace res = kube::resources;

constexpr const char* kLastApplied = "kubectl.kubernetes.io/last-applied-configuration";

// manager/operation/subresource -> fieldsV1, per managedFields entry.
std::map<std::string, json> field_owners(const json& object) {
  std::map<std::string, json> out;
  for (const json& e : object["metadata"].value("managedFields", json::array())) {
    out[e.value("manager", "") + "/" + e.value("operation", "") + "/" +
        e.value("subresource", "")] = e.value("fieldsV1", json());
  }
  return out;
}

class CachedObjectsRealTest : public RealServerTest {};

TEST_F(CachedObjectsRealTest, StatusWrittenFromTheCacheKeepsKubectlAnnotationAndFieldOwners) {
  const std::string ns = fresh_namespace();
  auto client = plane().admin_client();
  // As `kubectl apply` creates it: its own copy of the manifest in the annotation.
  json job = longhaul::testing::training_job_manifest(
      "applied", 1, {{"name", "trainer"}, {"image", "ghcr.io/longhaul-dev/longhaul-worker:0.1.0"}});
  job["metadata"]["namespace"] = ns;
  const std::string applied = job.dump();
  job["metadata"]["annotations"] = {{kLastApplied, applied}, {"team", "vision"}};
  client->create(res::kTrainingJobs, ns, job);
  const json created = client->get(res::kTrainingJobs, ns, "applied");
  const auto owners_before = field_owners(created);
  ASSERT_FALSE(owners_before.empty()) << created.dump();

  controller::ControllerOptions o;
  o.namespaces = {ns};
  o.workers = 1;
  o.watch_timeout = 60s;
  controller::Controller ctl(client, nullptr, o);
  ctl.start();
  ASSERT_TRUE(ctl.wait_for_sync(30s));
  ctl.start_workers();
  // The operator creates the pods and writes status (Pending, then counts of created pods).
  json after;
  ASSERT_TRUE(longhaul::testing::eventually_on_server(
      [&] {
        after = client->get(res::kTrainingJobs, ns, "applied");
        const json st = after.value("status", json::object());
        return !st.value("phase", std::string()).empty() && st.contains("conditions");
      },
      60s, 100ms))
      << after.dump();
  ctl.stop();

  EXPECT_EQ(after["metadata"]["annotations"][kLastApplied], applied);
  EXPECT_EQ(after["metadata"]["annotations"]["team"], "vision");
  const auto owners_after = field_owners(after);
  for (const auto& [owner, fields] : owners_before) {
    ASSERT_TRUE(owners_after.count(owner)) << owner << " lost its fields: " << after.dump();
    EXPECT_EQ(owners_after.at(owner), fields) << owner;
  }
  // The operator's status write is recorded beside them.
  bool status_owner = false;
  for (const auto& [owner, fields] : owners_after) {
    if (owner.ends_with("/status") && fields.contains("f:status")) status_owner = true;
  }
  EXPECT_TRUE(status_owner) << after.dump();
}

}  // namespace
}  // namespace longhaul::envtest
