// Manifests as `longhaul-local-cluster` applies them: YAML with Kubernetes' scalar typing, and the
// tiny example the scenario and the demo run.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <longhaul/base/error.h>
#include <longhaul/e2e/local_cluster.h>

namespace longhaul::e2e {
namespace {

TEST(YamlToJson, TypesPlainScalarsAndKeepsQuotedOnesStrings) {
  const json j = yaml_to_json(YAML::Load(
      "a: 1\nb: -2\nc: 0.5\nd: true\ne: ~\nf: \"3\"\ng: 1e-3\nh: text\ni: '0.1'\nj: [1, x]\n"
      "k: 1.0e-08\nl: 007\n"));
  EXPECT_EQ(j["a"], 1);
  EXPECT_EQ(j["b"], -2);
  EXPECT_DOUBLE_EQ(j["c"].get<double>(), 0.5);
  EXPECT_EQ(j["d"], true);
  EXPECT_TRUE(j["e"].is_null());
  EXPECT_EQ(j["f"], "3");
  EXPECT_DOUBLE_EQ(j["g"].get<double>(), 1e-3);
  EXPECT_EQ(j["h"], "text");
  EXPECT_EQ(j["i"], "0.1");
  EXPECT_EQ(j["j"], json::array({1, "x"}));
  EXPECT_DOUBLE_EQ(j["k"].get<double>(), 1e-8);
  EXPECT_EQ(j["l"], "007");  // not a YAML 1.2 integer: kept as written
}

TEST(YamlToJson, ResolvesAnchorsAndAliases) {
  const json j = yaml_to_json(YAML::Load("a: &spec {x: 1, y: [2]}\nb: *spec\n"));
  EXPECT_EQ(j["a"], j["b"]);
  EXPECT_EQ(j["b"]["y"], json::array({2}));
}

TEST(LoadManifests, TheTinyExampleIsAChiefAndAWorkerOfOneContainerOnlyTheChiefServingMetrics) {
  const auto docs = load_manifests(std::filesystem::path(LONGHAUL_TEST_SOURCE_DIR) /
                                   "examples/trainingjob-tiny.yaml");
  ASSERT_EQ(docs.size(), 1u);
  const json& job = docs[0];
  EXPECT_EQ(job["kind"], "TrainingJob");
  EXPECT_EQ(resource_for(job).plural, "trainingjobs");
  const json& specs = job["spec"]["replicaSpecs"];
  EXPECT_EQ(specs["Chief"]["replicas"], 1);
  EXPECT_EQ(specs["Worker"]["replicas"], 1);
  // The same container, but only the Chief serves /metrics (the operator reads its progress):
  // replicas that run as processes of one machine cannot all bind one port.
  json chief = specs["Chief"]["template"];
  json& container = chief["spec"]["containers"][0];
  EXPECT_EQ(container["ports"], json::parse(R"([{"name": "metrics", "containerPort": 9400}])"));
  container.erase("ports");
  json args = json::array();
  for (const json& a : container["args"]) {
    if (a != "--metrics-port=9400") args.push_back(a);
  }
  container["args"] = args;
  EXPECT_EQ(chief, specs["Worker"]["template"]);
  EXPECT_EQ(specs["Chief"]["template"]["spec"]["terminationGracePeriodSeconds"], 30);
}

TEST(LoadManifests, ErrorsNameTheFile) {
  EXPECT_THROW(load_manifests("/nonexistent/x.yaml"), NotFound);
}

TEST(ResourceFor, MapsCoreAndGroupKinds) {
  const auto cm = resource_for({{"apiVersion", "v1"}, {"kind", "ConfigMap"}});
  EXPECT_EQ(cm.collection_path("default"), "/api/v1/namespaces/default/configmaps");
  const auto pvc = resource_for({{"apiVersion", "v1"}, {"kind", "PersistentVolumeClaim"}});
  EXPECT_EQ(pvc.plural, "persistentvolumeclaims");
  const auto lease = resource_for({{"apiVersion", "coordination.k8s.io/v1"}, {"kind", "Lease"}});
  EXPECT_EQ(lease.collection_path("ns"), "/apis/coordination.k8s.io/v1/namespaces/ns/leases");
  EXPECT_THROW(resource_for({{"kind", "Pod"}}), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::e2e
