// Object semantics over real HTTP: create/get/list, conflicts, generation, status subresource,
// selectors, pagination, patches, deletion (preconditions, graceful pods, finalizers), garbage
// collection, auth, discovery, and concurrent clients.
#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <unistd.h>

#include <longhaul/base/file.h>

#include "longhaul/testing/temp_dir.h"
#include "test_fixture.h"

namespace longhaul::fakeapi::testing {
namespace {

std::vector<std::string> names(const json& list) {
  std::vector<std::string> out;
  for (const json& item : list["items"]) out.push_back(item["metadata"]["name"]);
  return out;
}

void expect_status(const Response& r, int code, const std::string& reason) {
  EXPECT_EQ(r.status, code) << r.body;
  json body = r.json_body();
  EXPECT_EQ(body["kind"], "Status");
  EXPECT_EQ(body["apiVersion"], "v1");
  EXPECT_EQ(body["status"], "Failure");
  EXPECT_EQ(body["reason"], reason) << r.body;
  EXPECT_EQ(body["code"], code);
  EXPECT_FALSE(body["message"].get<std::string>().empty());
}

TEST_F(FakeApiTest, CreateFillsSystemMetadataAndGetReturnsTheObject) {
  json created = create_pod("a", {{"app", "x"}});
  EXPECT_EQ(created["kind"], "Pod");
  EXPECT_EQ(created["apiVersion"], "v1");
  const json& meta = created["metadata"];
  EXPECT_EQ(meta["namespace"], "default");
  EXPECT_EQ(meta["uid"].get<std::string>().size(), 36u);
  EXPECT_EQ(meta["generation"], 1);
  EXPECT_EQ(meta["creationTimestamp"].get<std::string>().size(), 20u);  // 2026-01-01T00:00:00Z
  EXPECT_EQ(created["status"]["phase"], "Pending");
  EXPECT_EQ(created["spec"]["restartPolicy"], "Always");  // API defaulting
  EXPECT_EQ(created["spec"]["terminationGracePeriodSeconds"], 30);

  Response got = client_->get(kPods + "/a");
  ASSERT_EQ(got.status, 200);
  EXPECT_EQ(got.header("content-type"), "application/json");
  EXPECT_EQ(got.json_body(), created);

  json second = create_pod("b");
  EXPECT_GT(rv_of(second), rv_of(created));
  EXPECT_NE(second["metadata"]["uid"], created["metadata"]["uid"]);
}

TEST_F(FakeApiTest, ListReturnsTypedListWithResourceVersion) {
  create_pod("b");
  create_pod("a");
  ASSERT_EQ(client_->post("/api/v1/namespaces/other/pods", pod("c")).status, 201);
  json list = client_->get(kPods).json_body();
  EXPECT_EQ(list["kind"], "PodList");
  EXPECT_EQ(list["apiVersion"], "v1");
  EXPECT_EQ(list["metadata"]["resourceVersion"], std::to_string(server_->resource_version()));
  EXPECT_EQ(names(list), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(list["items"][0].contains("kind"));  // built-in items carry no kind
  json all = client_->get("/api/v1/pods").json_body();
  EXPECT_EQ(names(all), (std::vector<std::string>{"a", "b", "c"}));

  ASSERT_EQ(client_->post(kJobs, training_job("j")).status, 201);
  json jobs = client_->get("/apis/longhaul.dev/v1alpha1/trainingjobs").json_body();
  EXPECT_EQ(jobs["kind"], "TrainingJobList");
  EXPECT_EQ(jobs["items"][0]["kind"], "TrainingJob");  // custom resources keep it
}

TEST_F(FakeApiTest, CreateTwiceIsAlreadyExists) {
  create_pod("a");
  Response r = client_->post(kPods, pod("a"));
  expect_status(r, 409, "AlreadyExists");
  EXPECT_EQ(r.json_body()["details"]["name"], "a");
  EXPECT_EQ(r.json_body()["details"]["kind"], "pods");
}

TEST_F(FakeApiTest, GenerateNameMakesUniqueNames) {
  json p = pod("");
  p["metadata"].erase("name");
  p["metadata"]["generateName"] = "worker-";
  std::set<std::string> seen;
  for (int i = 0; i < 5; ++i) {
    Response r = client_->post(kPods, p);
    ASSERT_EQ(r.status, 201) << r.body;
    std::string name = r.json_body()["metadata"]["name"];
    EXPECT_EQ(name.rfind("worker-", 0), 0u);
    EXPECT_EQ(name.size(), 12u);
    seen.insert(name);
  }
  EXPECT_EQ(seen.size(), 5u);
  p["metadata"].erase("generateName");
  expect_status(client_->post(kPods, p), 422, "Invalid");
}

TEST_F(FakeApiTest, InvalidRequestsAreRejectedWithStatus) {
  expect_status(client_->post(kPods, pod("Bad_Name")), 422, "Invalid");
  json wrong_ns = pod("a");
  wrong_ns["metadata"]["namespace"] = "elsewhere";
  expect_status(client_->post(kPods, wrong_ns), 400, "BadRequest");
  expect_status(client_->request("POST", kPods, "{not json"), 400, "BadRequest");
  json wrong_kind = pod("a");
  wrong_kind["kind"] = "Service";
  expect_status(client_->post(kPods, wrong_kind), 400, "BadRequest");
}

TEST_F(FakeApiTest, UpdateWithStaleResourceVersionIsConflict) {
  json created = create_pod("a");
  json first = created;
  first["metadata"]["labels"]["v"] = "1";
  Response ok = client_->put(kPods + "/a", first);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_GT(rv_of(ok.json_body()), rv_of(created));

  json stale = created;  // still carries the old resourceVersion
  stale["metadata"]["labels"]["v"] = "2";
  Response conflict = client_->put(kPods + "/a", stale);
  expect_status(conflict, 409, "Conflict");
  EXPECT_NE(conflict.json_body()["message"].get<std::string>().find("the object has been modified"),
            std::string::npos);
  EXPECT_EQ(client_->get(kPods + "/a").json_body()["metadata"]["labels"]["v"], "1");

  json unconditional = ok.json_body();  // built-in types allow an update without a version
  unconditional["metadata"].erase("resourceVersion");
  unconditional["metadata"]["labels"]["v"] = "3";
  EXPECT_EQ(client_->put(kPods + "/a", unconditional).status, 200);
  expect_status(client_->put(kPods + "/missing", pod("missing")), 404, "NotFound");
  expect_status(client_->put(kPods + "/a", pod("b")), 400, "BadRequest");
}

// A write that carries the uid of a pod deleted since (the kubelet's status patches, the
// operator's annotations) never lands on a pod re-created under the same name: as on a real
// server, PATCH -> 422 (metadata.uid is immutable), PUT -> 409 (the uid is a precondition).
TEST_F(FakeApiTest, WriteCarryingAnOldUidNeverReachesASameNameSuccessor) {
  const std::string old_uid = create_pod("a")["metadata"]["uid"];
  ASSERT_EQ(client_->del(kPods + "/a").status, 200);  // unscheduled: gone at once
  json successor = create_pod("a");
  const std::string new_uid = successor["metadata"]["uid"];
  ASSERT_NE(old_uid, new_uid);

  Response annotate = client_->patch(
      kPods + "/a", {{"metadata", {{"uid", old_uid}, {"annotations", {{"counted", "3"}}}}}});
  expect_status(annotate, 422, "Invalid");
  EXPECT_NE(annotate.body.find("metadata.uid"), std::string::npos) << annotate.body;
  json terminated = {{"name", "main"},
                     {"state", {{"terminated", {{"exitCode", 143}, {"reason", "Error"}}}}}};
  expect_status(client_->patch(kPods + "/a/status",
                               {{"metadata", {{"uid", old_uid}}},
                                {"status", {{"containerStatuses", json::array({terminated})}}}}),
                422, "Invalid");
  json stale = successor;
  stale["metadata"]["uid"] = old_uid;
  stale["metadata"]["labels"]["v"] = "1";
  Response put = client_->put(kPods + "/a", stale);
  expect_status(put, 409, "Conflict");
  EXPECT_NE(put.body.find("UID in precondition"), std::string::npos) << put.body;

  json now = client_->get(kPods + "/a").json_body();
  EXPECT_EQ(now["metadata"]["uid"], new_uid);
  EXPECT_EQ(now["metadata"]["resourceVersion"], successor["metadata"]["resourceVersion"]);
  EXPECT_FALSE(now["status"].contains("containerStatuses")) << now.dump();
  // The successor's own uid is accepted.
  EXPECT_EQ(client_
                ->patch(kPods + "/a",
                        {{"metadata", {{"uid", new_uid}, {"annotations", {{"counted", "1"}}}}}})
                .status,
            200);
}

TEST_F(FakeApiTest, PodSpecIsImmutableExceptImages) {
  json created = create_pod("a");
  json new_image = created;
  new_image["spec"]["containers"][0]["image"] = "busybox:1.37";
  Response ok = client_->put(kPods + "/a", new_image);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.json_body()["metadata"]["generation"], 2);
  json moved = ok.json_body();
  moved["spec"]["nodeName"] = "node-1";  // scheduling goes through pods/binding
  expect_status(client_->put(kPods + "/a", moved), 422, "Invalid");
  expect_status(client_->patch(kPods + "/a", {{"spec", {{"restartPolicy", "Never"}}}}), 422,
                "Invalid");
}

TEST_F(FakeApiTest, CustomResourceUpdateRequiresResourceVersion) {
  json job = client_->post(kJobs, training_job("j")).json_body();
  job["metadata"].erase("resourceVersion");
  expect_status(client_->put(kJobs + "/j", job), 422, "Invalid");
}

TEST_F(FakeApiTest, NoOpUpdateWritesNothing) {
  json created = create_pod("a");
  uint64_t before = server_->resource_version();
  Response r = client_->put(kPods + "/a", created);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json_body()["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);
  EXPECT_EQ(server_->resource_version(), before);
}

TEST_F(FakeApiTest, GenerationBumpsOnlyWhenSpecChanges) {
  json job = client_->post(kJobs, training_job("j")).json_body();
  ASSERT_EQ(job["metadata"]["generation"], 1);

  job["metadata"]["labels"] = {{"team", "ml"}};
  job = client_->put(kJobs + "/j", job).json_body();
  EXPECT_EQ(job["metadata"]["generation"], 1) << "metadata changes keep the generation";

  job["status"] = {{"phase", "Running"}};
  job = client_->put(kJobs + "/j/status", job).json_body();
  EXPECT_EQ(job["status"]["phase"], "Running");
  EXPECT_EQ(job["metadata"]["generation"], 1) << "status writes keep the generation";

  job["spec"]["replicaSpecs"]["Worker"]["replicas"] = 4;
  job = client_->put(kJobs + "/j", job).json_body();
  EXPECT_EQ(job["metadata"]["generation"], 2);

  job = client_->patch(kJobs + "/j", {{"spec", {{"runPolicy", {{"suspend", true}}}}}}).json_body();
  EXPECT_EQ(job["metadata"]["generation"], 3);

  json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", "leader"}}},
                {"spec", {{"holderIdentity", "a"}}}};
  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
  ASSERT_EQ(client_->post(leases, lease).status, 201);
  json renewed =
      client_->patch(leases + "/leader", {{"spec", {{"holderIdentity", "b"}}}}).json_body();
  EXPECT_EQ(renewed["spec"]["holderIdentity"], "b");
  EXPECT_EQ(renewed["metadata"]["generation"], 2);
}

TEST_F(FakeApiTest, StatusSubresourceIsIsolated) {
  json job = training_job("j");
  job["status"] = {{"phase", "Succeeded"}};
  json created = client_->post(kJobs, job).json_body();
  EXPECT_FALSE(created.contains("status")) << "status is dropped on create";

  json main = created;
  main["status"] = {{"phase", "Hacked"}};
  main["spec"]["replicaSpecs"]["Worker"]["replicas"] = 3;
  json after_main = client_->put(kJobs + "/j", main).json_body();
  EXPECT_FALSE(after_main.contains("status")) << "the main resource ignores status";
  EXPECT_EQ(after_main["spec"]["replicaSpecs"]["Worker"]["replicas"], 3);

  json status_write = after_main;
  status_write["status"] = {{"phase", "Running"}};
  status_write["spec"]["replicaSpecs"]["Worker"]["replicas"] = 99;
  status_write["metadata"]["labels"] = {{"x", "y"}};
  json after_status = client_->put(kJobs + "/j/status", status_write).json_body();
  EXPECT_EQ(after_status["status"]["phase"], "Running");
  EXPECT_EQ(after_status["spec"]["replicaSpecs"]["Worker"]["replicas"], 3)
      << "/status ignores spec";
  EXPECT_FALSE(after_status["metadata"].contains("labels")) << "/status ignores metadata";

  json patched =
      client_->patch(kJobs + "/j/status", {{"status", {{"restartCount", 2}}}, {"spec", {{"x", 1}}}})
          .json_body();
  EXPECT_EQ(patched["status"]["restartCount"], 2);
  EXPECT_EQ(patched["status"]["phase"], "Running");
  EXPECT_FALSE(patched["spec"].contains("x"));
  json via_main = client_->patch(kJobs + "/j", {{"status", {{"phase", "Failed"}}}}).json_body();
  EXPECT_EQ(via_main["status"]["phase"], "Running");

  // Pods have the same split.
  json p = create_pod("p");
  json patched_pod =
      client_->patch(kPods + "/p/status", {{"status", {{"phase", "Running"}}}}).json_body();
  EXPECT_EQ(patched_pod["status"]["phase"], "Running");
  EXPECT_EQ(patched_pod["metadata"]["generation"], 1);
  EXPECT_EQ(client_->get(kJobs + "/j/status").json_body()["status"]["phase"], "Running");
}

TEST_F(FakeApiTest, LabelSelectorsFilterLists) {
  create_pod("chief", {{"role", "chief"}, {"type", "worker"}, {"job", "a"}});
  create_pod("w1", {{"type", "worker"}, {"job", "a"}});
  create_pod("ps", {{"type", "ps"}, {"job", "b"}});
  create_pod("bare");
  struct Case {
    std::string selector;
    std::vector<std::string> expected;
  };
  std::vector<Case> cases = {
      {"type=worker", {"chief", "w1"}},
      {"type==ps", {"ps"}},
      {"type!=worker", {"bare", "ps"}},
      {"type in (ps, worker)", {"chief", "ps", "w1"}},
      {"type notin (worker)", {"bare", "ps"}},
      {"role", {"chief"}},
      {"!role", {"bare", "ps", "w1"}},
      {"job=a,!role", {"w1"}},
      {"job=a,type in (worker),role=chief", {"chief"}},
      {"", {"bare", "chief", "ps", "w1"}},
  };
  for (const Case& c : cases) {
    std::string target = kPods + "?labelSelector=";
    for (char ch : c.selector) {
      if (ch == ' ')
        target += "%20";
      else if (ch == '=')
        target += "%3D";
      else if (ch == '!')
        target += "%21";
      else if (ch == ',')
        target += "%2C";
      else
        target += ch;
    }
    Response r = client_->get(target);
    ASSERT_EQ(r.status, 200) << c.selector << ": " << r.body;
    EXPECT_EQ(names(r.json_body()), c.expected) << c.selector;
    EXPECT_EQ(server_->list("pods", "default", c.selector).size(), c.expected.size());
  }
  EXPECT_EQ(client_->get(kPods + "?labelSelector=a%20in%20b").status, 400);
}

TEST_F(FakeApiTest, FieldSelectorsFilterPods) {
  create_pod("a", {}, "node-1");
  create_pod("b", {}, "node-2");
  create_pod("c");
  server_->patch_status("pods", "default", "b", {{"phase", "Running"}});
  EXPECT_EQ(names(client_->get(kPods + "?fieldSelector=metadata.name%3Db").json_body()),
            (std::vector<std::string>{"b"}));
  EXPECT_EQ(names(client_->get(kPods + "?fieldSelector=spec.nodeName%3Dnode-1").json_body()),
            (std::vector<std::string>{"a"}));
  EXPECT_EQ(names(client_->get(kPods + "?fieldSelector=status.phase!%3DRunning").json_body()),
            (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(names(client_->get(kPods + "?fieldSelector=spec.nodeName%3D").json_body()),
            (std::vector<std::string>{"c"}));
  expect_status(client_->get(kPods + "?fieldSelector=spec.bogus%3Dx"), 400, "BadRequest");
}

TEST_F(FakeApiTest, LimitAndContinuePageThroughEverythingOnce) {
  for (const char* n : {"e", "a", "d", "b", "c"}) create_pod(n);
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  std::string first_rv;
  do {
    std::string target = kPods + "?limit=2" + (token.empty() ? "" : "&continue=" + token);
    json page = client_->get(target).json_body();
    if (first_rv.empty()) first_rv = page["metadata"]["resourceVersion"];
    EXPECT_EQ(page["metadata"]["resourceVersion"], first_rv);
    for (const auto& n : names(page)) seen.push_back(n);
    token = page["metadata"].value("continue", "");
    if (pages == 0) {
      EXPECT_EQ(page["metadata"]["remainingItemCount"], 3);
    }
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c", "d", "e"}));

  // A continue token from before the history was compacted is Expired.
  json page = client_->get(kPods + "?limit=2").json_body();
  server_->expire_history();
  expect_status(
      client_->get(kPods + "?limit=2&continue=" + page["metadata"]["continue"].get<std::string>()),
      410, "Expired");
}

TEST_F(FakeApiTest, MergeJsonAndStrategicPatches) {
  create_pod("a", {{"keep", "1"}, {"drop", "1"}});
  json merged =
      client_->patch(kPods + "/a", {{"metadata", {{"labels", {{"drop", nullptr}, {"new", "2"}}}}}})
          .json_body();
  EXPECT_EQ(merged["metadata"]["labels"], (json{{"keep", "1"}, {"new", "2"}}));

  json ops =
      json::array({{{"op", "add"}, {"path", "/metadata/annotations"}, {"value", {{"note", "x"}}}},
                   {{"op", "replace"}, {"path", "/metadata/labels/keep"}, {"value", "9"}}});
  json patched = client_->patch(kPods + "/a", ops, "application/json-patch+json").json_body();
  EXPECT_EQ(patched["metadata"]["annotations"]["note"], "x");
  EXPECT_EQ(patched["metadata"]["labels"]["keep"], "9");

  json failing_test =
      json::array({{{"op", "test"}, {"path", "/metadata/labels/keep"}, {"value", "1"}}});
  expect_status(client_->patch(kPods + "/a", failing_test, "application/json-patch+json"), 422,
                "Invalid");

  json strategic = client_
                       ->patch(kPods + "/a", {{"metadata", {{"labels", {{"s", "1"}}}}}},
                               "application/strategic-merge-patch+json")
                       .json_body();
  EXPECT_EQ(strategic["metadata"]["labels"]["s"], "1");

  ASSERT_EQ(client_->post(kJobs, training_job("j")).status, 201);
  expect_status(client_->patch(kJobs + "/j", {{"spec", {{"x", 1}}}},
                               "application/strategic-merge-patch+json"),
                415, "UnsupportedMediaType");
  expect_status(client_->patch(kPods + "/a", {{"spec", {}}}, "application/json"), 415,
                "UnsupportedMediaType");

  // A resourceVersion inside a patch is a precondition.
  expect_status(
      client_->patch(kPods + "/a",
                     {{"metadata", {{"resourceVersion", "1"}, {"labels", {{"z", "1"}}}}}}),
      409, "Conflict");
  expect_status(client_->patch(kPods + "/missing", {{"metadata", {}}}), 404, "NotFound");
}

TEST_F(FakeApiTest, DeletePreconditionsAreChecked) {
  json created = create_pod("a");
  std::string uid = created["metadata"]["uid"];
  expect_status(client_->del(kPods + "/a", {{"preconditions", {{"uid", "other"}}}}), 409,
                "Conflict");
  expect_status(client_->del(kPods + "/a", {{"preconditions", {{"resourceVersion", "12345"}}}}),
                409, "Conflict");
  Response ok =
      client_->del(kPods + "/a",
                   {{"kind", "DeleteOptions"},
                    {"apiVersion", "v1"},
                    {"preconditions",
                     {{"uid", uid}, {"resourceVersion", created["metadata"]["resourceVersion"]}}}});
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.json_body()["metadata"]["name"], "a");
  expect_status(client_->get(kPods + "/a"), 404, "NotFound");
  expect_status(client_->del(kPods + "/a"), 404, "NotFound");
}

TEST_F(FakeApiTest, ScheduledPodDeletionIsGracefulUntilTheKubeletFinalizes) {
  create_pod("running", {}, "node-1");
  Response r = client_->del(kPods + "/running");
  ASSERT_EQ(r.status, 200);
  json terminating = r.json_body();
  EXPECT_TRUE(terminating["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(terminating["metadata"]["deletionGracePeriodSeconds"], 30);
  json still = client_->get(kPods + "/running").json_body();
  EXPECT_EQ(still["metadata"]["deletionTimestamp"], terminating["metadata"]["deletionTimestamp"]);

  // A second delete with a longer grace changes nothing; a shorter one moves it forward.
  EXPECT_EQ(client_->del(kPods + "/running?gracePeriodSeconds=60").json_body(), still);
  json shorter = client_->del(kPods + "/running", {{"gracePeriodSeconds", 5}}).json_body();
  EXPECT_EQ(shorter["metadata"]["deletionGracePeriodSeconds"], 5);

  server_->finalize_pod_deletion("default", "running");
  EXPECT_EQ(client_->get(kPods + "/running").status, 404);
}

TEST_F(FakeApiTest, PodDeletionIsImmediateWhenUnscheduledTerminalOrForced) {
  create_pod("unscheduled");
  EXPECT_EQ(client_->del(kPods + "/unscheduled").status, 200);
  EXPECT_EQ(client_->get(kPods + "/unscheduled").status, 404);

  create_pod("done", {}, "node-1");
  server_->patch_status("pods", "default", "done", {{"phase", "Succeeded"}});
  EXPECT_EQ(client_->del(kPods + "/done").status, 200);
  EXPECT_EQ(client_->get(kPods + "/done").status, 404);

  create_pod("forced", {}, "node-1");
  EXPECT_EQ(client_->del(kPods + "/forced?gracePeriodSeconds=0").status, 200);
  EXPECT_EQ(client_->get(kPods + "/forced").status, 404);

  create_pod("forced-later", {}, "node-1");
  client_->del(kPods + "/forced-later");
  ASSERT_EQ(client_->get(kPods + "/forced-later").status, 200);
  EXPECT_EQ(client_->del(kPods + "/forced-later", {{"gracePeriodSeconds", 0}}).status, 200);
  EXPECT_EQ(client_->get(kPods + "/forced-later").status, 404);
}

TEST_F(FakeApiTest, FinalizersHoldDeletionUntilRemoved) {
  const std::string cms = "/api/v1/namespaces/default/configmaps";
  json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", "c"}, {"finalizers", {"example.com/hold"}}}},
             {"data", {{"k", "v"}}}};
  ASSERT_EQ(client_->post(cms, cm).status, 201);
  json deleting = client_->del(cms + "/c").json_body();
  EXPECT_TRUE(deleting["metadata"].contains("deletionTimestamp"));
  ASSERT_EQ(client_->get(cms + "/c").status, 200);
  json released = client_->patch(cms + "/c", {{"metadata", {{"finalizers", nullptr}}}}).json_body();
  EXPECT_EQ(client_->get(cms + "/c").status, 404);
  EXPECT_EQ(released["metadata"]["name"], "c");
}

class GarbageCollectionTest : public FakeApiTest {
 protected:
  // A job owning a scheduled pod, an unscheduled pod, a service and a PVC.
  json make_family() {
    json job = client_->post(kJobs, training_job("j")).json_body();
    json ref = json::array({owner_ref(job)});
    json p1 = pod("j-worker-0", {}, "node-1");
    p1["metadata"]["ownerReferences"] = ref;
    json p2 = pod("j-worker-1");
    p2["metadata"]["ownerReferences"] = ref;
    json svc = {{"apiVersion", "v1"},
                {"kind", "Service"},
                {"metadata", {{"name", "j"}, {"ownerReferences", ref}}},
                {"spec", {{"clusterIP", "None"}}}};
    json pvc = {{"apiVersion", "v1"},
                {"kind", "PersistentVolumeClaim"},
                {"metadata", {{"name", "j-logdir"}, {"ownerReferences", ref}}},
                {"spec",
                 {{"accessModes", {"ReadWriteMany"}},
                  {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}};
    EXPECT_EQ(client_->post(kPods, p1).status, 201);
    EXPECT_EQ(client_->post(kPods, p2).status, 201);
    EXPECT_EQ(client_->post("/api/v1/namespaces/default/services", svc).status, 201);
    Response claim = client_->post("/api/v1/namespaces/default/persistentvolumeclaims", pvc);
    EXPECT_EQ(claim.status, 201);
    EXPECT_EQ(claim.json_body()["status"]["phase"], "Bound");
    return job;
  }
};

TEST_F(GarbageCollectionTest, DeletingTheOwnerDeletesDependents) {
  make_family();
  ASSERT_EQ(client_->del(kJobs + "/j").status, 200);
  EXPECT_EQ(client_->get(kJobs + "/j").status, 404);
  EXPECT_EQ(client_->get("/api/v1/namespaces/default/services/j").status, 404);
  EXPECT_EQ(client_->get("/api/v1/namespaces/default/persistentvolumeclaims/j-logdir").status, 404);
  EXPECT_EQ(client_->get(kPods + "/j-worker-1").status, 404);
  // The scheduled pod terminates gracefully: it waits for its kubelet.
  json terminating = client_->get(kPods + "/j-worker-0").json_body();
  EXPECT_TRUE(terminating["metadata"].contains("deletionTimestamp"));
  server_->finalize_pod_deletion("default", "j-worker-0");
  EXPECT_TRUE(server_->list("pods").empty());
}

TEST_F(GarbageCollectionTest, OrphanPropagationKeepsDependentsAndDropsTheReference) {
  make_family();
  ASSERT_EQ(client_->del(kJobs + "/j", {{"propagationPolicy", "Orphan"}}).status, 200);
  EXPECT_EQ(client_->get(kJobs + "/j").status, 404);
  json svc = client_->get("/api/v1/namespaces/default/services/j").json_body();
  EXPECT_FALSE(svc["metadata"].contains("ownerReferences"));
  EXPECT_EQ(server_->list("pods").size(), 2u);
}

TEST_F(GarbageCollectionTest, ForegroundDeletionWaitsForDependents) {
  make_family();
  json owner = client_->del(kJobs + "/j?propagationPolicy=Foreground").json_body();
  EXPECT_TRUE(owner["metadata"].contains("deletionTimestamp"));
  json job = client_->get(kJobs + "/j").json_body();
  EXPECT_EQ(job["metadata"]["finalizers"], json::array({"foregroundDeletion"}));
  server_->finalize_pod_deletion("default", "j-worker-0");  // the last dependent
  EXPECT_EQ(client_->get(kJobs + "/j").status, 404);
}

TEST_F(GarbageCollectionTest, DependentWithAnotherLiveOwnerSurvives) {
  json job = make_family();
  json other = client_->post(kJobs, training_job("k")).json_body();
  json svc = client_->get("/api/v1/namespaces/default/services/j").json_body();
  svc["metadata"]["ownerReferences"].push_back(owner_ref(other));
  ASSERT_EQ(client_->put("/api/v1/namespaces/default/services/j", svc).status, 200);
  client_->del(kJobs + "/j");
  json survivor = client_->get("/api/v1/namespaces/default/services/j").json_body();
  ASSERT_EQ(survivor["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(survivor["metadata"]["ownerReferences"][0]["name"], "k");
}

TEST_F(FakeApiTest, BindingAndEvictionSubresources) {
  create_pod("a");
  json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", "a"}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", "node-7"}}}};
  ASSERT_EQ(client_->post(kPods + "/a/binding", binding).status, 201);
  json bound = client_->get(kPods + "/a").json_body();
  EXPECT_EQ(bound["spec"]["nodeName"], "node-7");
  expect_status(client_->post(kPods + "/a/binding", binding), 409, "Conflict");

  json eviction = {{"apiVersion", "policy/v1"},
                   {"kind", "Eviction"},
                   {"metadata", {{"name", "a"}, {"namespace", "default"}}}};
  ASSERT_EQ(client_->post(kPods + "/a/eviction", eviction).status, 201);
  json evicted = client_->get(kPods + "/a").json_body();
  EXPECT_TRUE(evicted["metadata"].contains("deletionTimestamp"));
  bool disruption = false;
  for (const json& c : evicted["status"]["conditions"]) {
    if (c["type"] == "DisruptionTarget" && c["reason"] == "EvictionByEvictionAPI") {
      disruption = true;
    }
  }
  EXPECT_TRUE(disruption);
}

TEST_F(FakeApiTest, DeleteCollectionBySelector) {
  create_pod("a", {{"job", "x"}});
  create_pod("b", {{"job", "x"}});
  create_pod("c", {{"job", "y"}});
  json deleted = client_->del(kPods + "?labelSelector=job%3Dx").json_body();
  EXPECT_EQ(deleted["kind"], "PodList");
  EXPECT_EQ(names(deleted), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(names(client_->get(kPods).json_body()), (std::vector<std::string>{"c"}));
}

TEST_F(FakeApiTest, UnknownPathsAndMethodsAreStatusErrors) {
  expect_status(client_->get("/api/v1/namespaces/default/widgets"), 404, "NotFound");
  expect_status(client_->get("/apis/nope.dev/v1/things"), 404, "NotFound");
  expect_status(client_->get("/api/v1/namespaces/default/pods/a/logs"), 404, "NotFound");
  expect_status(client_->get("/nothing/here"), 404, "NotFound");
  expect_status(client_->post("/api/v1/pods", pod("a")), 405, "MethodNotAllowed");
  expect_status(client_->put(kPods, pod("a")), 405, "MethodNotAllowed");
}

TEST_F(FakeApiTest, VersionHealthAndDiscovery) {
  EXPECT_EQ(client_->get("/version").json_body()["major"], "1");
  Response health = client_->get("/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok");
  json resources = client_->get("/apis/longhaul.dev/v1alpha1").json_body();
  EXPECT_EQ(resources["kind"], "APIResourceList");
  bool found = false;
  for (const json& r : resources["resources"]) {
    if (r["name"] == "trainingjobs") {
      found = true;
      EXPECT_EQ(r["kind"], "TrainingJob");
      EXPECT_TRUE(r["namespaced"].get<bool>());
    }
  }
  EXPECT_TRUE(found);
  json groups = client_->get("/apis").json_body();
  EXPECT_EQ(groups["kind"], "APIGroupList");
  EXPECT_EQ(client_->get("/api").json_body()["versions"][0], "v1");
}

class AuthTest : public FakeApiTest {
 protected:
  Options options() override {
    Options o = FakeApiTest::options();
    o.bearer_token = "s3cret";
    return o;
  }
};

TEST_F(AuthTest, RequestsWithoutTheTokenAreUnauthorized) {
  EXPECT_EQ(client_->get(kPods).status, 200);  // the fixture's client sends the token
  TestHttpClient anonymous(server_->port());
  expect_status(anonymous.get(kPods), 401, "Unauthorized");
  TestHttpClient wrong(server_->port(), "guess");
  expect_status(wrong.get(kPods), 401, "Unauthorized");
  EXPECT_EQ(anonymous.get("/healthz").status, 200);
}

TEST_F(FakeApiTest, KubeconfigPointsAtTheServer) {
  longhaul::testing::TempDir dir("fakeapi-kubeconfig");
  server_->write_kubeconfig(dir / "config", "team-a");
  std::string text = longhaul::file::read_file(dir / "config");
  EXPECT_NE(text.find("server: " + server_->url()), std::string::npos) << text;
  EXPECT_NE(text.find("namespace: team-a"), std::string::npos);
  EXPECT_NE(text.find("current-context: longhaul-fake"), std::string::npos);
}

TEST_F(FakeApiTest, DirectStoreCallsThrowStatusErrors) {
  server_->create("pods", "default", pod("a"));
  try {
    server_->create("pods", "default", pod("a"));
    FAIL() << "expected AlreadyExists";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.http_status(), 409);
    EXPECT_EQ(e.reason(), "AlreadyExists");
    EXPECT_EQ(e.code(), Code::kAlreadyExists);
  }
  EXPECT_THROW(server_->get("pods", "default", "missing"), StatusError);
  EXPECT_FALSE(server_->try_get("pods", "default", "missing").has_value());
  EXPECT_THROW(server_->get("widgets", "default", "x"), StatusError);
  json job = server_->create("trainingjobs", "default", training_job("j"));
  EXPECT_EQ(server_->get("trainingjobs.longhaul.dev", "default", "j"), job);
  EXPECT_EQ(server_->count_requests(), 0u) << "direct calls are not HTTP requests";
}

TEST_F(FakeApiTest, RequestLogCountsVerbsAndWrites) {
  create_pod("a");
  create_pod("b");
  client_->get(kPods + "/a");
  client_->get(kPods);
  client_->patch(kPods + "/a/status", {{"status", {{"phase", "Running"}}}});
  client_->get(kPods + "/missing");
  EXPECT_EQ(server_->count_requests({.verb = "create", .resource = "pods"}), 2u);
  EXPECT_EQ(server_->count_requests({.verb = "get"}), 2u);
  EXPECT_EQ(server_->count_requests({.verb = "list"}), 1u);
  EXPECT_EQ(server_->count_requests({.write = true}), 3u);
  EXPECT_EQ(server_->count_requests({.subresource = "status"}), 1u);
  EXPECT_EQ(server_->count_requests({.status = 404}), 1u);
  EXPECT_EQ(server_->count_requests({.method = "GET", .path_regex = "/pods/a$"}), 1u);
  std::vector<RequestRecord> log = server_->requests();
  ASSERT_EQ(log.size(), 6u);
  EXPECT_EQ(log[0].method, "POST");
  EXPECT_EQ(log[0].ns, "default");
  EXPECT_EQ(log[4].name, "a");
  server_->clear_requests();
  EXPECT_EQ(server_->count_requests({.write = true}), 0u);
  // take_requests hands over what was answered since and starts the log afresh.
  client_->get(kPods + "/b");
  create_pod("c");
  log = server_->take_requests();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].verb, "get");
  EXPECT_EQ(log[1].verb, "create");
  EXPECT_TRUE(log[1].write);
  EXPECT_EQ(server_->count_requests(), 0u);
  EXPECT_TRUE(server_->take_requests().empty());
}

TEST_F(FakeApiTest, ConcurrentClientsGetUniqueVersionsAndConflictsNotLostUpdates) {
  constexpr int kThreads = 6;
  constexpr int kPodsEach = 15;
  create_pod("counter", {{"n", "0"}});
  std::vector<std::thread> threads;
  std::atomic<int> conflicts{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TestHttpClient client(server_->port());
      for (int i = 0; i < kPodsEach; ++i) {
        std::string name = "p-" + std::to_string(t) + "-" + std::to_string(i);
        EXPECT_EQ(client.post(kPods, pod(name)).status, 201);
        // Read-modify-write of a shared counter with optimistic concurrency.
        for (;;) {
          json counter = client.get(kPods + "/counter").json_body();
          int n = std::stoi(counter["metadata"]["labels"]["n"].get<std::string>());
          counter["metadata"]["labels"]["n"] = std::to_string(n + 1);
          Response r = client.put(kPods + "/counter", counter);
          if (r.status == 200) break;
          EXPECT_EQ(r.status, 409);
          ++conflicts;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<json> all = server_->list("pods", "default");
  EXPECT_EQ(all.size(), size_t{kThreads * kPodsEach + 1});
  std::set<std::string> versions;
  for (const json& p : all) versions.insert(p["metadata"]["resourceVersion"]);
  EXPECT_EQ(versions.size(), all.size());
  json counter = server_->get("pods", "default", "counter");
  EXPECT_EQ(counter["metadata"]["labels"]["n"], std::to_string(kThreads * kPodsEach))
      << "no update was lost (" << conflicts << " conflicts retried)";
}

TEST_F(FakeApiTest, AWriteSeenInTheStoreIsAlreadyInTheRequestLog) {
  // Tests count a client's writes after seeing their effect ("nothing was written since"); the
  // count must include the write they just saw, even while the server is still answering it.
  constexpr int kPatches = 1000;
  create_pod("counter", {{"n", "0"}});
  std::atomic<bool> done{false};
  std::thread writer([&] {
    TestHttpClient client(server_->port());
    for (int i = 1; i <= kPatches; ++i) {
      client.patch(kPods + "/counter", {{"metadata", {{"labels", {{"n", std::to_string(i)}}}}}});
    }
    done = true;
  });
  int checks = 0, behind = 0;
  while (!done) {
    const json counter = server_->get("pods", "default", "counter");
    const size_t seen = std::stoul(counter["metadata"]["labels"]["n"].get<std::string>());
    const size_t logged = server_->count_requests({.verb = "patch", .name = "counter"});
    ++checks;
    if (logged < seen) ++behind;
  }
  writer.join();
  EXPECT_EQ(behind, 0) << "of " << checks << " reads, " << behind
                       << " saw a patch the request log did not have yet";
  EXPECT_EQ(server_->count_requests({.verb = "patch", .name = "counter"}), size_t{kPatches});
}

TEST_F(FakeApiTest, WaitForWakesOnStoreChangesWithoutPolling) {
  std::thread writer([&] {
    TestHttpClient client(server_->port());
    for (int i = 0; i < 3; ++i) client.post(kPods, pod("w" + std::to_string(i)));
  });
  EXPECT_TRUE(server_->wait_for([&] { return server_->list("pods").size() == 3; },
                                std::chrono::seconds(10)));
  writer.join();
  EXPECT_FALSE(server_->wait_for([&] { return server_->list("pods").size() == 4; },
                                 std::chrono::milliseconds(50)));
}

}  // namespace
}  // namespace longhaul::fakeapi::testing
