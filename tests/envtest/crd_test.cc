// The TrainingJob CRD as a real API server sees it: it installs and becomes Established, every
// example passes server-side dry-run unchanged, the server applies the schema's defaults,
// invalid TrainingJobs are refused with a message naming the field (structural schema and CEL
// rules, also with field validation off, i.e. `kubectl apply --validate=false`), every field
// has a description for `kubectl explain`, and `kubectl get tj` (-o wide) shows the printer
// columns with the status values.
#include <ctime>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "longhaul/base/rfc3339.h"
#include "longhaul/envtest/gtest.h"

namespace longhaul::envtest {
namespace {

const std::string kJobs = "/apis/longhaul.dev/v1alpha1/namespaces/";

class CrdTest : public RealServerTest {
 protected:
  void SetUp() override {
    RealServerTest::SetUp();
    if (IsSkipped()) return;
    static bool installed = false;
    if (!installed) {
      plane().install_crd(source_dir() / "crds" / "trainingjobs.longhaul.dev.yaml");
      installed = true;
    }
  }
};

// RFC 3339 in UTC, second precision, as the operator writes times.
std::string api_time(std::chrono::system_clock::time_point t) { return format_rfc3339(t); }

json valid_job(const std::string& name) {
  const json tmpl = {
      {"spec", {{"containers", {{{"name", "trainer"}, {"image", "ghcr.io/x/worker:1"}}}}}}};
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"replicaSpecs",
             {{"Chief", {{"replicas", 1}, {"template", tmpl}}},
              {"Worker", {{"replicas", 2}, {"template", tmpl}}}}}}}};
}

TEST_F(CrdTest, IsEstablishedWithItsNamesAndServesTheStatusSubresource) {
  const json crd = plane().call("GET",
                                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                "trainingjobs.longhaul.dev");
  std::map<std::string, std::string> conditions;
  for (const json& c : crd["status"]["conditions"]) conditions[c["type"]] = c["status"];
  EXPECT_EQ(conditions["Established"], "True") << crd["status"].dump();
  EXPECT_EQ(conditions["NamesAccepted"], "True") << crd["status"].dump();
  EXPECT_NE(conditions["NonStructuralSchema"], "True") << crd["status"].dump();

  const json discovery = plane().call("GET", "/apis/longhaul.dev/v1alpha1");
  std::set<std::string> served;
  for (const json& r : discovery["resources"]) {
    served.insert(r["name"]);
    if (r["name"] == "trainingjobs") {
      EXPECT_EQ(r["shortNames"], json::array({"tj"}));
      EXPECT_EQ(r["categories"], json::array({"all"}));
    }
  }
  EXPECT_TRUE(served.contains("trainingjobs")) << discovery.dump();
  EXPECT_TRUE(served.contains("trainingjobs/status")) << discovery.dump();
}

TEST_F(CrdTest, EveryExamplePassesServerSideDryRunUnchanged) {
  const std::string ns = fresh_namespace();
  int jobs = 0;
  for (const auto& entry : fs::directory_iterator(source_dir() / "examples")) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("trainingjob-", 0) != 0 || entry.path().extension() != ".yaml") continue;
    for (const json& object : load_manifests(entry.path())) {
      SCOPED_TRACE(file + ": " + object.value("kind", "") + " " +
                   object["metadata"].value("name", ""));
      json answer;
      try {
        answer = plane().apply(object, ns, /*dry_run=*/true);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the API server refused " << file << ": " << e.what();
        continue;
      }
      if (object["kind"] == "TrainingJob") {
        ++jobs;
        // Nothing the example sets was pruned: every spec field comes back as written.
        for (const auto& [key, value] : object["spec"].items()) {
          if (value.is_object()) {
            for (const auto& [sub, subvalue] : value.items()) {
              EXPECT_EQ(answer["spec"][key][sub], subvalue) << "spec." << key << "." << sub;
            }
          } else {
            EXPECT_EQ(answer["spec"][key], value) << "spec." << key;
          }
        }
      }
    }
  }
  EXPECT_GE(jobs, 4) << "expected the four TrainingJob examples under examples/";
}

