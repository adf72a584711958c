// Leader election between electors sharing a Lease on a small in-test API server, and the
// Events recorder's aggregation, both over real HTTP.
#include "longhaul/kube/leader_election.h"

#include <map>
#include <regex>

#include <gtest/gtest.h>

#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/kube/events.h"
#include "longhaul/kube/http_client.h"
#include "test_http_server.h"

namespace longhaul::kube {
namespace {

using namespace std::chrono_literals;
using testing::Request;
using testing::ResponseWriter;
using testing::TestHttpServer;
using testing::wait_until;

// Objects by path with resourceVersion checks: GET, POST (create), PUT (compare-and-swap on
// metadata.resourceVersion), PATCH (merge patch). `failing` answers 500 to everything.
class MiniApi {
 public:
  MiniApi() : server_([this](const Request& r, ResponseWriter& w) { handle(r, w); }) {}

  std::shared_ptr<Client> client() {
    CpprestTransportOptions transport;
    transport.server = server_.url();
    HttpClientOptions options;
    options.qps = 0;
    options.max_retries = 0;  // a failing API is seen as failing at once
    return std::make_shared<HttpClient>(std::make_shared<CpprestTransport>(transport), nullptr,
                                        options);
  }
  std::optional<json> object(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(path);
    if (it == objects_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<json> under(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<json> out;
    for (const auto& [path, obj] : objects_) {
      if (path.rfind(prefix, 0) == 0) out.push_back(obj);
    }
    return out;
  }
  void remove(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.erase(path);
  }
  std::atomic<bool> failing{false};
  TestHttpServer& server() { return server_; }

 private:
  static std::string status(int code, const std::string& reason, const std::string& message) {
    return json{{"kind", "Status"}, {"code", code}, {"reason", reason}, {"message", message}}
        .dump();
  }
  void handle(const Request& r, ResponseWriter& w) {
    if (failing.load()) {
      w.send(500, status(500, "InternalError", "injected"));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (r.method == "GET") {
      auto it = objects_.find(r.path);
      if (it == objects_.end()) return w.send(404, status(404, "NotFound", r.path + " not found"));
      return w.send(200, it->second.dump());
    }
    json body = r.body.empty() ? json::object() : json::parse(r.body);
    if (r.method == "POST") {
      std::string path = r.path + "/" + body["metadata"]["name"].get<std::string>();
      if (objects_.count(path)) return w.send(409, status(409, "AlreadyExists", "exists"));
      body["metadata"]["resourceVersion"] = std::to_string(++rv_);
      body["metadata"]["uid"] = "uid-" + std::to_string(rv_);
      objects_[path] = body;
      return w.send(201, body.dump());
    }
    auto it = objects_.find(r.path);
    if (it == objects_.end()) return w.send(404, status(404, "NotFound", r.path + " not found"));
    if (r.method == "PUT") {
      if (body["metadata"].value("resourceVersion", "") !=
          it->second["metadata"]["resourceVersion"]) {
        return w.send(409, status(409, "Conflict", "the object has been modified"));
      }
      body["metadata"]["resourceVersion"] = std::to_string(++rv_);
      it->second = body;
      return w.send(200, body.dump());
    }
    if (r.method == "PATCH") {
      it->second.merge_patch(body);
      it->second["metadata"]["resourceVersion"] = std::to_string(++rv_);
      return w.send(200, it->second.dump());
    }
    w.send(405, status(405, "MethodNotAllowed", r.method));
  }

  std::mutex mu_;
  std::map<std::string, json> objects_;
  int rv_ = 100;
  TestHttpServer server_;
};

const char kLeasePath[] = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/longhaul-operator";

struct Candidate {
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::unique_ptr<LeaderElector> elector;
};

LeaderElectionConfig config_for(const std::string& identity, Candidate& c,
                                std::chrono::milliseconds lease = 1000ms) {
  LeaderElectionConfig config;
  config.lease_namespace = "sys";
  config.lease_name = "longhaul-operator";
  config.identity = identity;
  config.lease_duration = lease;
  // 40% of the lease (400 ms for the default 1 s): a loaded machine can hold a renewal past a
  // fixed 400 ms, which would make a test with a long lease lose and retake leadership.
  config.renew_deadline = lease * 2 / 5;
  config.retry_period = 50ms;
  config.on_started_leading = [&c] { c.started.fetch_add(1); };
  config.on_stopped_leading = [&c] { c.stopped.fetch_add(1); };
  return config;
}

TEST(LeaderElectionTest, OneLeadsAndReleasingHandsOverAtOnce) {
  MiniApi api;
  Candidate a, b;
  // A lease far longer than the test's patience: only an explicit release can hand over in time.
  a.elector = std::make_unique<LeaderElector>(api.client(), config_for("a", a, 30000ms));
  b.elector = std::make_unique<LeaderElector>(api.client(), config_for("b", b, 30000ms));
  a.elector->start();
  b.elector->start();
  ASSERT_TRUE(wait_until([&] { return a.elector->is_leader() || b.elector->is_leader(); }));
  Candidate& leader = a.elector->is_leader() ? a : b;
  Candidate& follower = a.elector->is_leader() ? b : a;
  // The follower stays a follower through many retry periods.
  EXPECT_FALSE(wait_until([&] { return follower.elector->is_leader(); }, 500ms));
  EXPECT_EQ(follower.elector->leader(), leader.elector->identity());
  auto lease = api.object(kLeasePath);
  ASSERT_TRUE(lease);
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], leader.elector->identity());
  EXPECT_EQ((*lease)["spec"]["leaseDurationSeconds"], 30);
  std::regex micro_time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  EXPECT_TRUE(std::regex_match((*lease)["spec"]["renewTime"].get<std::string>(), micro_time));
  EXPECT_TRUE(std::regex_match((*lease)["spec"]["acquireTime"].get<std::string>(), micro_time));

  leader.elector->stop();  // graceful shutdown releases the lease
  EXPECT_EQ(leader.stopped.load(), 1);
  EXPECT_TRUE(wait_until([&] { return follower.elector->is_leader(); }, 5000ms));
  EXPECT_TRUE(wait_until([&] { return follower.started.load() == 1; }));
  lease = api.object(kLeasePath);
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], follower.elector->identity());
  EXPECT_EQ((*lease)["spec"]["leaseTransitions"], 1);
  follower.elector->stop();
}

TEST(LeaderElectionTest, DeadLeaderIsReplacedWhenItsLeaseExpires) {
  MiniApi api;
  Candidate a, b;
  auto dying = config_for("a", a);
  dying.release_on_stop = false;  // a crash: nobody clears the holder
  a.elector = std::make_unique<LeaderElector>(api.client(), dying);
  a.elector->start();
  ASSERT_TRUE(wait_until([&] { return a.elector->is_leader(); }));
  std::vector<std::string> seen;
  std::mutex mu;
  auto config_b = config_for("b", b);
  config_b.on_new_leader = [&](const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(id);
  };
  b.elector = std::make_unique<LeaderElector>(api.client(), config_b);
  b.elector->start();
  ASSERT_TRUE(wait_until([&] { return b.elector->leader() == "a"; }));
  a.elector->stop();
  const auto died = std::chrono::steady_clock::now();
  EXPECT_EQ((*api.object(kLeasePath))["spec"]["holderIdentity"], "a");
  ASSERT_TRUE(wait_until([&] { return b.elector->is_leader(); }, 5000ms));
  // Not before the lease (1 s) ran out on b's own clock.
  EXPECT_GE(std::chrono::steady_clock::now() - died, 900ms);
  EXPECT_EQ((*api.object(kLeasePath))["spec"]["leaseTransitions"], 1);
  b.elector->stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
}

TEST(LeaderElectionTest, StopsLeadingWhenRenewalsFailPastTheDeadline) {
  MiniApi api;
  Candidate a;
  a.elector = std::make_unique<LeaderElector>(api.client(), config_for("a", a));
  a.elector->start();
  ASSERT_TRUE(wait_until([&] { return a.elector->is_leader(); }));
  api.failing = true;  // the API server becomes unreachable for the leader
  ASSERT_TRUE(wait_until([&] { return a.stopped.load() == 1; }, 5000ms));
  EXPECT_FALSE(a.elector->is_leader());
  api.failing = false;  // it comes back: campaign again and win
  EXPECT_TRUE(wait_until([&] { return a.started.load() == 2; }, 5000ms));
  EXPECT_TRUE(a.elector->is_leader());
  a.elector->stop();
}

TEST(LeaderElectionTest, RejectsInconsistentDurations) {
  LeaderElectionConfig config;
  config.lease_namespace = "sys";
  config.lease_name = "x";
  config.renew_deadline = config.lease_duration;
  EXPECT_THROW(LeaderElector(nullptr, config), InvalidArgument);
}

json training_job() {
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata",
           {{"name", "gpt"}, {"namespace", "ml"}, {"uid", "uid-j"}, {"resourceVersion", "7"}}}};
}

