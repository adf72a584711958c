// Informer against a scripted API server: sync, events, bookmarks, relist after 410, resume
// after a dropped stream, prompt stop. Also the label selector the store filters with.
#include "longhaul/kube/informer.h"

#include <deque>

#include <gtest/gtest.h>

#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/kube/http_client.h"
#include "test_http_server.h"

namespace longhaul::kube {
namespace {

using namespace std::chrono_literals;
using testing::LineChannel;
using testing::Request;
using testing::ResponseWriter;
using testing::TestHttpServer;
using testing::wait_until;

json pod(const std::string& name, const std::string& rv, json labels = json::object(),
         const std::string& owner_uid = "") {
  json p = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", name}, {"namespace", "ns"}, {"resourceVersion", rv}, {"labels", labels}}}};
  if (!owner_uid.empty()) {
    p["metadata"]["ownerReferences"] = json::array({{{"apiVersion", "longhaul.dev/v1alpha1"},
                                                     {"kind", "TrainingJob"},
                                                     {"name", "j"},
                                                     {"uid", owner_uid},
                                                     {"controller", true}}});
  }
  return p;
}

json pod_list(const std::string& rv, const std::vector<json>& items) {
  return {{"kind", "PodList"},
          {"apiVersion", "v1"},
          {"metadata", {{"resourceVersion", rv}}},
          {"items", items}};
}

std::string event(const std::string& type, const json& object) {
  return json{{"type", type}, {"object", object}}.dump() + "\n";
}

// LIST answers come from `lists` in order (the last one repeats). Each WATCH takes the next
// script: lines to stream ("DROP" drops the connection), or a 410 at open. Watches
// beyond the scripts stay open and silent.
class ScriptedApi {
 public:
  ScriptedApi() : server_([this](const Request& r, ResponseWriter& w) { handle(r, w); }) {}

  void add_list(json list) {
    std::lock_guard<std::mutex> lock(mu_);
    lists_.push_back(std::move(list));
  }
  std::shared_ptr<LineChannel> add_watch() {
    auto channel = std::make_shared<LineChannel>();
    std::lock_guard<std::mutex> lock(mu_);
    watches_.push_back(channel);
    return channel;
  }
  // The next watch is answered 410 Gone at once.
  void add_gone_watch() {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.push_back(nullptr);
  }
  std::vector<Request> watch_requests() const {
    std::vector<Request> out;
    for (const auto& r : server_.requests()) {
      if (r.params().count("watch")) out.push_back(r);
    }
    return out;
  }
  std::shared_ptr<Client> client() {
    CpprestTransportOptions transport;
    transport.server = server_.url();
    HttpClientOptions options;
    options.qps = 0;
    return std::make_shared<HttpClient>(std::make_shared<CpprestTransport>(transport), nullptr,
                                        options);
  }
  TestHttpServer& server() { return server_; }

 private:
  void handle(const Request& request, ResponseWriter& writer) {
    if (!request.params().count("watch")) {
      std::lock_guard<std::mutex> lock(mu_);
      size_t i = std::min(list_calls_++, lists_.size() - 1);
      writer.send(200, lists_.at(i).dump());
      return;
    }
    std::shared_ptr<LineChannel> channel = std::make_shared<LineChannel>();  // silent
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (watch_calls_ < watches_.size()) channel = watches_[watch_calls_];
      ++watch_calls_;
    }
    if (!channel) {
      writer.send(410, R"({"kind":"Status","code":410,"reason":"Expired","message":"too old"})");
      return;
    }
    // Like the API server: headers at once, then events as they happen.
    writer.start_stream(200);
    while (auto line = channel->pop(writer)) {
      if (*line == "DROP") {
        writer.drop();
        return;
      }
      writer.write_chunk(*line);
    }
    writer.end_stream();
  }

  std::mutex mu_;
  std::vector<json> lists_;
  std::vector<std::shared_ptr<LineChannel>> watches_;
  size_t list_calls_ = 0;
  size_t watch_calls_ = 0;
  TestHttpServer server_;  // last: stopped first on destruction
};

// Records handler calls as strings: "add a", "update a 5->11", "delete b".
struct Recorder {
  std::mutex mu;
  std::vector<std::string> calls;
  ResourceEventHandlers handlers() {
    auto name = [](const json& o) { return o["metadata"]["name"].get<std::string>(); };
    auto rv = [](const json& o) { return o["metadata"]["resourceVersion"].get<std::string>(); };
    return {[=, this](const json& o) { push("add " + name(o)); },
            [=, this](const json& a, const json& b) {
              push("update " + name(b) + " " + rv(a) + "->" + rv(b));
            },
            [=, this](const json& o) { push("delete " + name(o)); }};
  }
  void push(std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back(std::move(s));
  }
  std::vector<std::string> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return calls;
  }
  bool wait_for(size_t n) {
    return wait_until([&] { return snapshot().size() >= n; });
  }
};