TEST_F(CrdTest, ServerAppliesTheSchemaDefaults) {
  const std::string ns = fresh_namespace();
  json job = valid_job("defaults");
  job["spec"]["replicaSpecs"]["Worker"].erase("replicas");
  const json created = plane().call("POST", kJobs + ns + "/trainingjobs", job);
  const json& spec = created["spec"];
  EXPECT_EQ(spec["replicaSpecs"]["Worker"]["replicas"], 1);
  EXPECT_EQ(spec["replicaSpecs"]["Worker"]["restartPolicy"], "ExitCode");
  EXPECT_EQ(spec["runPolicy"]["backoffLimit"], 6);
  EXPECT_EQ(spec["runPolicy"]["restartScope"], "Replica");
  EXPECT_EQ(spec["runPolicy"]["cleanPodPolicy"], "Running");
  EXPECT_EQ(spec["runPolicy"]["backoff"]["initialSeconds"], 10);
  EXPECT_EQ(spec["successPolicy"], "ChiefSucceeds");
  EXPECT_EQ(spec["progressIntervalSeconds"], 30);
}

// One invalid TrainingJob: how it differs from valid_job() and what the refusal must say.
struct Invalid {
  std::string name;
  std::function<void(json& spec)> mutate;
  std::string field;    // the field path the message names
  std::string message;  // and a fragment of what it says ("" = only the field)
};

void PrintTo(const Invalid& c, std::ostream* os) { *os << c.name; }

class InvalidJobTest : public CrdTest, public ::testing::WithParamInterface<Invalid> {};

void expect_refused(const ControlPlane& plane, const std::string& ns, const json& job,
                    const std::string& query, const Invalid& c) {
  const auto r = plane.request("POST", kJobs + ns + "/trainingjobs" + query, job.dump());
  ASSERT_EQ(r.status, 422) << "the API server accepted (or failed on) " << c.name << ": " << r.body;
  const std::string message = json::parse(r.body).value("message", "");
  EXPECT_NE(message.find(c.field), std::string::npos)
      << "the refusal does not name " << c.field << ": " << message;
  EXPECT_NE(message.find(c.message), std::string::npos)
      << "the refusal does not say \"" << c.message << "\": " << message;
}

TEST_P(InvalidJobTest, IsRefusedNamingTheField) {
  const Invalid& c = GetParam();
  const std::string ns = fresh_namespace();
  json job = valid_job("bad");
  c.mutate(job["spec"]);
  expect_refused(plane(), ns, job, "", c);
  // `kubectl apply --validate=false` (field validation Ignore) must not turn a refusal into a
  // silently pruned field.
  expect_refused(plane(), ns, job, "?fieldValidation=Ignore", c);
}

json template_of(const json& spec) { return spec["replicaSpecs"]["Worker"]["template"]; }

