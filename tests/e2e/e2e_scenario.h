// The end-to-end scenarios written once for both API servers. E2eBackend is what a scenario needs
// of the server its LocalCluster runs against (the namespace, the node names and API server the
// cluster is given, how often reads may go to the server, and what only one server can check);
// EndToEnd is the fixture: the cluster up (API server, the longhaul-operator binary, the local
// kubelet running longhaul-worker pods), readers of the job's and pods' state through the
// cluster's client, the faults (preempt a pod, lose a node, through the kubelet) and
// StatusHistory, a watch of the job's status. e2e_scenarios.cc holds the scenarios that tell the
// same story on either server; it is compiled into two binaries, each of which defines
// make_e2e_backend(): e2e_scenario_test with the fake API server (scenario_test.cc, label slow)
// and e2e_real_scenario_test with the real kube-apiserver of tests/envtest
// (real_scenario_test.cc, labels real;slow). Scenarios only one binary runs stay in its file.
//
// Thread-safety: the fixture is used from the test thread; StatusHistory records from its
// informer's thread under its own lock.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/api/trainingjob.h>
#include <longhaul/e2e/local_cluster.h>
#include <longhaul/kube/informer.h>
#include <longhaul/supervisor/checkpoint_state.h>

#include "longhaul/base/mutex.h"
#include "longhaul/base/thread_annotations.h"
#include "longhaul/testing/test_temp_dir.h"
#include "scenario_util.h"

namespace longhaul::e2e::testing {

class E2eBackend {
 public:
  virtual ~E2eBackend() = default;

  // The namespace the scenario's job and pods live in.
  virtual const std::string& ns() const = 0;
  // Completes the cluster's options: its nodes and, for a real server, external_api,
  // external_kubeconfig and watch_namespace.
  virtual void configure(LocalClusterOptions& options) = 0;
  // How long a wait sleeps between two looks, and whether it also looks on every kubelet change
  // (cheap on the in-process fake server; on the real one each look is several requests).
  virtual std::chrono::milliseconds poll_interval() const = 0;
  virtual bool recheck_on_kubelet_change() const = 0;

  // Backend-only extra assertions (what the other backend cannot check, or not in its budget):
  // The logdir claim stays Pending: the real server has no provisioner and nothing waits for it
  // (the fake server has no PVC controller at all, so there is nothing to assert).
  virtual bool claims_stay_pending() const = 0;
  // The final parameters are compared with an uninterrupted run of the same config (an extra
  // training run: the fake suite pays for it; the comparison checks the worker's arithmetic,
  // which no API server changes, so the real suite keeps its budget for what only it judges).
  virtual bool compares_with_uninterrupted_run() const = 0;
};

// Defined by each binary: the backend of the running test, or nullptr with `*why` set when this
// machine cannot provide it (the test is then skipped with that reason).
std::unique_ptr<E2eBackend> make_e2e_backend(std::string* why);

// Every status of one TrainingJob in the order the API server reported it, from a watch: what
// `kubectl get tj -w` shows, including states that last less than a poll interval (a Recovering
// condition that is True for a few hundred milliseconds). The informer is stopped and joined by
// the destructor.
class StatusHistory {
 public:
  StatusHistory(std::shared_ptr<kube::Client> client, const std::string& ns,
                const std::string& name)
      : informer_(std::move(client),
                  kube::InformerOptions{.resource = kube::resources::kTrainingJobs,
                                        .ns = ns,
                                        .field_selector = "metadata.name=" + name}) {
    auto record = [this](const json& job) {
      MutexLock lock(mu_);
      statuses_.push_back(api::parse_status(job.value("status", json::object())));
    };
    informer_.add_handlers({.on_add = record,
                            .on_update = [record](const json&, const json& job) { record(job); },
                            .on_delete = {}});
    informer_.start();
  }
  ~StatusHistory() { informer_.stop(); }
  StatusHistory(const StatusHistory&) = delete;
  StatusHistory& operator=(const StatusHistory&) = delete;

