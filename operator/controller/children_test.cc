// Tests of the objects a TrainingJob owns: pod names, labels, env (TF_CONFIG in Kubeflow's
// format), mounts, owner references; the headless Service; the logdir claim.
#include "longhaul/controller/children.h"

#include <gtest/gtest.h>

namespace longhaul::controller {
namespace {

using api::ReplicaType;

json job_doc() {
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", "gpt"}, {"namespace", "ml"}, {"uid", "u-1"}}},
          {"spec", json::parse(R"({"replicaSpecs": {
             "Chief": {"template": {"metadata": {"labels": {"team": "a"}},
                "spec": {"containers": [{"name": "c", "image": "i",
                  "ports": [{"name": "metrics", "containerPort": 9090},
                            {"name": "longhaul", "containerPort": 3333}]}]}}},
             "Worker": {"replicas": 2, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [{"name": "w", "image": "i",
                  "env": [{"name": "LONGHAUL_RANK", "value": "99"}, {"name": "X", "value": "y"}]}]}}},
             "PS": {"template": {"spec": {"containers": [{"name": "p", "image": "i",
                  "ports": [{"containerPort": 5000}]}]}}}}})")}};
}

std::map<std::string, std::string> env_of(const json& pod) {
  std::map<std::string, std::string> env;
  for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e["value"];
  return env;
}

TEST(Children, PortsComeFromTheNamedPortThenTheFirstThenDefault) {
  const auto spec = api::parse_spec(job_doc()["spec"]);
  EXPECT_EQ(replica_port(spec.replica_specs.at(ReplicaType::kChief)), 3333);
  EXPECT_EQ(replica_port(spec.replica_specs.at(ReplicaType::kPS)), 5000);
  EXPECT_EQ(replica_port(spec.replica_specs.at(ReplicaType::kWorker)), 2222);
}

TEST(Children, TfConfigListsEveryReplicaTypeWithStableDnsNames) {
  const auto spec = api::parse_spec(job_doc()["spec"]);
  const json tf = tf_config("gpt", "ml", spec, ReplicaType::kWorker, 1);
  EXPECT_EQ(tf["cluster"]["chief"], json::array({"gpt-chief-0.gpt.ml.svc:3333"}));
  EXPECT_EQ(tf["cluster"]["worker"],
            json::array({"gpt-worker-0.gpt.ml.svc:2222", "gpt-worker-1.gpt.ml.svc:2222"}));
  EXPECT_EQ(tf["cluster"]["ps"], json::array({"gpt-ps-0.gpt.ml.svc:5000"}));
  EXPECT_EQ(tf["task"], json({{"type", "worker"}, {"index", 1}}));
  EXPECT_EQ(tf["environment"], "cloud");
}