INSTANTIATE_TEST_SUITE_P(
    Table, InvalidJobTest,
    ::testing::Values(
        Invalid{"UnknownReplicaType",
                [](json& s) {
                  s["replicaSpecs"]["Master"] = {{"replicas", 1}, {"template", template_of(s)}};
                },
                "spec.replicaSpecs", "Chief, Worker, PS or Evaluator"},
        Invalid{"OnlyAnUnknownReplicaType",
                [](json& s) {
                  s["replicaSpecs"] = {{"Master", {{"template", template_of(s)}}}};
                },
                "spec.replicaSpecs", "Chief, Worker, PS or Evaluator"},
        Invalid{"NoChiefNorWorker",
                [](json& s) {
                  s["replicaSpecs"] = {{"PS", {{"template", template_of(s)}}}};
                },
                "spec.replicaSpecs", "needs a Chief or a Worker"},
        Invalid{"EmptyReplicaSpecs", [](json& s) { s["replicaSpecs"] = json::object(); },
                "spec.replicaSpecs", ""},
        Invalid{"MissingReplicaSpecs", [](json& s) { s.erase("replicaSpecs"); },
                "spec.replicaSpecs", "Required"},
        Invalid{"TwoChiefs", [](json& s) { s["replicaSpecs"]["Chief"]["replicas"] = 2; },
                "spec.replicaSpecs", "at most one Chief"},
        Invalid{"MoreThan1000Replicas",
                [](json& s) { s["replicaSpecs"]["Worker"]["replicas"] = 1001; },
                "spec.replicaSpecs.Worker.replicas", "1000"},
        Invalid{"NegativeReplicas", [](json& s) { s["replicaSpecs"]["Worker"]["replicas"] = -1; },
                "spec.replicaSpecs.Worker.replicas", "0"},
        Invalid{"ReplicasNotAnInteger",
                [](json& s) { s["replicaSpecs"]["Worker"]["replicas"] = "two"; },
                "spec.replicaSpecs.Worker.replicas", "integer"},
        Invalid{"MissingTemplate", [](json& s) { s["replicaSpecs"]["Worker"].erase("template"); },
                "spec.replicaSpecs.Worker.template", "Required"},
        Invalid{"UnknownRestartPolicy",
                [](json& s) { s["replicaSpecs"]["Worker"]["restartPolicy"] = "Always"; },
                "spec.replicaSpecs.Worker.restartPolicy", "Always"},
        Invalid{"ClaimNameAndStorageClass",
                [](json& s) {
                  s["logdir"] = {{"claimName", "data"}, {"storageClassName", "fast"}};
                },
                "spec.logdir", "either claimName"},
        Invalid{"SizeNotAQuantity",
                [](json& s) {
                  s["logdir"] = {{"size", "ten gigs"}};
                },
                "spec.logdir.size", ""},
        Invalid{"UnknownAccessMode",
                [](json& s) {
                  s["logdir"] = {{"accessModes", {"ReadWriteEverywhere"}}};
                },
                "spec.logdir.accessModes[0]", "ReadWriteEverywhere"},
        Invalid{"UnknownReclaimPolicy",
                [](json& s) {
                  s["logdir"] = {{"reclaimPolicy", "Recycle"}};
                },
                "spec.logdir.reclaimPolicy", "Recycle"},
        Invalid{"NegativeBackoffLimit",
                [](json& s) {
                  s["runPolicy"] = {{"backoffLimit", -1}};
                },
                "spec.runPolicy.backoffLimit", ""},
        Invalid{"BackoffLimitBeyondInt32",
                [](json& s) {
                  s["runPolicy"] = {{"backoffLimit", 2147483648LL}};
                },
                "spec.runPolicy.backoffLimit", "2147483647"},
        Invalid{"BackoffMaxSecondsBeyondInt32",
                [](json& s) {
                  s["runPolicy"] = {{"backoff", {{"maxSeconds", 4294967296LL}}}};
                },
                "spec.runPolicy.backoff.maxSeconds", "2147483647"},
        Invalid{"ExitCodeZeroIsNotRetryable",
                [](json& s) {
                  s["runPolicy"] = {{"retryableExitCodes", {0}}};
                },
                "spec.runPolicy.retryableExitCodes[0]", ""},
        Invalid{"ExitCodeAbove255",
                [](json& s) {
                  s["runPolicy"] = {{"permanentExitCodes", {2, 256}}};
                },
                "spec.runPolicy.permanentExitCodes[1]", ""},
        Invalid{"UnknownRestartScope",
                [](json& s) {
                  s["runPolicy"] = {{"restartScope", "Node"}};
                },
                "spec.runPolicy.restartScope", "Node"},
        Invalid{"NegativeBackoffSeconds",
                [](json& s) {
                  s["runPolicy"] = {{"backoff", {{"initialSeconds", -5}}}};
                },
                "spec.runPolicy.backoff.initialSeconds", ""},
        Invalid{"ZeroActiveDeadline",
                [](json& s) {
                  s["runPolicy"] = {{"activeDeadlineSeconds", 0}};
                },
                "spec.runPolicy.activeDeadlineSeconds", ""},
        Invalid{"NegativeTtl",
                [](json& s) {
                  s["runPolicy"] = {{"ttlSecondsAfterFinished", -1}};
                },
                "spec.runPolicy.ttlSecondsAfterFinished", ""},
        Invalid{"UnknownCleanPodPolicy",
                [](json& s) {
                  s["runPolicy"] = {{"cleanPodPolicy", "Some"}};
                },
                "spec.runPolicy.cleanPodPolicy", "Some"},
        Invalid{"SuspendNotABoolean",
                [](json& s) {
                  s["runPolicy"] = {{"suspend", "yes"}};
                },
                "spec.runPolicy.suspend", ""},
        Invalid{"UnknownSuccessPolicy", [](json& s) { s["successPolicy"] = "AnyWorker"; },
                "spec.successPolicy", "AnyWorker"},
        Invalid{"ProgressIntervalBelowTheMinimum",
                [](json& s) { s["progressIntervalSeconds"] = 1; }, "spec.progressIntervalSeconds",
                "greater than or equal to 5"}),
    [](const ::testing::TestParamInfo<Invalid>& info) { return info.param.name; });

TEST_F(CrdTest, AJobWithoutSpecIsRefused) {
  const std::string ns = fresh_namespace();
  json job = valid_job("nospec");
  job.erase("spec");
  const auto r = plane().request("POST", kJobs + ns + "/trainingjobs", job.dump());
  ASSERT_EQ(r.status, 422) << r.body;
  EXPECT_NE(json::parse(r.body).value("message", "").find("spec"), std::string::npos) << r.body;
}

