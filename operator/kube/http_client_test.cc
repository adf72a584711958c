// HttpClient against a scripted HTTP server: request format, error mapping, retries, limiter,
// watch streaming.
#include "longhaul/kube/http_client.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/testing/temp_dir.h"
#include "test_http_server.h"

namespace longhaul::kube {
namespace {

using testing::LineChannel;
using testing::Request;
using testing::ResponseWriter;
using testing::TestHttpServer;
using testing::wait_until;
using namespace std::chrono_literals;

HttpClientOptions fast_options() {
  HttpClientOptions options;
  options.qps = 0;  // unlimited unless a test is about the limiter
  options.initial_backoff = 1ms;
  options.max_backoff = 5ms;
  options.retry_budget = 2000ms;
  return options;
}

std::shared_ptr<HttpClient> client_for(const TestHttpServer& server,
                                       HttpClientOptions options = fast_options(),
                                       std::shared_ptr<TokenSource> tokens = nullptr) {
  CpprestTransportOptions transport;
  transport.server = server.url();
  transport.request_timeout = 10s;
  return std::make_shared<HttpClient>(std::make_shared<CpprestTransport>(transport),
                                      tokens ? tokens : std::make_shared<TokenSource>("tok", ""),
                                      std::move(options));
}

std::string status_body(int code, const std::string& reason, const std::string& message) {
  return json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
              {"code", code},     {"reason", reason},   {"message", message}}
      .dump();
}

json pod(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "ns"}, {"resourceVersion", "5"}}}};
}

// Answers every request with 200 and echoes the body (or {} when empty).
void echo(const Request& request, ResponseWriter& writer) {
  writer.send(200, request.body.empty() ? "{}" : request.body);
}

TEST(HttpClientTest, WritesUseKubernetesPathsContentTypesAndHeaders) {
  TestHttpServer server(echo);
  auto client = client_for(server);
  client->get(resources::kPods, "ns", "p-0");
  client->create(resources::kPods, "ns", pod("p-0"));
  client->update(resources::kPods, "ns", pod("p-0"));
  client->update_status(resources::kTrainingJobs, "ns", pod("j"));
  client->patch(resources::kPods, "ns", "p-0", {{"metadata", {{"labels", {{"a", "b"}}}}}},
                PatchType::kMerge);
  client->patch(resources::kPods, "ns", "p-0", json::object(), PatchType::kStrategicMerge);
  client->patch(resources::kTrainingJobs, "ns", "j", json::array(), PatchType::kJson, true);
  client->get(resources::kLeases, "kube-system", "lease");

  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 8u);
  struct Expected {
    const char* method;
    const char* path;
    const char* content_type;
  };
  const Expected expected[] = {
      {"GET", "/api/v1/namespaces/ns/pods/p-0", ""},
      {"POST", "/api/v1/namespaces/ns/pods", "application/json"},
      {"PUT", "/api/v1/namespaces/ns/pods/p-0", "application/json"},
      {"PUT", "/apis/longhaul.dev/v1alpha1/namespaces/ns/trainingjobs/j/status",
       "application/json"},
      {"PATCH", "/api/v1/namespaces/ns/pods/p-0", "application/merge-patch+json"},
      {"PATCH", "/api/v1/namespaces/ns/pods/p-0", "application/strategic-merge-patch+json"},
      {"PATCH", "/apis/longhaul.dev/v1alpha1/namespaces/ns/trainingjobs/j/status",
       "application/json-patch+json"},
      {"GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/lease", ""},
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(requests[i].method, expected[i].method);
    EXPECT_EQ(requests[i].path, expected[i].path);
    EXPECT_EQ(requests[i].header("Content-Type"), expected[i].content_type);
    EXPECT_EQ(requests[i].header("Accept"), "application/json");
    EXPECT_EQ(requests[i].header("Authorization"), "Bearer tok");
    EXPECT_EQ(requests[i].header("User-Agent").rfind("longhaul-operator/", 0), 0u);
  }
  EXPECT_EQ(json::parse(requests[1].body), pod("p-0"));
  EXPECT_EQ(json::parse(requests[4].body)["metadata"]["labels"]["a"], "b");
}

