// The real client stack against the project's fake API server (tests/fakeapi): TLS with the CA
// from a generated kubeconfig and a bearer token, Kubernetes write semantics, pagination,
// injected faults, informers across dropped watches and expired history, leader election and
// Events.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "longhaul/fakeapi/server.h"
#include "longhaul/kube/config.h"
#include "longhaul/kube/events.h"
#include "longhaul/kube/http_client.h"
#include "longhaul/kube/informer.h"
#include "longhaul/kube/leader_election.h"
#include "longhaul/testing/temp_dir.h"
#include "test_http_server.h"

namespace longhaul::kube {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;
namespace fs = std::filesystem;

HttpClientOptions fast_options() {
  HttpClientOptions o;
  o.qps = 0;
  o.initial_backoff = 5ms;
  o.max_backoff = 50ms;
  return o;
}

std::shared_ptr<HttpClient> plain_client(const fakeapi::FakeApiServer& server,
                                         HttpClientOptions options = fast_options()) {
  ClusterConfig config;
  config.server = server.url();
  return std::make_shared<HttpClient>(config, options);
}

json pod(const std::string& name, json labels = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"labels", labels}}},
          {"spec", {{"containers", json::array({{{"name", "c"}, {"image", "i"}}})}}}};
}

json training_job(const std::string& name) {
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec", {{"replicaSpecs", json::object()}}}};
}

TEST(FakeApiClientTest, KubeconfigWithTlsCaAndBearerToken) {
  fakeapi::Options options;
  options.tls.enabled = true;
  options.bearer_token = "s3cret";
  fakeapi::FakeApiServer server(options);
  server.start();
  longhaul::testing::TempDir dir("kube_fakeapi");
  server.write_kubeconfig(dir.path() / "kubeconfig", "team");
  ClusterConfig config = load_kubeconfig((dir.path() / "kubeconfig").string());
  EXPECT_EQ(config.default_namespace, "team");
  EXPECT_FALSE(config.tls.ca_pem.empty());
  HttpClient client(config, fast_options());
  client.create(resources::kPods, "team", pod("p-0"));
  EXPECT_EQ(client.get(resources::kPods, "team", "p-0")["metadata"]["namespace"], "team");

  // Without the cluster CA the server certificate is not trusted.
  ClusterConfig untrusted = config;
  untrusted.tls.ca_pem.clear();
  HttpClientOptions no_retry = fast_options();
  no_retry.max_retries = 0;
  HttpClient distrusting(untrusted, no_retry);
  EXPECT_THROW(distrusting.get(resources::kPods, "team", "p-0"), Unavailable);
  // Unless the kubeconfig explicitly says to skip verification.
  untrusted.tls.insecure_skip_tls_verify = true;
  HttpClient insecure(untrusted, no_retry);
  EXPECT_NO_THROW(insecure.get(resources::kPods, "team", "p-0"));
  // A wrong token is rejected with a PermissionDenied ApiError.
  ClusterConfig wrong_token = config;
  wrong_token.token = "nope";
  HttpClient unauthorized(wrong_token, no_retry);
  try {
    unauthorized.get(resources::kPods, "team", "p-0");
    FAIL() << "expected 401";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.http_status(), 401);
    EXPECT_EQ(e.code(), Code::kPermissionDenied);
  }
}

TEST(FakeApiClientTest, InClusterConfigFollowsTokenRotation) {
  fakeapi::Options options;
  options.tls.enabled = true;
  options.bearer_token = "rotated-token";
  fakeapi::FakeApiServer server(options);
  server.start();
  longhaul::testing::TempDir dir("kube_fakeapi");
  const fs::path token = dir.path() / "token";
  std::ofstream(token) << "expired-token\n";
  std::ofstream(dir.path() / "namespace") << "longhaul-system";
  ::setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", std::to_string(server.port()).c_str(), 1);
  ClusterConfig config = load_in_cluster_config(
      {token.string(), server.ca_file().string(), (dir.path() / "namespace").string()});
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  EXPECT_EQ(config.default_namespace, "longhaul-system");
  HttpClientOptions no_retry = fast_options();
  no_retry.max_retries = 0;
  HttpClient client(config, no_retry);  // TLS verified against ca.crt
  EXPECT_THROW(client.list(resources::kPods, "longhaul-system", {}), ApiError);
  // The kubelet rotates the projected token (atomic rename); the next request uses it.
  std::ofstream(dir.path() / "token.new") << "rotated-token\n";
  fs::rename(dir.path() / "token.new", token);
  EXPECT_NO_THROW(client.list(resources::kPods, "longhaul-system", {}));
}