TEST(EventRecorderTest, CreatesEventsAndAggregatesRepeats) {
  MiniApi api;
  EventRecorderOptions options;
  options.reporting_instance = "operator-0";
  EventRecorder recorder(api.client(), options);
  recorder.normal(training_job(), "Created", "created pod gpt-worker-0");
  recorder.normal(training_job(), "Created", "created pod gpt-worker-0");
  recorder.normal(training_job(), "Created", "created pod gpt-worker-0");
  recorder.warning(training_job(), "Restarting", "pod gpt-worker-0 was preempted");

  auto events = api.under("/api/v1/namespaces/ml/events/");
  ASSERT_EQ(events.size(), 2u);
  const json& created = events[0]["reason"] == "Created" ? events[0] : events[1];
  const json& warning = events[0]["reason"] == "Created" ? events[1] : events[0];
  EXPECT_EQ(created["count"], 3);
  EXPECT_EQ(created["type"], "Normal");
  EXPECT_EQ(created["involvedObject"],
            json::parse(R"({"kind":"TrainingJob","apiVersion":"longhaul.dev/v1alpha1",
                "name":"gpt","namespace":"ml","uid":"uid-j","resourceVersion":"7"})"));
  EXPECT_EQ(created["source"]["component"], "longhaul-operator");
  EXPECT_EQ(created["reportingComponent"], "longhaul-operator");
  EXPECT_EQ(created["reportingInstance"], "operator-0");
  std::regex time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)");
  EXPECT_TRUE(std::regex_match(created["firstTimestamp"].get<std::string>(), time));
  EXPECT_TRUE(std::regex_match(created["lastTimestamp"].get<std::string>(), time));
  EXPECT_EQ(warning["type"], "Warning");
  EXPECT_EQ(warning["count"], 1);
  EXPECT_EQ(warning["message"], "pod gpt-worker-0 was preempted");
  // Only the first of three identical events was a create.
  int creates = 0;
  for (const auto& r : api.server().requests()) creates += r.method == "POST";
  EXPECT_EQ(creates, 2);
}

TEST(EventRecorderTest, RecreatesAnExpiredEventAndNeverThrows) {
  MiniApi api;
  EventRecorder recorder(api.client());
  recorder.normal(training_job(), "Suspended", "suspended");
  auto events = api.under("/api/v1/namespaces/ml/events/");
  ASSERT_EQ(events.size(), 1u);
  api.remove("/api/v1/namespaces/ml/events/" + events[0]["metadata"]["name"].get<std::string>());
  recorder.normal(training_job(), "Suspended", "suspended");
  events = api.under("/api/v1/namespaces/ml/events/");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["count"], 1);
  api.failing = true;
  EXPECT_NO_THROW(recorder.warning(training_job(), "Failed", "API down"));
}

}  // namespace
}  // namespace longhaul::kube