  std::vector<api::TrainingJobStatus> statuses() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return statuses_;
  }
  // The Recovering condition's status through the history, repeats collapsed ("" = absent).
  std::vector<std::string> recovering() const EXCLUDES(mu_) {
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
  mutable Mutex mu_;
  std::vector<api::TrainingJobStatus> statuses_ GUARDED_BY(mu_);
};

// The cluster on the test's backend, started in SetUp and stopped (every thread joined, every
// process reaped) in TearDown.
class EndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    backend = make_e2e_backend(&why);
    if (backend == nullptr) GTEST_SKIP() << why;
    ns = backend->ns();
    LocalClusterOptions o;
    o.root = root / "cluster";
    o.operator_binary = binary_dir() / "operator/cli/longhaul-operator";
    o.bin_dirs = {binary_dir() / "worker/cli"};
    backend->configure(o);
    cluster = std::make_unique<LocalCluster>(o);
    cluster->start();
  }
  void TearDown() override {
    if (cluster) cluster->stop();
  }

  // The TrainingJob of examples/trainingjob-tiny.yaml (tiny_job) in the backend's namespace.
  json job_manifest(bool with_worker) {
    json job = tiny_job(with_worker);
    job["metadata"]["namespace"] = ns;
    return job;
  }
  std::optional<json> get(const kube::Resource& r, const std::string& name) {
    try {
      return cluster->client().get(r, ns, name);
    } catch (const kube::NotFoundError&) {
      return std::nullopt;
    }
  }
  api::TrainingJobStatus status() {
    auto job = get(kube::resources::kTrainingJobs, "tiny");
    return job ? api::parse_status(job->value("status", json::object())) : api::TrainingJobStatus{};
  }
  // The pod of the given restart attempt is Running in the API, not being deleted, and its
  // process runs here.
  bool pod_running_at(const std::string& pod, int64_t attempt) {
    auto p = get(kube::resources::kPods, pod);
    if (!p || p->at("metadata").contains("deletionTimestamp")) return false;
    const std::string a = p->at("metadata")
                              .value("annotations", json::object())
                              .value(std::string(api::kAnnotationRestartAttempt), "");
    auto info = cluster->kubelet().pod(ns, pod);
    return a == std::to_string(attempt) &&
           p->value("status", json::object()).value("phase", "") == "Running" && info &&
           info->running;
  }
  // The uid of the pod when it is Running in the API, not being deleted, and its process (of
  // that uid) runs here; "" otherwise.
  std::string running_uid(const std::string& pod) {
    auto p = get(kube::resources::kPods, pod);
    if (!p || p->at("metadata").contains("deletionTimestamp")) return "";
    if (p->value("status", json::object()).value("phase", "") != "Running") return "";
    const std::string uid = p->at("metadata").value("uid", "");
    auto info = cluster->kubelet().pod(ns, pod);
    return info && info->running && info->uid == uid ? uid : "";
  }
  std::string node_of(const std::string& pod) {
    auto p = get(kube::resources::kPods, pod);
    return p ? p->at("spec").value("nodeName", "") : "";
  }
  // Waits for `pred` with the backend's rhythm (see E2eBackend::poll_interval).
  bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const bool on_change = backend->recheck_on_kubelet_change();
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      if (on_change) {
        cluster->kubelet().wait_for(pred, backend->poll_interval());
      } else {
        cluster->kubelet().wait_for([] { return false; }, backend->poll_interval());
      }
    }
    return pred();
  }

  // The faults, as a cluster would inflict them (the local kubelet plays the scheduler and the
  // node lifecycle controller on either backend).
  void preempt(const std::string& pod) { cluster->kubelet().preempt(ns, pod); }
  void lose_node(const std::string& node, const kubelet::LoseNodeOptions& options = {}) {
    cluster->kubelet().lose_node(node, options);
  }
  fs::path pod_log(const std::string& pod) { return cluster->kubelet().log_path(ns, pod); }

  // The logdir once the job succeeded: the state file names the final step and keeps
  // checkpoint.max_to_keep (3) checkpoints, each of which verifies.
  std::optional<supervisor::CheckpointState> final_checkpoint_state(const fs::path& logdir,
                                                                    int64_t max_steps) {
    auto state = verified_final_checkpoints(logdir, max_steps);
    if (state) {
      EXPECT_EQ(state->all_model_checkpoint_paths.size(), 3u);  // checkpoint.max_to_keep
    }
    return state;
  }
  // The backend's extra: the final checkpoint equals an uninterrupted run of `worker_args`.
  void maybe_compare_with_uninterrupted_run(const std::vector<std::string>& worker_args,
                                            const fs::path& logdir,
                                            const supervisor::CheckpointState& state,
                                            int64_t max_steps) {
    if (!backend->compares_with_uninterrupted_run()) return;
    expect_matches_uninterrupted_run(
        worker_args, root, checkpoint_file(logdir, state.model_checkpoint_path), max_steps);
  }
  std::string context() {
    return "\njob status: " + api::to_json(status()).dump() + "\noperator log tail:\n" +
           tail(cluster->operator_log(), 3000) + "\nchief log tail:\n" +
           tail(pod_log("tiny-chief-0"), 3000);
  }

  std::unique_ptr<E2eBackend> backend;
  std::string ns;
  // Left on disk (its path on stderr) when the test failed, for its logs and logdirs.
  longhaul::testing::TestTempDir root{"e2e"};
  std::unique_ptr<LocalCluster> cluster;
};

}  // namespace longhaul::e2e::testing
