// The flagship end-to-end scenario on the REAL API server (tests/envtest: etcd + kube-apiserver
// + kube-controller-manager): the longhaul-operator binary through the admin kubeconfig, the
// local kubelet registering and heartbeating its Nodes and running longhaul-worker processes,
// examples/trainingjob-tiny.yaml's Chief + Worker. The chief is preempted, then the worker, then
// the worker's node is lost; the job must end Succeeded with a valid logdir whose chief resumed
// at the checkpointed steps.
//
// What a real server does that the fake one does not, and how this copes: the logdir claim stays
// Pending (no provisioner; the operator does not wait for Bound and the kubelet maps the claim to
// a local folder); pods need the namespace's default ServiceAccount (fresh_namespace() waits for
// it); the controller manager's garbage collector removes what the job owns; the pod garbage
// collector deletes pods bound to unknown nodes (the kubelet registers its Nodes).
#include <filesystem>

#include <gtest/gtest.h>

#include <longhaul/api/trainingjob.h>
#include <longhaul/e2e/local_cluster.h>
#include <longhaul/envtest/gtest.h>
#include <longhaul/supervisor/checkpoint_state.h>
#include <longhaul/supervisor/safetensors.h>

#include "scenario_util.h"

namespace longhaul::e2e {
namespace {

namespace fs = std::filesystem;
namespace res = kube::resources;
using namespace std::chrono_literals;
using namespace longhaul::e2e::testing;

class RealEndToEnd : public envtest::RealServerTest {
 protected:
  void SetUp() override {
    envtest::RealServerTest::SetUp();
    if (IsSkipped()) return;
    ns = fresh_namespace();
    root = fresh_root(::testing::UnitTest::GetInstance()->current_test_info()->name());
    LocalClusterOptions o;
    o.root = root / "cluster";
    o.operator_binary = binary_dir() / "operator/cli/longhaul-operator";
    o.bin_dirs = {binary_dir() / "worker/cli"};
    o.nodes = {ns + "-node-0", ns + "-node-1", ns + "-node-2"};
    o.external_api = plane().admin_config();
    o.external_kubeconfig = plane().admin_kubeconfig();
    o.watch_namespace = ns;
    cluster = std::make_unique<LocalCluster>(o);
    cluster->start();
  }
  void TearDown() override {
    if (cluster) cluster->stop();
    if (!HasFailure() && !root.empty()) fs::remove_all(root);
  }

  std::optional<json> get(const kube::Resource& r, const std::string& name) {
    try {
      return cluster->client().get(r, ns, name);
    } catch (const kube::NotFoundError&) {
      return std::nullopt;
    }
  }
  api::TrainingJobStatus status() {
    auto job = get(res::kTrainingJobs, "tiny");
    return job ? api::parse_status(job->value("status", json::object())) : api::TrainingJobStatus{};
  }
  bool pod_running_at(const std::string& pod, int64_t attempt) {
    auto p = get(res::kPods, pod);
    if (!p || p->at("metadata").contains("deletionTimestamp")) return false;
    const std::string a = p->at("metadata")
                              .value("annotations", json::object())
                              .value(std::string(api::kAnnotationRestartAttempt), "");
    auto info = cluster->kubelet().pod(ns, pod);
    return a == std::to_string(attempt) &&
           p->value("status", json::object()).value("phase", "") == "Running" && info &&
           info->running;
  }
  std::string node_of(const std::string& pod) {
    auto p = get(res::kPods, pod);
    return p ? p->at("spec").value("nodeName", "") : "";
  }
  // Re-checks on every kubelet change and at least every 250 ms (reads go to the real server).
  bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      cluster->kubelet().wait_for([] { return false; }, 250ms);
    }
    return pred();
  }
  std::string context() {
    return "\njob status: " + api::to_json(status()).dump() + "\noperator log tail:\n" +
           tail(cluster->operator_log(), 3000) + "\nchief log tail:\n" +
           tail(cluster->kubelet().log_path(ns, "tiny-chief-0"), 3000);
  }

  std::string ns;
  fs::path root;
  std::unique_ptr<LocalCluster> cluster;
};

TEST_F(RealEndToEnd, ChiefAndWorkerSurvivePreemptionsAndANodeLossOnTheRealApiServer) {
  json job = tiny_job(/*with_worker=*/true);
  job["metadata"]["namespace"] = ns;
  for (const char* type : {"Chief", "Worker"}) {
    job["spec"]["replicaSpecs"][type]["template"]["spec"]["terminationGracePeriodSeconds"] = 5;
  }
  const int64_t max_steps = job_max_steps(job);
  cluster->apply(job);
  const fs::path logdir = cluster->claim_dir(ns, "tiny-logdir");
  const std::string chief = "tiny-chief-0", worker = "tiny-worker-0";
  auto latest = [&] { return latest_checkpoint_step(logdir).value_or(-1); };
  auto group_running = [&](int64_t attempt) {
    return pod_running_at(chief, attempt) && pod_running_at(worker, attempt);
  };

  ASSERT_TRUE(eventually([&] { return group_running(0) && latest() >= max_steps / 4; }, 240s))
      << context();
  // The claim stays Pending without a provisioner, and nothing waited for it.
  EXPECT_EQ(get(res::kPersistentVolumeClaims, "tiny-logdir")->at("status").value("phase", ""),
            "Pending");
  EXPECT_NE(node_of(chief), node_of(worker));
  const int64_t before_first = latest();
  cluster->kubelet().preempt(ns, chief);
  ASSERT_TRUE(eventually([&] { return status().preemption_count == 1 && group_running(1); }, 180s))
      << context();

  ASSERT_TRUE(eventually([&] { return latest() >= max_steps / 2; }, 240s)) << context();
  cluster->kubelet().preempt(ns, worker);
  ASSERT_TRUE(eventually([&] { return status().preemption_count == 2 && group_running(2); }, 180s))
      << context();

  ASSERT_TRUE(eventually([&] { return latest() >= 3 * max_steps / 4; }, 240s)) << context();
  const std::string lost = node_of(worker);
  ASSERT_NE(lost, node_of(chief));
  cluster->kubelet().lose_node(lost);
  ASSERT_TRUE(eventually([&] { return status().restart_attempt == 3 && group_running(3); }, 240s))
      << context();

  ASSERT_TRUE(eventually([&] { return status().phase == "Succeeded"; }, 300s)) << context();
  const api::TrainingJobStatus st = status();
  EXPECT_EQ(st.preemption_count, 2);
  EXPECT_EQ(st.restart_count, 3);
  EXPECT_EQ(st.ready, "0/2");

  auto state = supervisor::read_checkpoint_state(logdir);
  ASSERT_TRUE(state) << "no checkpoint state file in " << logdir;
  EXPECT_EQ(step_of(state->model_checkpoint_path), max_steps);
  for (const std::string& p : state->all_model_checkpoint_paths) {
    supervisor::SafetensorsReader r(checkpoint_file(logdir, p));
    EXPECT_NO_THROW(r.verify_all()) << p;
  }
  const std::vector<int64_t> starts =
      start_steps(read_text(cluster->kubelet().log_path(ns, chief)));
  ASSERT_EQ(starts.size(), 4u) << "chief process starts, from its log";
  EXPECT_EQ(starts[0], 0);
  EXPECT_GE(starts[1], before_first);
  EXPECT_EQ(session_start_steps(logdir), starts);
}

}  // namespace
}  // namespace longhaul::e2e