TEST(Children, WorkerPodCarriesIdentityEnvMountAndOwner) {
  const json job = job_doc();
  const auto spec = api::parse_spec(job["spec"]);
  const json pod = build_pod(job, spec, ReplicaType::kWorker, 1, 4);
  EXPECT_EQ(pod["metadata"]["name"], "gpt-worker-1");
  EXPECT_EQ(pod["metadata"]["namespace"], "ml");
  EXPECT_EQ(pod["metadata"]["labels"]["longhaul.dev/job-name"], "gpt");
  EXPECT_EQ(pod["metadata"]["labels"]["longhaul.dev/replica-type"], "worker");
  EXPECT_EQ(pod["metadata"]["labels"]["longhaul.dev/replica-index"], "1");
  EXPECT_FALSE(pod["metadata"]["labels"].contains("longhaul.dev/role"));
  EXPECT_EQ(pod["metadata"]["annotations"]["longhaul.dev/restart-attempt"], "4");
  const json& owner = pod["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["uid"], "u-1");
  EXPECT_EQ(owner["kind"], "TrainingJob");
  EXPECT_EQ(owner["controller"], true);
  EXPECT_EQ(pod["spec"]["hostname"], "gpt-worker-1");
  EXPECT_EQ(pod["spec"]["subdomain"], "gpt");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "OnFailure");
  EXPECT_EQ(pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "gpt-logdir");
  EXPECT_EQ(pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/logdir");
  const auto env = env_of(pod);
  EXPECT_EQ(env.at("LONGHAUL_JOB_NAME"), "gpt");
  EXPECT_EQ(env.at("LONGHAUL_REPLICA_TYPE"), "worker");
  EXPECT_EQ(env.at("LONGHAUL_REPLICA_INDEX"), "1");
  EXPECT_EQ(env.at("LONGHAUL_RANK"), "2");  // chief 0, worker-0 1, worker-1 2 (template overridden)
  EXPECT_EQ(env.at("LONGHAUL_WORLD_SIZE"), "3");
  EXPECT_EQ(env.at("LONGHAUL_CHIEF_ADDRESS"), "gpt-chief-0.gpt.ml.svc:3333");
  EXPECT_EQ(env.at("LONGHAUL_RESTART_ATTEMPT"), "4");
  EXPECT_EQ(env.at("LONGHAUL_LOGDIR"), "/logdir");
  EXPECT_EQ(env.at("X"), "y");
  EXPECT_EQ(json::parse(env.at("TF_CONFIG"))["task"]["index"], 1);
}

TEST(Children, ChiefPodIsLabelledAndKeepsTemplateLabels) {
  const json job = job_doc();
  const auto spec = api::parse_spec(job["spec"]);
  const json pod = build_pod(job, spec, ReplicaType::kChief, 0, 0);
  EXPECT_EQ(pod["metadata"]["labels"]["longhaul.dev/role"], "chief");
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "a");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(env_of(pod).at("LONGHAUL_RANK"), "0");
}

TEST(Children, WorkerZeroIsChiefWithoutAChiefReplica) {
  json job = job_doc();
  job["spec"]["replicaSpecs"].erase("Chief");
  const auto spec = api::parse_spec(job["spec"]);
  const json pod = build_pod(job, spec, ReplicaType::kWorker, 0, 0);
  EXPECT_EQ(pod["metadata"]["labels"]["longhaul.dev/role"], "chief");
  EXPECT_EQ(env_of(pod).at("LONGHAUL_RANK"), "0");
  EXPECT_EQ(env_of(pod).at("LONGHAUL_WORLD_SIZE"), "2");
}

TEST(Children, HeadlessServicePublishesNotReadyPods) {
  const json job = job_doc();
  const json svc = build_service(job, api::parse_spec(job["spec"]));
  EXPECT_EQ(svc["metadata"]["name"], "gpt");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(svc["spec"]["selector"]["longhaul.dev/job-name"], "gpt");
  EXPECT_EQ(svc["spec"]["ports"].size(), 3u);  // 3333, 2222, 5000
  EXPECT_EQ(svc["metadata"]["ownerReferences"][0]["uid"], "u-1");
}

TEST(Children, ClaimIsOwnedOnlyWhenReclaimPolicyIsDelete) {
  json job = job_doc();
  json claim = build_claim(job, api::parse_spec(job["spec"]));
  EXPECT_EQ(claim["metadata"]["name"], "gpt-logdir");
  EXPECT_FALSE(claim["metadata"].contains("ownerReferences"));
  EXPECT_EQ(claim["spec"]["accessModes"], json::array({"ReadWriteMany"}));
  EXPECT_EQ(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
  job["spec"]["logdir"] = {{"reclaimPolicy", "Delete"}, {"storageClassName", "fast"}};
  claim = build_claim(job, api::parse_spec(job["spec"]));
  EXPECT_EQ(claim["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_EQ(claim["spec"]["storageClassName"], "fast");
}

TEST(Children, ExistingClaimIsMountedByName) {
  json job = job_doc();
  job["spec"]["logdir"] = {{"claimName", "shared"}, {"mountPath", "/runs"}};
  const auto spec = api::parse_spec(job["spec"]);
  const json pod = build_pod(job, spec, ReplicaType::kPS, 0, 0);
  EXPECT_EQ(pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "shared");
  EXPECT_EQ(pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/runs");
  EXPECT_EQ(env_of(pod).at("LONGHAUL_RANK"), "-1");
}

}  // namespace
}  // namespace longhaul::controller
