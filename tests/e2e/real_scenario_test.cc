// The flagship end-to-end scenario on the REAL API server (tests/envtest: etcd + kube-apiserver
// + kube-controller-manager): the longhaul-operator binary through the admin kubeconfig, the
// local kubelet registering and heartbeating its Nodes and running longhaul-worker processes,
// examples/trainingjob-tiny.yaml's Chief + Worker. The chief is preempted, then the worker, then
// the worker's node is lost; the job must end Succeeded with a valid logdir whose chief resumed
// at the checkpointed steps. With restartScope Replica (the default) the same three faults must
// each re-create only the lost pod while the survivors keep theirs and regroup in place.
//
// What a real server does that the fake one does not, and how this copes: the logdir claim stays
// Pending (no provisioner; the operator does not wait for Bound and the kubelet maps the claim to
// a local folder); pods need the namespace's default ServiceAccount (fresh_namespace() waits for
// it); the controller manager's garbage collector removes what the job owns; the pod garbage
// collector deletes pods bound to unknown nodes (the kubelet registers its Nodes).
#include <filesystem>
#include <mutex>

#include <gtest/gtest.h>

#include <longhaul/api/trainingjob.h>
#include <longhaul/e2e/local_cluster.h>
#include <longhaul/envtest/gtest.h>
#include <longhaul/kube/informer.h>
#include <longhaul/supervisor/checkpoint_state.h>

#include "longhaul/testing/test_temp_dir.h"
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
  // The uid of the pod when it is Running in the API, not being deleted, and its process runs
  // here; "" otherwise.
  std::string running_uid(const std::string& pod) {
    auto p = get(res::kPods, pod);
    if (!p || p->at("metadata").contains("deletionTimestamp")) return "";
    if (p->value("status", json::object()).value("phase", "") != "Running") return "";
    const std::string uid = p->at("metadata").value("uid", "");
    auto info = cluster->kubelet().pod(ns, pod);
    return info && info->running && info->uid == uid ? uid : "";
  }
  std::string context() {
    return "\njob status: " + api::to_json(status()).dump() + "\noperator log tail:\n" +
           tail(cluster->operator_log(), 3000) + "\nchief log tail:\n" +
           tail(cluster->kubelet().log_path(ns, "tiny-chief-0"), 3000);
  }

  std::string ns;
  // Left on disk (its path on stderr) when the test failed, for its logs and logdirs.
  longhaul::testing::TestTempDir root{"e2e"};
  std::unique_ptr<LocalCluster> cluster;
};

TEST_F(RealEndToEnd, ChiefAndWorkerSurvivePreemptionsAndANodeLossOnTheRealApiServer) {
  json job = tiny_job(/*with_worker=*/true);
  job["metadata"]["namespace"] = ns;
  set_grace_period_5s(job);
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

  ASSERT_TRUE(verified_final_checkpoints(logdir, max_steps));
  const std::vector<int64_t> starts =
      start_steps(read_text(cluster->kubelet().log_path(ns, chief)));
  ASSERT_EQ(starts.size(), 4u) << "chief process starts, from its log";
  EXPECT_EQ(starts[0], 0);
  EXPECT_GE(starts[1], before_first);
  EXPECT_EQ(session_start_steps(logdir), starts);
}

// Every status of one TrainingJob in the order the API server reported it, from a watch: what
// `kubectl get tj -w` shows, including states that last less than a poll interval (a Recovering
// condition that is True for a few hundred milliseconds).
class StatusHistory {
 public:
  StatusHistory(std::shared_ptr<kube::Client> client, const std::string& ns,
                const std::string& name)
      : informer_(std::move(client),
                  kube::InformerOptions{.resource = res::kTrainingJobs,
                                        .ns = ns,
                                        .field_selector = "metadata.name=" + name}) {
    auto record = [this](const json& job) {
      std::lock_guard lock(mu_);
      statuses_.push_back(api::parse_status(job.value("status", json::object())));
    };
    informer_.add_handlers({.on_add = record,
                            .on_update = [record](const json&, const json& job) { record(job); },
                            .on_delete = {}});
    informer_.start();
  }
  ~StatusHistory() { informer_.stop(); }
  std::vector<api::TrainingJobStatus> statuses() const {
    std::lock_guard lock(mu_);
    return statuses_;
  }
  // The Recovering condition's status through the history, repeats collapsed ("" = absent).
  std::vector<std::string> recovering() const {
    std::vector<std::string> out;
    for (const api::TrainingJobStatus& s : statuses()) {
      const auto* c = api::find_condition(s, api::condition::kRecovering);
      const std::string v = c ? c->status : "";
      if (out.empty() || out.back() != v) out.push_back(v);
    }
    if (!out.empty() && out.front().empty()) out.erase(out.begin());
    return out;
  }