InformerOptions pod_options() {
  InformerOptions options;
  options.resource = resources::kPods;
  options.ns = "ns";
  options.label_selector = "app=train";
  options.initial_backoff = 5ms;
  options.max_backoff = 50ms;
  return options;
}

TEST(InformerTest, SyncsThenAppliesWatchEventsAndBookmarks) {
  ScriptedApi api;
  api.add_list(pod_list("10", {pod("a", "5", {{"app", "train"}, {"role", "chief"}}, "uid-j"),
                               pod("b", "6", {{"app", "train"}}, "uid-j")}));
  auto watch = api.add_watch();
  Recorder recorder;
  Informer informer(api.client(), pod_options());
  informer.add_handlers(recorder.handlers());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  EXPECT_EQ(informer.store().size(), 2u);
  EXPECT_EQ(recorder.snapshot(), (std::vector<std::string>{"add a", "add b"}));
  ASSERT_TRUE(wait_until([&] { return api.watch_requests().size() == 1; }));
  auto params = api.watch_requests()[0].params();
  EXPECT_EQ(params["resourceVersion"], "10");
  EXPECT_EQ(params["allowWatchBookmarks"], "true");
  EXPECT_EQ(params["labelSelector"], "app=train");
  EXPECT_EQ(api.server().requests()[0].params()["labelSelector"], "app=train");

  watch->push(event("MODIFIED", pod("a", "11", {{"app", "train"}, {"role", "chief"}}, "uid-j")));
  watch->push(event("DELETED", pod("b", "12", {{"app", "train"}}, "uid-j")));
  watch->push(event("ADDED", pod("c", "13", {{"app", "train"}})));
  watch->push(event("BOOKMARK", {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "20"}}}}));
  ASSERT_TRUE(recorder.wait_for(5));
  EXPECT_EQ(recorder.snapshot(),
            (std::vector<std::string>{"add a", "add b", "update a 5->11", "delete b", "add c"}));
  EXPECT_TRUE(wait_until([&] { return informer.resource_version() == "20"; }));

  const Store& store = informer.store();
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ((*store.get("ns", "a"))["metadata"]["resourceVersion"], "11");
  EXPECT_EQ(store.get("ns/b"), nullptr);
  auto owned = store.by_owner_uid("uid-j");
  ASSERT_EQ(owned.size(), 1u);
  EXPECT_EQ((*owned[0])["metadata"]["name"], "a");
  EXPECT_EQ(store.list("ns", LabelSelector::parse("role=chief")).size(), 1u);
  EXPECT_EQ(store.list("other", LabelSelector()).size(), 0u);
  informer.stop();
}

TEST(InformerTest, RelistsAfterGoneEventAndDeliversDifferences) {
  ScriptedApi api;
  api.add_list(pod_list("10", {pod("a", "5"), pod("b", "6")}));
  api.add_list(pod_list("30", {pod("a", "25"), pod("d", "26")}));
  auto first = api.add_watch();
  auto second = api.add_watch();
  Recorder recorder;
  Informer informer(api.client(), pod_options());
  informer.add_handlers(recorder.handlers());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  first->push(event("ERROR", {{"kind", "Status"},
                              {"code", 410},
                              {"reason", "Expired"},
                              {"message", "too old resource version"}}));
  ASSERT_TRUE(recorder.wait_for(5));
  EXPECT_EQ(recorder.snapshot(),
            (std::vector<std::string>{"add a", "add b", "update a 5->25", "add d", "delete b"}));
  EXPECT_EQ(informer.list_count(), 2);
  ASSERT_TRUE(wait_until([&] { return api.watch_requests().size() == 2; }));
  EXPECT_EQ(api.watch_requests()[1].params()["resourceVersion"], "30");
}

TEST(InformerTest, RelistsWhenWatchOpensWithGone) {
  ScriptedApi api;
  api.add_list(pod_list("10", {pod("a", "5")}));
  api.add_list(pod_list("40", {pod("a", "5")}));
  api.add_gone_watch();
  Informer informer(api.client(), pod_options());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  EXPECT_TRUE(wait_until([&] { return informer.list_count() == 2; }));
  EXPECT_TRUE(wait_until([&] { return informer.resource_version() == "40"; }));
}