// What `kubectl explain trainingjob.spec...` prints comes from the published OpenAPI: every
// field there must carry a description.
void collect_undescribed(const json& schema, const std::string& path,
                         std::vector<std::string>& missing) {
  if (!schema.is_object()) return;
  if (schema.contains("properties")) {
    for (const auto& [key, field] : schema["properties"].items()) {
      const std::string p = path + "." + key;
      if (field.value("description", "").empty()) missing.push_back(p);
      collect_undescribed(field, p, missing);
    }
  }
  if (schema.contains("additionalProperties") && schema["additionalProperties"].is_object()) {
    const json& value = schema["additionalProperties"];
    if (value.contains("properties") && value.value("description", "").empty()) {
      missing.push_back(path + ".<value>");
    }
    collect_undescribed(value, path + ".<value>", missing);
  }
  if (schema.contains("items")) {
    const json& item = schema["items"];
    if (item.contains("properties") && item.value("description", "").empty()) {
      missing.push_back(path + "[]");
    }
    collect_undescribed(item, path + "[]", missing);
  }
}

TEST_F(CrdTest, EveryFieldHasADescriptionForKubectlExplain) {
  // The API server publishes a new CRD's OpenAPI asynchronously, shortly after Established.
  const std::string key = "dev.longhaul.v1alpha1.TrainingJob";
  json job;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (job.is_null() && std::chrono::steady_clock::now() < deadline) {
    const json openapi = plane().call("GET", "/openapi/v2");
    if (openapi["definitions"].contains(key)) {
      job = openapi["definitions"][key];
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  ASSERT_FALSE(job.is_null()) << "the TrainingJob was not in the published OpenAPI after 60 s";
  EXPECT_FALSE(job.value("description", "").empty());
  std::vector<std::string> missing;
  collect_undescribed(job, "trainingjob", missing);
  EXPECT_TRUE(missing.empty()) << "fields without a description (kubectl explain shows nothing):\n"
                               << ::testing::PrintToString(missing);
  // The walk reached the leaves: a field deep inside spec and one inside status.
  EXPECT_TRUE(
      job["properties"]["spec"]["properties"]["runPolicy"]["properties"]["backoff"]["properties"]
          .contains("maxSeconds"));
  EXPECT_TRUE(job["properties"]["status"]["properties"].contains("failureBudget"));
}

TEST_F(CrdTest, KubectlGetShowsThePrinterColumnsWithStatusValues) {
  const std::string ns = fresh_namespace();
  json created = plane().call("POST", kJobs + ns + "/trainingjobs", valid_job("columns"));
  // The last checkpoint 3 days ago (kubectl shows "3d" for 3 days and a few seconds), as the
  // operator writes status.progress.
  const std::string checkpoint_time =
      api_time(std::chrono::system_clock::now() - std::chrono::hours(72));
  created["status"] = {
      {"phase", "Running"},
      {"chiefPod", "columns-chief-0"},
      {"ready", "3/3"},
      {"restartCount", 4},
      {"preemptionCount", 2},
      {"failureCount", 1},
      {"failureBudget", "1/6"},
      {"observedGeneration", 1},
      {"progress",
       {{"step", 1200},
        {"maxSteps", 5000},
        {"steps", "1200/5000"},
        {"lastCheckpointStep", 1000},
        {"lastCheckpointTime", checkpoint_time},
        {"observedTime", api_time(std::chrono::system_clock::now())},
        {"pod", "columns-chief-0"},
        {"stepsPerSecond", 2.5},
        {"eta", "26m40s"},
        {"estimatedCompletionTime",
         api_time(std::chrono::system_clock::now() + std::chrono::minutes(26))},
        {"lastStepTime", api_time(std::chrono::system_clock::now() - std::chrono::minutes(5))}}}};
  const json stored = plane().call("PUT", kJobs + ns + "/trainingjobs/columns/status", created);
  EXPECT_EQ(stored["status"]["progress"], created["status"]["progress"])
      << "the server pruned or changed status.progress";

  // What `kubectl get tj` / `-o wide` ask for: the server-side Table.
  const auto r = plane().request("GET", kJobs + ns + "/trainingjobs/columns", "", "",
                                 "application/json;as=Table;v=v1;g=meta.k8s.io");
  ASSERT_EQ(r.status, 200) << r.body;
  const json table = json::parse(r.body);
  ASSERT_EQ(table.value("kind", ""), "Table") << r.body;
  std::vector<std::string> names;
  std::map<std::string, int> priority;
  for (const json& c : table["columnDefinitions"]) {
    names.push_back(c["name"]);
    priority[c["name"]] = c.value("priority", 0);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"Name", "Phase", "Step", "Last-Ckpt", "ETA", "Rate",
                                             "Last-Step", "Chief", "Ready", "Restarts",
                                             "Preemptions", "Failures", "Age"}));
  EXPECT_EQ(priority["Failures"], 1) << "FAILURES belongs to -o wide only";
  EXPECT_EQ(priority["Phase"], 0);
  EXPECT_EQ(priority["Step"], 0) << "STEP belongs to the default view";
  EXPECT_EQ(priority["Last-Ckpt"], 0);
  EXPECT_EQ(priority["ETA"], 0) << "ETA belongs to the default view";
  EXPECT_EQ(priority["Rate"], 1) << "RATE belongs to -o wide only";
  EXPECT_EQ(priority["Last-Step"], 1) << "LAST-STEP belongs to -o wide only";
  ASSERT_EQ(table["rows"].size(), 1u);
  const json& cells = table["rows"][0]["cells"];
  ASSERT_EQ(cells.size(), names.size());
  EXPECT_EQ(cells[0], "columns");
  EXPECT_EQ(cells[1], "Running");
  EXPECT_EQ(cells[2], "1200/5000");
  EXPECT_EQ(cells[3], "3d") << "LAST-CKPT is the checkpoint's age";
  EXPECT_EQ(cells[4], "26m40s");
  EXPECT_EQ(cells[5], 2.5);
  EXPECT_TRUE(std::regex_match(cells[6].get<std::string>(), std::regex("5m([0-9]+s)?")))
      << "LAST-STEP is the age of the last step: " << cells[6];
  EXPECT_EQ(cells[7], "columns-chief-0");
  EXPECT_EQ(cells[8], "3/3");
  EXPECT_EQ(cells[9], 4);
  EXPECT_EQ(cells[10], 2);
  EXPECT_EQ(cells[11], "1/6");
  EXPECT_TRUE(std::regex_match(cells[12].get<std::string>(), std::regex("[0-9]+s")))
      << "AGE: " << cells[12];

  // A job whose chief has not been read yet: the columns are empty, not an error.
  plane().call("POST", kJobs + ns + "/trainingjobs", valid_job("fresh"));
  const auto fresh = plane().request("GET", kJobs + ns + "/trainingjobs/fresh", "", "",
                                     "application/json;as=Table;v=v1;g=meta.k8s.io");
  ASSERT_EQ(fresh.status, 200) << fresh.body;
  const json fresh_cells = json::parse(fresh.body)["rows"][0]["cells"];
  EXPECT_TRUE(fresh_cells[2].is_null() || fresh_cells[2] == "") << fresh_cells;
  EXPECT_TRUE(fresh_cells[3].is_null() || fresh_cells[3] == "" || fresh_cells[3] == "<unknown>")
      << fresh_cells;
  EXPECT_TRUE(fresh_cells[4].is_null() || fresh_cells[4] == "") << fresh_cells;
}

