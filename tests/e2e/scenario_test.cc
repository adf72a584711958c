// The end-to-end scenarios on the fake API server: examples/trainingjob-tiny.yaml applied to a
// local cluster (fake API server + the longhaul-operator binary + the local kubelet running
// longhaul-worker processes). This file is the fake backend of the shared scenarios
// (e2e_scenarios.cc, also run on the real kube-apiserver by e2e_real_scenario_test) and the
// scenario only this binary runs: the Chief-only job preempted twice and then losing its node,
// which must end Succeeded at the final step with status counts that match, a valid logdir
// (state file, retained checkpoints, one events file per chief start with SessionLog START at the
// restored step), and final parameters equal to an uninterrupted run of the same config. It is
// fake-only because it tells the flagship's story without the Worker (the path operator ->
// kubelet -> worker -> resume independent of data-parallel replicas): the real suite spends its
// budget on the Chief + Worker stories.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/api/trainingjob.h>
#include <longhaul/e2e/local_cluster.h>
#include <longhaul/supervisor/checkpoint_state.h>

#include "e2e_scenario.h"
#include "scenario_util.h"

namespace longhaul::e2e::testing {
namespace {

using namespace std::chrono_literals;

// The in-process fake API server as the scenarios' backend: namespace "default", three local
// nodes, reads cheap enough to look again on every kubelet change.
class FakeBackend : public E2eBackend {
 public:
  const std::string& ns() const override { return ns_; }
  void configure(LocalClusterOptions& o) override {
    o.nodes = {"local-node-0", "local-node-1", "local-node-2"};
  }
  std::chrono::milliseconds poll_interval() const override { return 100ms; }
  bool recheck_on_kubelet_change() const override { return true; }
  bool claims_stay_pending() const override { return false; }
  bool compares_with_uninterrupted_run() const override { return true; }

 private:
  const std::string ns_ = "default";
};

}  // namespace

std::unique_ptr<E2eBackend> make_e2e_backend(std::string*) {
  return std::make_unique<FakeBackend>();
}

namespace {

// Chief only: the whole path operator -> kubelet -> worker -> preemption -> resume -> Succeeded,
// independent of data-parallel replicas.
TEST_F(EndToEnd, ChiefOnlyJobSurvivesTwoPreemptionsAndANodeLossAndMatchesAnUninterruptedRun) {
  json job = job_manifest(/*with_worker=*/false);
  const int64_t max_steps = job_max_steps(job);
  const std::vector<std::string> args = container_args(job);
  cluster->apply(job);
  const fs::path logdir = cluster->claim_dir(ns, "tiny-logdir");
  const std::string chief = "tiny-chief-0";
  auto latest = [&] { return latest_checkpoint_step(logdir).value_or(-1); };

  // 1. Preempt the chief once a quarter of the run is checkpointed.
  ASSERT_TRUE(
      eventually([&] { return pod_running_at(chief, 0) && latest() >= max_steps / 4; }, 180s))
      << context();
  const int64_t before_first = latest();
  preempt(chief);
  ASSERT_TRUE(
      eventually([&] { return status().preemption_count == 1 && pod_running_at(chief, 1); }, 120s))
      << context();

  // 2. Preempt it again half way.
  ASSERT_TRUE(eventually([&] { return latest() >= max_steps / 2; }, 180s)) << context();
  const int64_t before_second = latest();
  preempt(chief);
  ASSERT_TRUE(
      eventually([&] { return status().preemption_count == 2 && pod_running_at(chief, 2); }, 120s))
      << context();

  // 3. Lose the chief's node at three quarters; the node lifecycle controller evicts the pod,
  //    nobody finalizes it, the operator force-deletes it after nodeLostTimeoutSeconds.
  ASSERT_TRUE(eventually([&] { return latest() >= 3 * max_steps / 4; }, 180s)) << context();
  const std::string lost = node_of(chief);
  lose_node(lost, {.evict_after = 200ms, .eviction_grace_seconds = 1});
  ASSERT_TRUE(
      eventually([&] { return status().preemption_count == 3 && pod_running_at(chief, 3); }, 120s))
      << context();
  EXPECT_NE(node_of(chief), lost);

  // 4. The job finishes.
  ASSERT_TRUE(eventually([&] { return status().phase == "Succeeded"; }, 240s)) << context();
  const api::TrainingJobStatus st = status();
  EXPECT_EQ(st.preemption_count, 3);
  EXPECT_EQ(st.restart_count, 3);
  EXPECT_EQ(st.failure_count, 0);
  EXPECT_EQ(st.restart_attempt, 3);
  // The exact end, from the chief's termination message through the kubelet: this chief serves
  // no metrics, yet STEP and LAST-CKPT say where the job ended.
  ASSERT_TRUE(st.progress) << context();
  EXPECT_EQ(st.progress->steps, std::to_string(max_steps) + "/" + std::to_string(max_steps));
  EXPECT_EQ(st.progress->last_checkpoint_step, max_steps);
  EXPECT_FALSE(st.progress->last_checkpoint_time.empty());

  // 5. The logdir: state file at the final step, the retained checkpoints all valid.
  const auto state = final_checkpoint_state(logdir, max_steps);
  ASSERT_TRUE(state);

  // 6. One events file per chief process start, SessionLog START at the step it restored,
  //    and the steps the worker said it resumed at.
  const std::vector<int64_t> starts = start_steps(read_text(pod_log(chief)));
  ASSERT_EQ(starts.size(), 4u) << "chief process starts, from its log";
  EXPECT_EQ(starts[0], 0);
  EXPECT_GE(starts[1], before_first);   // the final checkpoint written on SIGTERM
  EXPECT_GE(starts[2], before_second);  // the same after the second preemption
  EXPECT_GT(starts[3], starts[2]);      // SIGKILL: the latest periodic checkpoint
  EXPECT_EQ(session_start_steps(logdir), starts);

  // 7. The same config run straight through gives the same parameters.
  expect_matches_uninterrupted_run(
      args, root, checkpoint_file(logdir, state->model_checkpoint_path), max_steps);
}

}  // namespace
}  // namespace longhaul::e2e::testing