TEST(InformerTest, ResumesFromLastVersionAfterDroppedStream) {
  ScriptedApi api;
  api.add_list(pod_list("10", {}));
  auto first = api.add_watch();
  auto second = api.add_watch();
  Recorder recorder;
  Informer informer(api.client(), pod_options());
  informer.add_handlers(recorder.handlers());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  first->push(event("ADDED", pod("a", "12")));
  // Drop only once the event was consumed: data still buffered when a connection breaks may be
  // lost (it is replayed by the resumed watch on a real server, not by this scripted one).
  ASSERT_TRUE(recorder.wait_for(1));
  first->push("DROP");
  ASSERT_TRUE(wait_until([&] { return api.watch_requests().size() == 2; }));
  EXPECT_EQ(api.watch_requests()[1].params()["resourceVersion"], "12");
  second->push(event("MODIFIED", pod("a", "13")));
  ASSERT_TRUE(recorder.wait_for(2));
  EXPECT_EQ(recorder.snapshot(), (std::vector<std::string>{"add a", "update a 12->13"}));
  EXPECT_EQ(informer.list_count(), 1);  // no relist needed
}

TEST(InformerTest, ResumesAfterServerEndsTheWatch) {
  ScriptedApi api;
  api.add_list(pod_list("10", {}));
  auto first = api.add_watch();
  first->push(event("BOOKMARK", {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "15"}}}}));
  first->close();  // timeoutSeconds elapsed
  Informer informer(api.client(), pod_options());
  informer.start();
  ASSERT_TRUE(wait_until([&] { return api.watch_requests().size() == 2; }));
  EXPECT_EQ(api.watch_requests()[1].params()["resourceVersion"], "15");
  EXPECT_EQ(informer.list_count(), 1);
}

TEST(InformerTest, StopReturnsPromptlyWhileWatching) {
  ScriptedApi api;
  api.add_list(pod_list("10", {}));
  InformerOptions options = pod_options();
  options.watch_timeout = 600s;
  Informer informer(api.client(), options);
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  ASSERT_TRUE(wait_until([&] { return api.watch_requests().size() == 1; }));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    informer.stop();
    stopped = true;
  });
  EXPECT_TRUE(wait_until([&] { return stopped.load(); }, 5000ms));
  stopper.join();
}

TEST(InformerTest, KeepsRetryingTheListUntilTheServerAnswers) {
  std::atomic<int> calls{0};
  TestHttpServer server([&](const Request& request, ResponseWriter& writer) {
    if (request.params().count("watch")) {
      writer.start_stream(200);
      LineChannel never;
      never.pop(writer);
      return;
    }
    if (calls.fetch_add(1) < 2) {
      writer.send(403, R"({"kind":"Status","code":403,"reason":"Forbidden","message":"rbac"})");
    } else {
      writer.send(200, pod_list("3", {pod("a", "1")}).dump());
    }
  });
  CpprestTransportOptions transport;
  transport.server = server.url();
  HttpClientOptions client_options;
  client_options.qps = 0;
  auto client = std::make_shared<HttpClient>(std::make_shared<CpprestTransport>(transport), nullptr,
                                             client_options);
  Informer informer(client, pod_options());
  EXPECT_FALSE(informer.has_synced());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(informer.store().size(), 1u);
  informer.stop();
  server.stop();
}

// A pod as the real API server sends it: field ownership per writer, and kubectl's copy of
// the applied object.
json pod_as_served(const std::string& name, const std::string& rv) {
  json p = pod(name, rv, {{"app", "train"}}, "uid-j");
  p["metadata"]["annotations"] = {
      {"kubectl.kubernetes.io/last-applied-configuration", json(p).dump()},
      {"longhaul.dev/restart-attempt", "2"}};
  p["metadata"]["managedFields"] =
      json::array({{{"manager", "longhaul-operator"},
                    {"operation", "Update"},
                    {"fieldsType", "FieldsV1"},
                    {"fieldsV1", {{"f:metadata", {{"f:labels", {{"f:app", json::object()}}}}}}}},
                   {{"manager", "kubelet"},
                    {"operation", "Update"},
                    {"subresource", "status"},
                    {"fieldsV1", {{"f:status", {{"f:phase", json::object()}}}}}}});
  p["spec"] = {
      {"containers",
       json::array({{{"name", "trainer"},
                     {"env", json::array({{{"name", "A"}, {"value", "1"}}})},
                     {"ports", json::array({{{"name", "metrics"}, {"containerPort", 9090}}})}}})}};
  p["status"] = {{"phase", "Running"}, {"podIP", "10.0.0.7"}};
  return p;
}