// status.progress values the server must refuse (the operator never writes them).
TEST_F(CrdTest, StatusProgressIsValidated) {
  const std::string ns = fresh_namespace();
  json created = plane().call("POST", kJobs + ns + "/trainingjobs", valid_job("progress"));
  created["status"] = {{"progress", {{"step", -1}}}};
  auto r = plane().request("PUT", kJobs + ns + "/trainingjobs/progress/status", created.dump());
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("status.progress.step"), std::string::npos) << r.body;
  created["status"] = {{"progress", {{"step", 3}, {"lastCheckpointTime", "yesterday"}}}};
  r = plane().request("PUT", kJobs + ns + "/trainingjobs/progress/status", created.dump());
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("status.progress.lastCheckpointTime"), std::string::npos) << r.body;
  created["status"] = {{"progress", {{"step", 3}, {"stepsPerSecond", -1.5}}}};
  r = plane().request("PUT", kJobs + ns + "/trainingjobs/progress/status", created.dump());
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("status.progress.stepsPerSecond"), std::string::npos) << r.body;
  created["status"] = {{"progress", {{"step", 3}, {"lastStepTime", "just now"}}}};
  r = plane().request("PUT", kJobs + ns + "/trainingjobs/progress/status", created.dump());
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("status.progress.lastStepTime"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace longhaul::envtest