TEST(HttpClientTest, DeleteSendsDeleteOptionsBody) {
  TestHttpServer server(echo);
  auto client = client_for(server);
  DeleteOptions opts;
  opts.grace_period_seconds = 0;
  opts.precondition_uid = "uid-1";
  opts.precondition_resource_version = "42";
  opts.propagation_policy = "Foreground";
  client->remove(resources::kPods, "ns", "p-0", opts);
  client->remove(resources::kServices, "ns", "svc");
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].method, "DELETE");
  EXPECT_EQ(requests[0].path, "/api/v1/namespaces/ns/pods/p-0");
  EXPECT_EQ(requests[0].header("Content-Type"), "application/json");
  EXPECT_EQ(json::parse(requests[0].body),
            json::parse(R"({"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0,
                 "preconditions":{"uid":"uid-1","resourceVersion":"42"},
                 "propagationPolicy":"Foreground"})"));
  EXPECT_EQ(json::parse(requests[1].body),
            json::parse(R"({"kind":"DeleteOptions","apiVersion":"v1"})"));
}

TEST(HttpClientTest, ListEncodesQueryAndFollowsContinue) {
  TestHttpServer server([](const Request& request, ResponseWriter& writer) {
    auto params = request.params();
    if (params.count("continue") == 0) {
      writer.send(200, R"({"kind":"PodList","metadata":{"resourceVersion":"10","continue":"c1"},
                           "items":[{"metadata":{"name":"a"}}]})");
    } else {
      writer.send(200, R"({"kind":"PodList","metadata":{"resourceVersion":"10"},
                           "items":[{"metadata":{"name":"b"}}]})");
    }
  });
  auto client = client_for(server);
  ListOptions opts;
  opts.label_selector = "app in (a,b),tier!=db";
  opts.field_selector = "status.phase=Running";
  opts.limit = 1;
  json list = client->list(resources::kPods, "", opts);
  ASSERT_EQ(list["items"].size(), 2u);
  EXPECT_EQ(list["items"][1]["metadata"]["name"], "b");
  EXPECT_EQ(list["metadata"]["resourceVersion"], "10");
  EXPECT_FALSE(list["metadata"].contains("continue"));

  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].path, "/api/v1/pods");
  EXPECT_EQ(requests[0].query,
            "labelSelector=app%20in%20%28a%2Cb%29%2Ctier%21%3Ddb&fieldSelector=status.phase%"
            "3DRunning&limit=1");
  EXPECT_EQ(requests[1].params()["continue"], "c1");
  EXPECT_EQ(requests[1].params()["labelSelector"], "app in (a,b),tier!=db");
}

struct ErrorCase {
  const char* name;
  int status;
  const char* reason;
  std::function<void(const ApiError&)> check;
};

class ErrorMappingTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ErrorMappingTest, StatusBecomesTypedError) {
  const ErrorCase& c = GetParam();
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    writer.send(c.status, status_body(c.status, c.reason, "pods \"p-0\" says no"));
  });
  auto client = client_for(server);
  try {
    client->get(resources::kPods, "ns", "p-0");
    FAIL() << "expected an ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.http_status(), c.status);
    EXPECT_NE(std::string(e.what()).find("pods \"p-0\" says no"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ns/p-0"), std::string::npos) << e.what();
    c.check(e);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Statuses, ErrorMappingTest,
    ::testing::Values(ErrorCase{"NotFound", 404, "NotFound",
                                [](const ApiError& e) {
                                  EXPECT_NE(dynamic_cast<const NotFoundError*>(&e), nullptr);
                                  EXPECT_EQ(e.code(), Code::kNotFound);
                                }},
                      ErrorCase{"AlreadyExists", 409, "AlreadyExists",
                                [](const ApiError& e) {
                                  EXPECT_NE(dynamic_cast<const AlreadyExistsError*>(&e), nullptr);
                                }},
                      ErrorCase{"Conflict", 409, "Conflict",
                                [](const ApiError& e) {
                                  EXPECT_NE(dynamic_cast<const ConflictError*>(&e), nullptr);
                                }},
                      ErrorCase{"Gone", 410, "Expired",
                                [](const ApiError& e) {
                                  EXPECT_NE(dynamic_cast<const GoneError*>(&e), nullptr);
                                }},
                      ErrorCase{"Invalid", 422, "Invalid",
                                [](const ApiError& e) {
                                  EXPECT_NE(dynamic_cast<const InvalidError*>(&e), nullptr);
                                }},
                      ErrorCase{"Forbidden", 403, "Forbidden",
                                [](const ApiError& e) {
                                  EXPECT_EQ(e.code(), Code::kPermissionDenied);
                                  EXPECT_EQ(e.reason(), "Forbidden");
                                }}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(HttpClientTest, RetriesServerErrorsThenSucceeds) {
  std::atomic<int> calls{0};
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    if (calls.fetch_add(1) < 2) {
      writer.send(503, status_body(503, "ServiceUnavailable", "etcd is sad"));
    } else {
      writer.send(200, pod("p-0").dump());
    }
  });
  std::mutex mu;
  std::vector<std::string> codes;
  HttpClientOptions options = fast_options();
  options.observer = [&](const RequestObservation& o) {
    std::lock_guard<std::mutex> lock(mu);
    codes.push_back(o.verb + " " + o.code);
  };
  auto client = client_for(server, options);
  EXPECT_EQ(client->get(resources::kPods, "ns", "p-0")["metadata"]["name"], "p-0");
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(codes, (std::vector<std::string>{"get 503", "get 503", "get 200"}));
}

TEST(HttpClientTest, HonoursRetryAfterOn429) {
  std::atomic<int> calls{0};
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    if (calls.fetch_add(1) == 0) {
      writer.send(429, status_body(429, "TooManyRequests", "slow down"), {{"Retry-After", "1"}});
    } else {
      writer.send(201, pod("p-0").dump());
    }
  });
  auto client = client_for(server);  // own backoff is 1-5 ms: only Retry-After explains a wait
  const auto start = std::chrono::steady_clock::now();
  client->create(resources::kPods, "ns", pod("p-0"));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 950ms);
  EXPECT_EQ(calls.load(), 2);
}