TEST(StripForCacheTest, DropsManagedFieldsAndLastAppliedKeepsTheRest) {
  json p = pod_as_served("a", "5");
  json expected = p;
  expected["metadata"].erase("managedFields");
  expected["metadata"]["annotations"].erase("kubectl.kubernetes.io/last-applied-configuration");
  strip_for_cache(p);
  EXPECT_EQ(p, expected);  // labels, the operator's annotation, spec and status untouched

  // An annotations map that held only kubectl's copy goes; objects without metadata are kept.
  json only_kubectl = pod("b", "6");
  only_kubectl["metadata"]["annotations"] = {
      {"kubectl.kubernetes.io/last-applied-configuration", "{}"}};
  strip_for_cache(only_kubectl);
  EXPECT_FALSE(only_kubectl["metadata"].contains("annotations"));
  EXPECT_EQ(only_kubectl["metadata"]["name"], "b");
  json bare = {{"kind", "Status"}, {"code", 410}};
  strip_for_cache(bare);
  EXPECT_EQ(bare, (json{{"kind", "Status"}, {"code", 410}}));
  json not_an_object = json::array({1, 2});
  strip_for_cache(not_an_object);
  EXPECT_EQ(not_an_object, json::array({1, 2}));

  // For objects written back: managedFields only; kubectl's annotation stays.
  json written_back = pod_as_served("c", "7");
  json kept = written_back;
  kept["metadata"].erase("managedFields");
  strip_managed_fields(written_back);
  EXPECT_EQ(written_back, kept);
}

// The transform applies to listed objects and to every watch event before the store and the
// handlers see them; bookmarks still move the resourceVersion.
TEST(InformerTest, TransformAppliesBeforeStoreAndHandlers) {
  ScriptedApi api;
  api.add_list(pod_list("10", {pod_as_served("a", "5")}));
  auto watch = api.add_watch();
  InformerOptions options = pod_options();
  options.transform = strip_for_cache;
  std::mutex mu;
  std::vector<json> seen;  // every object a handler was given
  auto keep = [&](const json& o) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(o);
  };
  Informer informer(api.client(), options);
  informer.add_handlers({keep,
                         [&](const json& old_object, const json& o) {
                           keep(old_object);
                           keep(o);
                         },
                         keep});
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  watch->push(event("MODIFIED", pod_as_served("a", "11")));
  watch->push(event("ADDED", pod_as_served("b", "12")));
  watch->push(event("DELETED", pod_as_served("b", "13")));
  watch->push(event("BOOKMARK", {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "20"}}}}));
  ASSERT_TRUE(wait_until([&] { return informer.resource_version() == "20"; }));

  const ObjectPtr a = informer.store().get("ns", "a");
  ASSERT_NE(a, nullptr);
  const json& md = (*a)["metadata"];
  EXPECT_EQ(md["resourceVersion"], "11");
  EXPECT_FALSE(md.contains("managedFields"));
  EXPECT_EQ(md["annotations"], (json{{"longhaul.dev/restart-attempt", "2"}}));
  // What the operator reads is still there: labels, owner, ports, status.
  EXPECT_EQ(md["labels"]["app"], "train");
  EXPECT_EQ(md["ownerReferences"][0]["uid"], "uid-j");
  EXPECT_EQ((*a)["spec"]["containers"][0]["ports"][0]["containerPort"], 9090);
  EXPECT_EQ((*a)["status"]["podIP"], "10.0.0.7");
  EXPECT_EQ(informer.store().by_owner_uid("uid-j").size(), 1u);  // b is gone
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 5u);  // add a; update a (old, new); add b; delete b
  for (const json& o : seen) {
    EXPECT_FALSE(o["metadata"].contains("managedFields")) << o.dump();
    EXPECT_FALSE(
        o["metadata"]["annotations"].contains("kubectl.kubernetes.io/last-applied-configuration"))
        << o.dump();
  }
}

