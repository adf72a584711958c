// The operator's view of the cluster reads jobs from the informer cache, but never a version
// older than the operator's own last write of the job (JobVersions). A stopped informer stands
// for a cache that lags behind: its store keeps what it had.
#include "longhaul/controller/cluster_view.h"

#include <gtest/gtest.h>

#include "harness.h"

namespace longhaul::testing {
namespace {

using controller::InformerClusterView;
using controller::JobVersions;

json versioned(const std::string& name, const std::string& rv) {
  return {{"metadata", {{"namespace", "default"}, {"name", name}, {"resourceVersion", rv}}}};
}

TEST(JobVersions, AwaitsTheVersionSeenLastAndComparesVersionsForEqualityOnly) {
  JobVersions v;
  const json v7 = versioned("j", "7"), v8 = versioned("j", "8"), v10 = versioned("j", "10");
  EXPECT_TRUE(v.usable("default/j", &v7)) << "nothing written: the cache is used";
  EXPECT_FALSE(v.usable("default/j", nullptr)) << "not cached: read it from the API";
  v.saw(v8);
  EXPECT_FALSE(v.usable("default/j", &v7)) << "older than the operator's write";
  EXPECT_FALSE(v.usable("default/j", &v10)) << "another version: opaque, so read from the API";
  EXPECT_TRUE(v.usable("default/k", &v7)) << "other jobs are not affected";
  EXPECT_EQ(v.awaited(), 1u);
  EXPECT_TRUE(v.usable("default/j", &v8));
  EXPECT_EQ(v.awaited(), 0u) << "the cache caught up: nothing awaited any more";
  EXPECT_TRUE(v.usable("default/j", &v7)) << "(by then the cache only moves forward)";

  v.saw(v8);
  v.conflicted("default/j");
  EXPECT_FALSE(v.usable("default/j", &v8)) << "a 409 means the cached version is stale";
  v.forget("default/j");
  EXPECT_TRUE(v.usable("default/j", &v8));
}

class ClusterViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.start();
    client_ = make_client(server_);
    server_.create(kJobs, "default", job_manifest("j"));
    add_job_informer();
  }
  void add_job_informer() {
    kube::InformerOptions o;
    o.resource = kube::resources::kTrainingJobs;
    o.ns = "default";
    jobs_.push_back(std::make_unique<kube::Informer>(client_, o));
    jobs_.back()->start();
    ASSERT_TRUE(jobs_.back()->wait_for_sync(30s));
  }
  size_t job_gets() { return server_.count_requests({.verb = "get", .resource = kJobs}); }

  fakeapi::FakeApiServer server_{server_options()};
  std::shared_ptr<kube::HttpClient> client_;
  InformerClusterView::Informers jobs_, none_;
};

TEST_F(ClusterViewTest, ReadsTheJobFromTheCacheButNeverOlderThanTheOperatorsOwnWrite) {
  InformerClusterView view(*client_, jobs_, none_, none_);
  server_.clear_requests();
  EXPECT_EQ(view.get_job("default", "j")["metadata"]["name"], "j");
  EXPECT_EQ(job_gets(), 0u) << "a cached job costs no request";

  // The cache stops seeing changes, as a watch that lags; the operator writes the status.
  jobs_.back()->stop();
  json job = view.get_job("default", "j");
  job["status"] = {{"phase", "Running"}, {"restartAttempt", 3}};
  job = client_->update_status(kube::resources::kTrainingJobs, "default", job);
  view.wrote_job(job);

  for (int i = 0; i < 2; ++i) {
    const json read = view.get_job("default", "j");
    EXPECT_EQ(read["status"].value("restartAttempt", 0), 3)
        << "read " << i << " returned a status older than the operator's own write";
    EXPECT_EQ(read["metadata"]["resourceVersion"], job["metadata"]["resourceVersion"]);
  }
  EXPECT_EQ(job_gets(), 2u) << "while the cache lags, the job comes from the API";

  // A cache that caught up (a fresh informer here) serves the job again.
  jobs_.clear();
  add_job_informer();
  server_.clear_requests();
  EXPECT_EQ(view.get_job("default", "j")["status"].value("restartAttempt", 0), 3);
  EXPECT_EQ(view.get_job("default", "j")["status"].value("restartAttempt", 0), 3);
  EXPECT_EQ(job_gets(), 0u);
}

TEST_F(ClusterViewTest, AConflictedWriteMakesTheNextReadFresh) {
  InformerClusterView view(*client_, jobs_, none_, none_);
  jobs_.back()->stop();  // the cache misses the user's change below
  json edited = server_.get(kJobs, "default", "j");
  edited["spec"]["runPolicy"]["backoffLimit"] = 9;
  server_.update(kJobs, "default", edited);
  EXPECT_FALSE(view.get_job("default", "j")["spec"]["runPolicy"].contains("backoffLimit"))
      << "(the cache is stale, as intended by the test)";
  view.job_write_conflicted("default", "j");  // what the reconciler reports on a 409
  EXPECT_EQ(view.get_job("default", "j")["spec"]["runPolicy"].value("backoffLimit", 0), 9);
}

TEST_F(ClusterViewTest, AJobNotInTheCacheIsReadFromTheApiAndAGoneJobIsNotFound) {
  InformerClusterView view(*client_, jobs_, none_, none_);
  jobs_.back()->stop();
  server_.create(kJobs, "default", job_manifest("new"));
  EXPECT_EQ(view.get_job("default", "new")["metadata"]["name"], "new");
  EXPECT_THROW(view.get_job("default", "gone"), kube::NotFoundError);
}

}  // namespace
}  // namespace longhaul::testing