TEST(HttpClientTest, GivesUpWithUnavailableWhenRetriesAreSpent) {
  std::atomic<int> calls{0};
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    calls.fetch_add(1);
    writer.send(500, status_body(500, "InternalError", "boom"));
  });
  HttpClientOptions options = fast_options();
  options.max_retries = 3;
  auto client = client_for(server, options);
  try {
    client->get(resources::kPods, "ns", "p-0");
    FAIL() << "expected Unavailable";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 attempts"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls.load(), 4);
}

TEST(HttpClientTest, RetryAfterBeyondTheBudgetFailsAtOnce) {
  std::atomic<int> calls{0};
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    calls.fetch_add(1);
    writer.send(429, status_body(429, "TooManyRequests", "later"), {{"Retry-After", "60"}});
  });
  HttpClientOptions options = fast_options();
  options.retry_budget = 100ms;
  auto client = client_for(server, options);
  EXPECT_THROW(client->get(resources::kPods, "ns", "p-0"), Unavailable);
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpClientTest, NetworkFailureIsUnavailable) {
  int port;
  {
    TestHttpServer server(echo);
    port = server.port();
  }  // closed: nothing listens on the port any more
  CpprestTransportOptions transport;
  transport.server = "http://127.0.0.1:" + std::to_string(port);
  HttpClientOptions options = fast_options();
  options.max_retries = 1;
  std::vector<std::string> codes;
  options.observer = [&](const RequestObservation& o) { codes.push_back(o.code); };
  HttpClient client(std::make_shared<CpprestTransport>(transport), nullptr, options);
  EXPECT_THROW(client.get(resources::kPods, "ns", "p-0"), Unavailable);
  EXPECT_EQ(codes, (std::vector<std::string>{"<error>", "<error>"}));
  // A create is not blindly re-sent after a network failure.
  codes.clear();
  EXPECT_THROW(client.create(resources::kPods, "ns", pod("x")), Unavailable);
  EXPECT_EQ(codes.size(), 1u);
}

TEST(HttpClientTest, RotatedTokenIsUsedAfter401) {
  namespace fs = std::filesystem;
  const longhaul::testing::TempDir temp("kube_token");
  const std::string dir = temp.path().string();
  std::string token_file = dir + "/token";
  std::ofstream(token_file) << "old";
  TestHttpServer server([](const Request& request, ResponseWriter& writer) {
    if (request.header("Authorization") == "Bearer new") {
      writer.send(200, "{}");
    } else {
      writer.send(401, status_body(401, "Unauthorized", "token expired"));
    }
  });
  auto tokens = std::make_shared<TokenSource>("", token_file);
  auto client = client_for(server, fast_options(), tokens);
  EXPECT_THROW(client->get(resources::kPods, "ns", "p"), ApiError);
  std::ofstream(dir + "/token.new") << "new";
  fs::rename(dir + "/token.new", token_file);
  EXPECT_NO_THROW(client->get(resources::kPods, "ns", "p"));
}