// A transform that throws loses nothing: the object is cached as it is and handlers run.
TEST(InformerTest, TransformThatThrowsKeepsTheObject) {
  ScriptedApi api;
  api.add_list(pod_list("10", {pod("a", "5")}));
  api.add_watch();
  InformerOptions options = pod_options();
  options.transform = [](json& o) {
    if (o["metadata"]["name"] == "a") throw std::runtime_error("unexpected shape");
  };
  Recorder recorder;
  Informer informer(api.client(), options);
  informer.add_handlers(recorder.handlers());
  informer.start();
  ASSERT_TRUE(informer.wait_for_sync(5s));
  EXPECT_NE(informer.store().get("ns", "a"), nullptr);
  EXPECT_EQ(recorder.snapshot(), (std::vector<std::string>{"add a"}));
}

// list(ns, selector) through the label index answers as a scan of every object would, while
// objects are added, relabelled, deleted and replaced; namespaces that prefix one another stay
// apart.
TEST(StoreTest, IndexedListsMatchAFullScan) {
  Store store({"job"});
  auto obj = [](const std::string& ns, const std::string& name, json labels) {
    return json{{"metadata", {{"namespace", ns}, {"name", name}, {"labels", labels}}}};
  };
  auto check = [&](const std::string& when) {
    for (const char* ns : {"", "ns", "ns2", "n", "other"}) {
      for (const char* sel : {"job=a", "job=b", "job in (a)", "job=a,role=chief", "job",
                              "role=chief", "", "job in (a, b)", "job=zzz"}) {
        const LabelSelector selector = LabelSelector::parse(sel);
        std::vector<std::string> expected, got;
        for (const ObjectPtr& o : store.list()) {
          const std::string o_ns = (*o)["metadata"]["namespace"];
          if ((std::string(ns).empty() || o_ns == ns) && selector.matches_object(*o)) {
            expected.push_back(object_key(*o));
          }
        }
        for (const ObjectPtr& o : store.list(ns, selector)) got.push_back(object_key(*o));
        EXPECT_EQ(got, expected) << when << " ns=" << ns << " selector=" << sel;
      }
    }
  };
  store.upsert(obj("ns", "a-0", {{"job", "a"}, {"role", "chief"}}));
  store.upsert(obj("ns", "a-1", {{"job", "a"}}));
  store.upsert(obj("ns", "b-0", {{"job", "b"}}));
  store.upsert(obj("ns2", "a-0", {{"job", "a"}, {"role", "chief"}}));
  store.upsert(obj("n", "x", {{"role", "chief"}}));
  store.upsert(obj("ns", "c", json::object()));
  check("added");
  EXPECT_EQ(store.list("ns", LabelSelector::parse("job=a")).size(), 2u);
  store.upsert(obj("ns", "a-1", {{"job", "b"}}));  // relabelled
  store.erase("ns2/a-0");
  check("relabelled and erased");
  EXPECT_EQ(store.list("", LabelSelector::parse("job=a")).size(), 1u);
  store.replace({std::make_shared<const json>(obj("other", "a-9", {{"job", "a"}}))});
  check("replaced");
  EXPECT_EQ(store.list("", LabelSelector::parse("job=a")).size(), 1u);
  EXPECT_EQ(store.list("ns", LabelSelector::parse("job=b")).size(), 0u);
}

TEST(LabelSelectorTest, MatchesKubernetesSemantics) {
  json labels = {{"app", "train"}, {"tier", "gpu"}, {"longhaul.dev/role", "chief"}};
  struct Case {
    const char* selector;
    bool match;
  };
  const Case cases[] = {
      {"", true},
      {"app=train", true},
      {"app==train", true},
      {"app=serve", false},
      {"app!=serve", true},
      {"missing!=x", true},
      {"tier in (cpu, gpu)", true},
      {"tier notin (gpu)", false},
      {"missing notin (gpu)", true},
      {"longhaul.dev/role", true},
      {"!longhaul.dev/role", false},
      {"!missing", true},
      {"app=train,tier in (gpu),!missing", true},
      {"app=train,tier=cpu", false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(LabelSelector::parse(c.selector).matches(labels), c.match) << c.selector;
  }
  EXPECT_FALSE(LabelSelector::parse("app=train").matches(json()));
  EXPECT_THROW(LabelSelector::parse("app in (a"), InvalidArgument);
  EXPECT_THROW(LabelSelector::parse("a b=c"), InvalidArgument);
  EXPECT_TRUE(LabelSelector::from_json(json::parse(
                                           R"({"matchLabels":{"app":"train"},
                      "matchExpressions":[{"key":"tier","operator":"In","values":["gpu"]}]})"))
                  .matches(labels));
}

}  // namespace
}  // namespace longhaul::kube