 private:
  kube::Informer informer_;
  mutable std::mutex mu_;
  std::vector<api::TrainingJobStatus> statuses_;  // guarded by mu_
};

// restartScope Replica (the default) on the real API server, workers regrouping in place
// (supervisor.on_peer_loss: regroup, the default): the worker is preempted, later the chief, later
// the worker's node is lost (its pod evicted and force-deleted). Each time only the lost pod is
// re-created, the other keeps its pod (same uid) and its process, nobody reads a checkpoint, and
// the training step never goes back; the job succeeds, status counts three recoveries and the
// Recovering condition went True then False for each. What the replacement of a lost chief does
// inside the group (rank 0 again, or a worker while the lowest survivor takes over) is not
// assumed: only what users see.
TEST_F(RealEndToEnd, ReplicaScopeReplacesOnlyTheLostPodsOnTheRealApiServer) {
  json job = tiny_job(/*with_worker=*/true);
  job["metadata"]["namespace"] = ns;
  job["spec"]["runPolicy"]["restartScope"] = "Replica";
  set_grace_period_5s(job);
  regroup_on_peer_loss(job);
  // The chief pod serves its metrics, so status.progress (the STEP column) follows the run.
  serve_chief_metrics(job);
  const int64_t max_steps = job_max_steps(job);
  StatusHistory history(std::make_shared<kube::HttpClient>(plane().admin_config()), ns, "tiny");
  cluster->apply(job);
  const fs::path logdir = cluster->claim_dir(ns, "tiny-logdir");
  const std::string chief = "tiny-chief-0", worker = "tiny-worker-0";
  auto latest = [&] { return latest_checkpoint_step(logdir).value_or(-1); };
  // Waits until the job reports `n` recoveries, the group is whole again (Recovering False) and
  // `lost` runs as a new pod; then the survivor must still be the same pod.
  auto replaced_alone = [&](const std::string& lost, const std::string& lost_uid,
                            const std::string& survivor, const std::string& survivor_uid, int n) {
    ASSERT_TRUE(eventually(
        [&] {
          const auto s = status();
          const auto* c = api::find_condition(s, api::condition::kRecovering);
          const std::string uid = running_uid(lost);
          return s.recoveries == n && c && c->status == "False" && !uid.empty() && uid != lost_uid;
        },
        240s))
        << "recovery " << n << context();
    EXPECT_EQ(running_uid(survivor), survivor_uid)
        << survivor << " was re-created or stopped running in recovery " << n;
  };

  ASSERT_TRUE(eventually(
      [&] {
        return !running_uid(chief).empty() && !running_uid(worker).empty() &&
               latest() >= max_steps / 4;
      },
      240s))
      << context();
  ASSERT_NE(node_of(chief), node_of(worker));

  // 1. The worker is preempted.
  std::string chief_uid = running_uid(chief), worker_uid = running_uid(worker);
  cluster->kubelet().preempt(ns, worker);
  replaced_alone(worker, worker_uid, chief, chief_uid, 1);
  if (HasFatalFailure()) return;
  RecordProperty("worker_preempted_recovery_ms", status().last_recovery_milliseconds.value_or(-1));

  // 2. Later the chief is preempted.
  ASSERT_TRUE(eventually([&] { return latest() >= max_steps / 2; }, 240s)) << context();
  chief_uid = running_uid(chief);
  worker_uid = running_uid(worker);
  cluster->kubelet().preempt(ns, chief);
  replaced_alone(chief, chief_uid, worker, worker_uid, 2);
  if (HasFatalFailure()) return;
  RecordProperty("chief_preempted_recovery_ms", status().last_recovery_milliseconds.value_or(-1));

  // 3. Then the worker's node is lost: the node lifecycle controller (played by the kubelet)
  //    evicts its pod, which stays Terminating on the dead node until the operator force-deletes
  //    it after nodeLostTimeoutSeconds.
  ASSERT_TRUE(eventually([&] { return latest() >= 3 * max_steps / 4; }, 240s)) << context();
  const std::string lost = node_of(worker);
  ASSERT_NE(lost, node_of(chief));
  chief_uid = running_uid(chief);
  worker_uid = running_uid(worker);
  kubelet::LoseNodeOptions lose;
  lose.evict_after = 1s;
  cluster->kubelet().lose_node(lost, lose);
  replaced_alone(worker, worker_uid, chief, chief_uid, 3);
  if (HasFatalFailure()) return;
  RecordProperty("node_lost_recovery_ms", status().last_recovery_milliseconds.value_or(-1));
  EXPECT_NE(node_of(worker), lost);

  ASSERT_TRUE(eventually([&] { return status().phase == "Succeeded"; }, 300s)) << context();
  const api::TrainingJobStatus st = status();
  EXPECT_EQ(st.recoveries, 3);
  EXPECT_EQ(st.preemption_count, 3);  // the eviction of the lost node's pod is a disruption too
  EXPECT_EQ(st.failure_count, 0);
  EXPECT_TRUE(st.last_recovery_milliseconds.has_value());
  EXPECT_EQ(history.recovering(),
            (std::vector<std::string>{"True", "False", "True", "False", "True", "False"}))
      << "the Recovering condition, as the watch saw it";
  // STEP never went back (a replacement chief serves step 0 before it has the state: the
  // operator keeps the last value) and ends at the run's length.
  std::vector<int64_t> reported;
  for (const api::TrainingJobStatus& s : history.statuses()) {
    if (s.progress) reported.push_back(s.progress->step);
  }
  EXPECT_FALSE(reported.empty()) << "status.progress was never written";
  EXPECT_EQ(where_steps_go_back(reported), "") << "status.progress.step went back";
  ASSERT_TRUE(st.progress);
  EXPECT_EQ(st.progress->max_steps, max_steps);

  // The pods' own account: each pod's steps (every incarnation, in order) never go back, the
  // replacements took the state from the running replicas, and nobody read a checkpoint.
  for (const std::string& pod : {chief, worker}) {
    const std::string text = read_text(cluster->kubelet().log_path(ns, pod));
    const std::vector<int64_t> steps = progress_steps(text);
    EXPECT_FALSE(steps.empty()) << pod;
    EXPECT_EQ(where_steps_go_back(steps), "") << pod << "'s steps went back";
    EXPECT_EQ(text.find("restored checkpoint"), std::string::npos) << pod << " read a checkpoint";
  }
  EXPECT_EQ(start_steps(read_text(cluster->kubelet().log_path(ns, chief))).size(), 2u)
      << "chief pod starts: the first and its replacement";
  EXPECT_EQ(start_steps(read_text(cluster->kubelet().log_path(ns, worker))).size(), 3u)
      << "worker pod starts: the first and two replacements";

  // The logdir: the final checkpoint, every retained one valid, events files whose sessions
  // start at steps that never go back.
  ASSERT_TRUE(verified_final_checkpoints(logdir, max_steps));
  const std::vector<int64_t> sessions = session_start_steps(logdir);
  ASSERT_FALSE(sessions.empty());
  EXPECT_EQ(sessions.front(), 0);
  EXPECT_EQ(where_steps_go_back(sessions), "") << "events files' SessionLog START steps";
}

}  // namespace
}  // namespace longhaul::e2e