TEST(TokenBucketTest, BurstThenQps) {
  TokenBucket bucket(10, 3);  // 10 per second, burst 3
  const auto t0 = TokenBucket::Clock::now() + 1s;
  EXPECT_EQ(bucket.reserve(t0), TokenBucket::Clock::duration::zero());
  EXPECT_EQ(bucket.reserve(t0), TokenBucket::Clock::duration::zero());
  EXPECT_EQ(bucket.reserve(t0), TokenBucket::Clock::duration::zero());
  // The bucket is empty: callers queue 100 ms apart.
  EXPECT_NEAR(std::chrono::duration<double>(bucket.reserve(t0)).count(), 0.1, 1e-6);
  EXPECT_NEAR(std::chrono::duration<double>(bucket.reserve(t0)).count(), 0.2, 1e-6);
  // Half a second later the debt is repaid and three tokens have accrued (capped at burst).
  EXPECT_EQ(bucket.reserve(t0 + 1500ms), TokenBucket::Clock::duration::zero());
}

TEST(HttpClientTest, QpsLimiterSpacesRequests) {
  TestHttpServer server(echo);
  HttpClientOptions options = fast_options();
  options.qps = 20;
  options.burst = 2;
  auto client = client_for(server, options);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) client->get(resources::kPods, "ns", "p");
  // 2 from the burst, then 4 at 50 ms each.
  EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms);
}

// ---- watch ----

std::string event_line(const std::string& type, const json& object) {
  return json{{"type", type}, {"object", object}}.dump() + "\n";
}

// A watch endpoint that streams what the test puts into `lines`, one chunk each, and ends the
// response once `lines` is closed.
auto stream_lines(LineChannel& lines) {
  return [&lines](const Request&, ResponseWriter& writer) {
    writer.start_stream(200);
    while (auto line = lines.pop(writer)) {
      if (!writer.write_chunk(*line)) return;
    }
    writer.end_stream();
  };
}

TEST(HttpClientWatchTest, StreamsEventsAsTheyArrive) {
  LineChannel lines;
  TestHttpServer server(stream_lines(lines));
  auto client = client_for(server);
  ListOptions opts;
  opts.resource_version = "7";
  opts.timeout_seconds = 30;
  opts.label_selector = "longhaul.dev/job-name=j";
  auto stream = client->watch(resources::kPods, "ns", opts);
  // Each event is delivered before the next one is even sent.
  lines.push(event_line("ADDED", pod("a")));
  auto e1 = stream->next();
  ASSERT_TRUE(e1);
  EXPECT_EQ(e1->type, WatchEvent::Type::kAdded);
  EXPECT_EQ(e1->object["metadata"]["name"], "a");
  auto request = server.requests().at(0);
  EXPECT_EQ(request.path, "/api/v1/namespaces/ns/pods");
  auto params = request.params();
  EXPECT_EQ(params["watch"], "true");
  EXPECT_EQ(params["allowWatchBookmarks"], "true");
  EXPECT_EQ(params["resourceVersion"], "7");
  EXPECT_EQ(params["timeoutSeconds"], "30");
  EXPECT_EQ(params["labelSelector"], "longhaul.dev/job-name=j");

  // Two events in one chunk and one split across chunks.
  std::string modified = event_line("MODIFIED", pod("a"));
  lines.push(event_line("BOOKMARK", {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "9"}}}}) +
             modified.substr(0, 10));
  lines.push(modified.substr(10));
  auto e2 = stream->next();
  ASSERT_TRUE(e2);
  EXPECT_EQ(e2->type, WatchEvent::Type::kBookmark);
  EXPECT_EQ(e2->object["metadata"]["resourceVersion"], "9");
  auto e3 = stream->next();
  ASSERT_TRUE(e3);
  EXPECT_EQ(e3->type, WatchEvent::Type::kModified);
  lines.push(event_line("ERROR", json::parse(status_body(410, "Expired", "too old"))));
  auto e4 = stream->next();
  ASSERT_TRUE(e4);
  EXPECT_EQ(e4->type, WatchEvent::Type::kError);
  EXPECT_EQ(e4->object["code"], 410);
  lines.push(event_line("DELETED", pod("a")));
  auto e5 = stream->next();
  ASSERT_TRUE(e5);
  EXPECT_EQ(e5->type, WatchEvent::Type::kDeleted);
  lines.close();  // the server ends the response
  EXPECT_FALSE(stream->next());
}