TEST(FakeApiClientTest, WriteSemanticsAndErrorMapping) {
  fakeapi::FakeApiServer server;
  server.start();
  auto client = plain_client(server);
  const Resource& jobs = resources::kTrainingJobs;
  json created = client->create(jobs, "ns", training_job("j"));
  EXPECT_FALSE(created["metadata"]["uid"].get<std::string>().empty());
  EXPECT_THROW(client->create(jobs, "ns", training_job("j")), AlreadyExistsError);

  // Optimistic concurrency: a write with an old resourceVersion is a conflict.
  json stale = created;
  json fresh = created;
  fresh["spec"]["suspend"] = true;
  client->update(jobs, "ns", fresh);
  stale["spec"]["suspend"] = false;
  EXPECT_THROW(client->update(jobs, "ns", stale), ConflictError);

  // The status subresource takes only status.
  json current = client->get(jobs, "ns", "j");
  current["status"] = {{"phase", "Running"}};
  json with_status = client->update_status(jobs, "ns", current);
  EXPECT_EQ(with_status["status"]["phase"], "Running");
  json merged =
      client->patch(jobs, "ns", "j", {{"status", {{"restartCount", 2}}}}, PatchType::kMerge, true);
  EXPECT_EQ(merged["status"]["restartCount"], 2);
  EXPECT_EQ(merged["status"]["phase"], "Running");
  // JSON patch on the main resource; strategic merge is refused for custom resources.
  json patched = client->patch(
      jobs, "ns", "j",
      json::array({{{"op", "add"}, {"path", "/metadata/labels"}, {"value", {{"team", "a"}}}}}),
      PatchType::kJson);
  EXPECT_EQ(patched["metadata"]["labels"]["team"], "a");
  EXPECT_THROW(client->patch(jobs, "ns", "j", json::object(), PatchType::kStrategicMerge),
               ApiError);

  // Delete preconditions.
  DeleteOptions wrong_uid;
  wrong_uid.precondition_uid = "not-the-uid";
  EXPECT_THROW(client->remove(jobs, "ns", "j", wrong_uid), ConflictError);
  DeleteOptions right_uid;
  right_uid.precondition_uid = created["metadata"]["uid"].get<std::string>();
  right_uid.propagation_policy = "Background";
  client->remove(jobs, "ns", "j", right_uid);
  EXPECT_THROW(client->get(jobs, "ns", "j"), NotFoundError);

  EXPECT_EQ(server.count_requests({.verb = "patch", .resource = "trainingjobs.longhaul.dev"}), 3u);
}

TEST(FakeApiClientTest, ListFollowsPagesAndSelectors) {
  fakeapi::FakeApiServer server;
  server.start();
  for (int i = 0; i < 7; ++i) {
    server.create("pods", "ns", pod("p-" + std::to_string(i), {{"app", i % 2 ? "odd" : "even"}}));
  }
  auto client = plain_client(server);
  ListOptions opts;
  opts.limit = 3;
  json all = client->list(resources::kPods, "ns", opts);
  EXPECT_EQ(all["items"].size(), 7u);
  EXPECT_FALSE(all["metadata"]["resourceVersion"].get<std::string>().empty());
  EXPECT_EQ(server.count_requests({.verb = "list"}), 3u);
  opts.label_selector = "app in (odd)";
  EXPECT_EQ(client->list(resources::kPods, "ns", opts)["items"].size(), 3u);
  opts.label_selector = "app!=odd";
  EXPECT_EQ(client->list(resources::kPods, "", opts)["items"].size(), 4u);
}

TEST(FakeApiClientTest, RetriesInjectedFaultsAndGivesUpWhenTheyPersist) {
  fakeapi::FakeApiServer server;
  server.start();
  server.create("pods", "ns", pod("p"));
  std::mutex mu;
  std::vector<std::string> observed;
  HttpClientOptions options = fast_options();
  options.observer = [&](const RequestObservation& o) {
    std::lock_guard<std::mutex> lock(mu);
    observed.push_back(o.verb + " " + o.code);
  };
  auto client = plain_client(server, options);
  server.add_fault({.verb = "get", .status = 429, .retry_after_seconds = 1, .times = 1});
  server.add_fault({.verb = "get", .status = 503, .times = 1});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(client->get(resources::kPods, "ns", "p")["metadata"]["name"], "p");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 950ms);  // Retry-After honoured
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(observed, (std::vector<std::string>{"get 429", "get 503", "get 200"}));
  }
  server.clear_faults();
  server.add_fault({.verb = "list", .status = 500});
  options.max_retries = 2;
  auto impatient = plain_client(server, options);
  EXPECT_THROW(impatient->list(resources::kPods, "ns", {}), Unavailable);
  EXPECT_EQ(server.count_requests({.verb = "list", .injected = true}), 3u);
}

struct Events {
  std::mutex mu;
  std::vector<std::string> calls;
  ResourceEventHandlers handlers() {
    auto name = [](const json& o) { return o["metadata"]["name"].get<std::string>(); };
    return {[=, this](const json& o) { push("add " + name(o)); },
            [=, this](const json&, const json& o) { push("update " + name(o)); },
            [=, this](const json& o) { push("delete " + name(o)); }};
  }
  void push(std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back(std::move(s));
  }
  bool contains(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(calls.begin(), calls.end(), s) != calls.end();
  }
};

