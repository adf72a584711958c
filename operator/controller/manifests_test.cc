// The repository's TrainingJob manifests (examples/trainingjob-*.yaml) and the CRD agree with the
// C++ API: every example parses and is runnable, and every spec field the operator reads is
// declared in the CRD's schema with the same defaults.
#include "longhaul/testing/manifests.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "longhaul/api/trainingjob.h"
#include "longhaul/controller/children.h"

namespace longhaul::controller {
namespace {

namespace fs = std::filesystem;

fs::path source_dir() {
  const char* env = std::getenv("LONGHAUL_SOURCE_DIR");
  return env ? fs::path(env) : fs::path(LONGHAUL_TEST_SOURCE_DIR);
}

TEST(Manifests, EveryExampleTrainingJobParsesAndIsRunnable) {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(source_dir() / "examples")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("trainingjob-", 0) != 0 || entry.path().extension() != ".yaml") continue;
    for (const json& j : longhaul::testing::load_manifests(entry.path())) {
      if (j.value("kind", "") != "TrainingJob") continue;
      SCOPED_TRACE(name);
      EXPECT_EQ(j.value("apiVersion", ""), "longhaul.dev/v1alpha1");
      api::TrainingJobSpec spec;
      ASSERT_NO_THROW(spec = api::parse_spec(j["spec"]));
      EXPECT_NO_THROW(api::validate_runnable(spec, j["metadata"]["name"].get<std::string>()));
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no examples/trainingjob-*.yaml found under " << source_dir();
}

TEST(Manifests, CrdDeclaresTheFieldsAndDefaultsTheOperatorUses) {
  const json crd =
      longhaul::testing::load_manifests(source_dir() / "crds/trainingjobs.longhaul.dev.yaml").at(0);
  EXPECT_EQ(crd["spec"]["group"], "longhaul.dev");
  EXPECT_EQ(crd["spec"]["names"]["shortNames"], json::array({"tj"}));
  const json& version = crd["spec"]["versions"][0];
  EXPECT_EQ(version["name"], "v1alpha1");
  EXPECT_TRUE(version["served"].get<bool>() && version["storage"].get<bool>());
  EXPECT_TRUE(version["subresources"].contains("status"));
  std::vector<std::string> columns;
  for (const json& c : version["additionalPrinterColumns"]) columns.push_back(c["name"]);
  for (const char* c : {"Phase", "Chief", "Ready", "Restarts", "Preemptions", "Age"}) {
    EXPECT_NE(std::find(columns.begin(), columns.end(), c), columns.end()) << c;
  }
  const json& spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
  // Defaults in the schema equal the C++ defaults: serialise a defaulted spec and compare.
  const api::TrainingJobSpec defaults = api::parse_spec(json::parse(
      R"({"replicaSpecs": {"Worker": {"template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}}})"));
  const json d = api::to_json(defaults);
  for (const auto& [key, value] : d["runPolicy"].items()) {
    ASSERT_TRUE(spec["runPolicy"]["properties"].contains(key)) << "runPolicy." << key;
    if (key == "backoff") {
      for (const auto& [bk, bv] : value.items()) {
        EXPECT_EQ(spec["runPolicy"]["properties"]["backoff"]["properties"][bk]["default"], bv)
            << bk;
      }
    } else {
      EXPECT_EQ(spec["runPolicy"]["properties"][key]["default"], value) << "runPolicy." << key;
    }
  }
  for (const auto& [key, value] : d["logdir"].items()) {
    ASSERT_TRUE(spec["logdir"]["properties"].contains(key)) << "logdir." << key;
    EXPECT_EQ(spec["logdir"]["properties"][key]["default"], value) << "logdir." << key;
  }
  EXPECT_EQ(spec["successPolicy"]["default"], "ChiefSucceeds");
  // One schema for every replica type (a map, so that the server can refuse unknown types with
  // a CEL rule instead of pruning them); the Chief's limit of one is a CEL rule, checked on the
  // real API server by tests/envtest.
  const json& r = spec["replicaSpecs"]["additionalProperties"]["properties"];
  EXPECT_EQ(r["replicas"]["default"], 1);
  EXPECT_EQ(r["replicas"]["maximum"], 1000);
  EXPECT_EQ(r["restartPolicy"]["default"], "ExitCode");
  // Every status field the operator writes is in the schema (unknown fields would be pruned).
  api::TrainingJobStatus s;
  s.phase = "Running";
  s.ready = "1/1";
  s.failure_budget = "0/6";
  s.chief_pod = "x";
  s.next_restart_time = s.start_time = s.completion_time = "2026-11-21T13:00:00Z";
  s.pods["x"] = {};
  const json& status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
  const json written = api::to_json(s);
  for (const auto& [key, _] : written.items()) {
    EXPECT_TRUE(status.contains(key)) << "status." << key;
  }
}

}  // namespace
}  // namespace longhaul::controller