// Lines are cut from whatever chunks arrive: a large event in many chunks, CRLF endings, blank
// keep-alive lines, and a last event without its newline when the server ends the response.
TEST(HttpClientWatchTest, CutsLinesFromAnyChunking) {
  LineChannel lines;
  TestHttpServer server(stream_lines(lines));
  auto client = client_for(server);
  auto stream = client->watch(resources::kPods, "ns", ListOptions{});
  json big = pod("big");
  big["metadata"]["annotations"] = {{"x", std::string(300000, 'y')}};
  const std::string big_line = event_line("ADDED", big);
  for (size_t at = 0; at < big_line.size(); at += 7000) lines.push(big_line.substr(at, 7000));
  auto e1 = stream->next();
  ASSERT_TRUE(e1);
  EXPECT_EQ(e1->object, big);
  std::string crlf = event_line("MODIFIED", pod("a"));
  crlf.insert(crlf.size() - 1, "\r");
  lines.push("\r\n\n" + crlf + event_line("DELETED", pod("a")).substr(0, 20));
  std::string rest = event_line("DELETED", pod("a")).substr(20);
  rest.pop_back();  // no newline after the last event
  lines.push(rest);
  lines.close();
  auto e2 = stream->next();
  ASSERT_TRUE(e2);
  EXPECT_EQ(e2->type, WatchEvent::Type::kModified);
  auto e3 = stream->next();
  ASSERT_TRUE(e3);
  EXPECT_EQ(e3->type, WatchEvent::Type::kDeleted);
  EXPECT_EQ(e3->object["metadata"]["name"], "a");
  EXPECT_FALSE(stream->next());
}

TEST(HttpClientWatchTest, StopUnblocksNextPromptly) {
  LineChannel lines;  // never written: the server stays silent
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    writer.start_stream(200);
    while (auto line = lines.pop(writer)) writer.write_chunk(*line);
  });
  auto client = client_for(server);
  ListOptions opts;
  opts.timeout_seconds = 600;  // the inactivity timeout is longer still
  auto stream = client->watch(resources::kPods, "", opts);
  std::atomic<bool> returned{false};
  std::optional<WatchEvent> result;
  std::thread reader([&] {
    result = stream->next();
    returned = true;
  });
  EXPECT_FALSE(wait_until([&] { return returned.load(); }, 100ms));  // really blocked
  stream->stop();
  EXPECT_TRUE(wait_until([&] { return returned.load(); }, 5000ms));
  reader.join();
  EXPECT_FALSE(result);
}

TEST(HttpClientWatchTest, GoneAtOpenThrowsGoneError) {
  TestHttpServer server([](const Request&, ResponseWriter& writer) {
    writer.send(410, status_body(410, "Expired", "resourceVersion 3 is too old"));
  });
  auto client = client_for(server);
  ListOptions opts;
  opts.resource_version = "3";
  auto stream = client->watch(resources::kPods, "ns", opts);
  EXPECT_THROW(stream->next(), GoneError);
}

TEST(HttpClientWatchTest, StopAbortsAWatchWhoseAnswerHasNotArrived) {
  LineChannel never;  // the server accepts the request and never answers
  TestHttpServer server([&](const Request&, ResponseWriter& writer) {
    never.pop(writer);
    writer.drop();
  });
  auto client = client_for(server);
  ListOptions opts;
  opts.timeout_seconds = 600;
  auto stream = client->watch(resources::kPods, "", opts);
  std::atomic<bool> returned{false};
  std::optional<WatchEvent> result;
  std::thread reader([&] {
    result = stream->next();
    returned = true;
  });
  ASSERT_TRUE(server.wait_for_requests(1, 5000ms));
  EXPECT_FALSE(wait_until([&] { return returned.load(); }, 50ms));
  stream->stop();
  EXPECT_TRUE(wait_until([&] { return returned.load(); }, 5000ms));
  reader.join();
  EXPECT_FALSE(result);
}

}  // namespace
}  // namespace longhaul::kube