InformerOptions train_pods() {
  InformerOptions io;
  io.resource = resources::kPods;
  io.ns = "ns";
  io.label_selector = "app=train";
  io.initial_backoff = 5ms;
  io.max_backoff = 50ms;
  return io;
}

TEST(FakeApiInformerTest, FollowsChangesAcrossDroppedWatchesAndExpiredHistory) {
  fakeapi::FakeApiServer server;  // bookmarks only every minute: the informer's version stays put
  server.start();
  server.create("pods", "ns", pod("a", {{"app", "train"}}));
  server.create("pods", "ns", pod("other", {{"app", "serve"}}));
  Events events;
  Informer informer(plain_client(server), train_pods());
  informer.add_handlers(events.handlers());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  EXPECT_EQ(informer.store().keys(), (std::vector<std::string>{"ns/a"}));

  server.create("pods", "ns", pod("b", {{"app", "train"}}));
  server.patch("pods", "ns", "a", {{"metadata", {{"annotations", {{"x", "1"}}}}}});
  ASSERT_TRUE(wait_until([&] { return events.contains("add b") && events.contains("update a"); }));

  // A broken connection: the watch resumes from the last version, without a relist.
  server.drop_watches(fakeapi::DropMode::kAbort);
  server.remove("pods", "ns", "b", {.grace_period_seconds = 0});
  ASSERT_TRUE(wait_until([&] { return events.contains("delete b"); }));
  EXPECT_EQ(informer.list_count(), 1);

  // History gone: the resume gets 410 and the informer relists, catching up on what it missed.
  server.expire_history();
  server.drop_watches(fakeapi::DropMode::kGraceful);
  // (The fake API server, like the real one, sends the 410 as an ERROR event on the stream.)
  ASSERT_TRUE(wait_until([&] { return informer.list_count() == 2; }));
  server.create("pods", "ns", pod("c", {{"app", "train"}}));
  ASSERT_TRUE(wait_until([&] { return informer.store().get("ns", "c") != nullptr; }));
  EXPECT_TRUE(events.contains("add c"));
  informer.stop();
}

TEST(FakeApiInformerTest, BookmarksAdvanceTheResourceVersion) {
  fakeapi::Options options;
  options.bookmark_interval = 50ms;
  fakeapi::FakeApiServer server(options);
  server.start();
  Informer informer(plain_client(server), train_pods());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  // Changes the informer's selector does not see still move its version forward via bookmarks.
  server.create("pods", "ns", pod("unrelated", {{"app", "serve"}}));
  const std::string latest = std::to_string(server.resource_version());
  EXPECT_TRUE(wait_until([&] { return informer.resource_version() == latest; }));
  EXPECT_EQ(informer.store().size(), 0u);
  informer.stop();
}

TEST(FakeApiLeaderElectionTest, OneLeaderAndHandOverOnRelease) {
  fakeapi::FakeApiServer server;
  server.start();
  auto make = [&](const std::string& id, std::atomic<int>& started) {
    LeaderElectionConfig c;
    c.lease_namespace = "sys";
    c.lease_name = "longhaul-operator";
    c.identity = id;
    c.lease_duration = 30s;  // only a release hands over within the test
    c.renew_deadline = 400ms;
    c.retry_period = 50ms;
    c.on_started_leading = [&started] { started.fetch_add(1); };
    HttpClientOptions o = fast_options();
    o.retry_budget = 200ms;
    return std::make_unique<LeaderElector>(plain_client(server, o), c);
  };
  std::atomic<int> a_started{0}, b_started{0};
  auto a = make("a", a_started);
  auto b = make("b", b_started);
  a->start();
  ASSERT_TRUE(wait_until([&] { return a_started.load() == 1; }));
  b->start();
  EXPECT_FALSE(wait_until([&] { return b->is_leader(); }, 300ms));
  EXPECT_EQ(b->leader(), "a");
  a->stop();
  ASSERT_TRUE(wait_until([&] { return b_started.load() == 1; }, 5000ms));
  json lease = server.get("leases.coordination.k8s.io", "sys", "longhaul-operator");
  EXPECT_EQ(lease["spec"]["holderIdentity"], "b");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 1);
  b->stop();
}

TEST(FakeApiEventsTest, RepeatsPatchTheCount) {
  fakeapi::FakeApiServer server;
  server.start();
  auto client = plain_client(server);
  json job = client->create(resources::kTrainingJobs, "ns", training_job("j"));
  EventRecorder recorder(client);
  for (int i = 0; i < 3; ++i) recorder.warning(job, "PodPreempted", "pod j-worker-0 preempted");
  auto events = server.list("events", "ns");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["count"], 3);
  EXPECT_EQ(events[0]["involvedObject"]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(events[0]["type"], "Warning");
}

}  // namespace
}  // namespace longhaul::kube
