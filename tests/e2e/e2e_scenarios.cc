// The end-to-end scenarios that tell the same story on either API server, written once
// (e2e_scenario.h): compiled into e2e_scenario_test (fake server) and e2e_real_scenario_test
// (real kube-apiserver), each with its own make_e2e_backend(). Both run examples/
// trainingjob-tiny.yaml's Chief + Worker through a preemption of each and the loss of the
// worker's node, once under restartScope Group and once under Replica. Every assertion is made
// on both backends except the two E2eBackend says are one backend's.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/api/trainingjob.h>

#include "e2e_scenario.h"
#include "scenario_util.h"

namespace longhaul::e2e::testing {
namespace {

using namespace std::chrono_literals;
namespace res = kube::resources;

// restartScope Group: Chief + 1 Worker on different nodes. Preempt the chief, later the worker,
// later lose the worker's node (no eviction: the chief notices the lost peer and exits 138, a
// retryable failure; the worker's pod stays Terminating on the dead node until the operator
// force-deletes it). The job ends Succeeded with counts that match, STEP and LAST-CKPT at the
// end, a valid logdir whose chief resumed at the checkpointed steps (one events file per chief
// start), and -- on the fake backend -- the parameters of an uninterrupted run.
TEST_F(EndToEnd, ChiefAndWorkerSurvivePreemptionsAndTheWorkersNodeLoss) {
  json job = job_manifest(/*with_worker=*/true);
  // The lost worker's pod is deleted by the group restart with this grace, then force-deleted
  // nodeLostTimeoutSeconds later.
  set_grace_period_5s(job);
  const int64_t max_steps = job_max_steps(job);
  const std::vector<std::string> args = container_args(job);
  // The operator reads the chief's progress into status.progress (the STEP and LAST-CKPT
  // columns). The reference run does not serve metrics: its args are taken before.
  serve_chief_metrics(job);
  cluster->apply(job);
  const fs::path logdir = cluster->claim_dir(ns, "tiny-logdir");
  const std::string chief = "tiny-chief-0", worker = "tiny-worker-0";
  auto latest = [&] { return latest_checkpoint_step(logdir).value_or(-1); };
  auto group_running = [&](int64_t attempt) {
    return pod_running_at(chief, attempt) && pod_running_at(worker, attempt);
  };

  ASSERT_TRUE(eventually([&] { return group_running(0) && latest() >= max_steps / 4; }, 240s))
      << context();
  if (backend->claims_stay_pending()) {
    // The claim stays Pending without a provisioner, and nothing waited for it.
    EXPECT_EQ(get(res::kPersistentVolumeClaims, "tiny-logdir")->at("status").value("phase", ""),
              "Pending");
  }
  EXPECT_NE(node_of(chief), node_of(worker));
  ASSERT_TRUE(eventually(
      [&] {
        const auto p = status().progress;
        return p && p->step > 0;
      },
      60s))
      << "the chief's step never reached status.progress" << context();
  const int64_t first_progress = status().progress->step;
  const int64_t before_first = latest();
  preempt(chief);
  ASSERT_TRUE(eventually([&] { return status().preemption_count == 1 && group_running(1); }, 180s))
      << context();

  // Each fault waits for the chief incarnation of the previous restart to have started
  // training (its start line), so no restart is cut short before it began.
  auto chief_starts = [&] { return start_steps(read_text(pod_log(chief))).size(); };
  ASSERT_TRUE(eventually([&] { return latest() >= max_steps / 2 && chief_starts() >= 2; }, 240s))
      << context();
  preempt(worker);
  ASSERT_TRUE(eventually([&] { return status().preemption_count == 2 && group_running(2); }, 180s))
      << context();

  ASSERT_TRUE(
      eventually([&] { return latest() >= 3 * max_steps / 4 && chief_starts() >= 3; }, 240s))
      << context();
  const std::string lost = node_of(worker);
  ASSERT_NE(lost, node_of(chief));
  lose_node(lost);
  ASSERT_TRUE(eventually([&] { return status().restart_attempt == 3 && group_running(3); }, 240s))
      << context();

  ASSERT_TRUE(eventually([&] { return status().phase == "Succeeded"; }, 300s)) << context();
  const api::TrainingJobStatus st = status();
  EXPECT_EQ(st.preemption_count, 2);
  EXPECT_EQ(st.restart_count, 3);
  EXPECT_EQ(st.failure_count, 1);  // the chief's exit 138 after losing its peer
  EXPECT_EQ(st.ready, "0/2");
  // The job ended where the chief did: STEP max/max and the final checkpoint, from the chief's
  // termination message (it once showed the step of the last 5 s read before the chief exited).
  ASSERT_TRUE(st.progress);
  EXPECT_GE(st.progress->step, first_progress);
  EXPECT_EQ(st.progress->steps, std::to_string(max_steps) + "/" + std::to_string(max_steps));
  EXPECT_EQ(st.progress->last_checkpoint_step, max_steps);
  EXPECT_FALSE(st.progress->last_checkpoint_time.empty());

  const auto state = final_checkpoint_state(logdir, max_steps);
  ASSERT_TRUE(state);
  const std::vector<int64_t> starts = start_steps(read_text(pod_log(chief)));
  ASSERT_EQ(starts.size(), 4u) << "chief process starts, from its log";
  EXPECT_EQ(starts[0], 0);
  EXPECT_GE(starts[1], before_first);  // the final checkpoint written on SIGTERM
  EXPECT_EQ(session_start_steps(logdir), starts);

  // The same config run straight through: two local replicas (`longhaul-worker launch`, the
  // same data shards per rank), never disrupted.
  std::vector<std::string> launch = {"launch", "--replicas", "2", "--"};
  launch.insert(launch.end(), args.begin(), args.end());
  maybe_compare_with_uninterrupted_run(launch, logdir, *state, max_steps);
}

// restartScope Replica with the workers regrouping in place (supervisor.on_peer_loss: regroup,
// the worker's default): the worker is preempted, later the chief, later the worker's node is
// lost (its pod evicted, then force-deleted). Each time only the lost pod is re-created, with the
// group's next restart attempt, while the other keeps its pod (same uid), attempt and process;
// nobody reads a checkpoint and the training step never goes back (pod logs, status.progress,
// events files). The job succeeds with three recoveries, no budget spent, and a Recovering
// condition that a watch saw go True then False for each. What the replacement of a lost chief
// does inside the group (rank 0 again, or a worker while the lowest survivor takes over) is not
// assumed: only what users see.
TEST_F(EndToEnd, ReplicaScopeReplacesOnlyTheLostPodThroughPreemptionsAndANodeLoss) {
  json job = job_manifest(/*with_worker=*/true);
  job["spec"]["runPolicy"]["restartScope"] = "Replica";
  set_grace_period_5s(job);
  regroup_on_peer_loss(job);
  const int64_t max_steps = job_max_steps(job);
  const std::vector<std::string> args = container_args(job);
  // The chief pod serves its metrics, so status.progress (the STEP column) follows the run.
  serve_chief_metrics(job);
  StatusHistory history(std::make_shared<kube::HttpClient>(cluster->api_config()), ns, "tiny");
  cluster->apply(job);
  const fs::path logdir = cluster->claim_dir(ns, "tiny-logdir");
  const std::string chief = "tiny-chief-0", worker = "tiny-worker-0";
  auto latest = [&] { return latest_checkpoint_step(logdir).value_or(-1); };
  // Waits until the job reports `n` recoveries, the group is whole again (Recovering False),
  // `lost` runs as a new pod at restart attempt `lost_attempt` and `survivor` at
  // `survivor_attempt`; then the survivor must still be the same pod.
  auto replaced_alone = [&](const std::string& lost, const std::string& lost_uid,
                            int64_t lost_attempt, const std::string& survivor,
                            const std::string& survivor_uid, int64_t survivor_attempt, int n) {
    ASSERT_TRUE(eventually(
        [&] {
          const auto s = status();
          const auto* c = api::find_condition(s, api::condition::kRecovering);
          if (s.recoveries != n || !c || c->status != "False") return false;
          const std::string uid = running_uid(lost);
          return !uid.empty() && uid != lost_uid && pod_running_at(lost, lost_attempt) &&
                 pod_running_at(survivor, survivor_attempt);
        },
        240s))
        << "recovery " << n << context();
    EXPECT_EQ(running_uid(survivor), survivor_uid)
        << survivor << " was re-created or stopped running in recovery " << n;
  };

  ASSERT_TRUE(eventually(
      [&] {
        return pod_running_at(chief, 0) && pod_running_at(worker, 0) &&
               !running_uid(chief).empty() && !running_uid(worker).empty() &&
               latest() >= max_steps / 4;
      },
      240s))
      << context();
  ASSERT_NE(node_of(chief), node_of(worker));

  // 1. The worker is preempted.
  std::string chief_uid = running_uid(chief), worker_uid = running_uid(worker);
  preempt(worker);
  replaced_alone(worker, worker_uid, 1, chief, chief_uid, 0, 1);
  if (HasFatalFailure()) return;
  RecordProperty("worker_preempted_recovery_ms", status().last_recovery_milliseconds.value_or(-1));

  // 2. Later the chief is preempted.
  ASSERT_TRUE(eventually([&] { return latest() >= max_steps / 2; }, 240s)) << context();
  chief_uid = running_uid(chief);
  worker_uid = running_uid(worker);
  preempt(chief);
  replaced_alone(chief, chief_uid, 2, worker, worker_uid, 1, 2);
  if (HasFatalFailure()) return;
  RecordProperty("chief_preempted_recovery_ms", status().last_recovery_milliseconds.value_or(-1));

  // 3. Then the worker's node is lost: the node lifecycle controller (played by the kubelet)
  //    evicts its pod, which stays Terminating on the dead node until the operator force-deletes
  //    it after nodeLostTimeoutSeconds and re-creates it alone.
  ASSERT_TRUE(eventually([&] { return latest() >= 3 * max_steps / 4; }, 240s)) << context();
  const std::string lost = node_of(worker);
  ASSERT_NE(lost, node_of(chief));
  chief_uid = running_uid(chief);
  worker_uid = running_uid(worker);
  kubelet::LoseNodeOptions lose;
  lose.evict_after = 1s;
  lose_node(lost, lose);
  replaced_alone(worker, worker_uid, 3, chief, chief_uid, 2, 3);
  if (HasFatalFailure()) return;
  // Includes the eviction grace (5 s) and nodeLostTimeoutSeconds (1 s here): the pod on the dead
  // node must be force-deleted first.
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
    const std::string text = read_text(pod_log(pod));
    const std::vector<int64_t> steps = progress_steps(text);
    EXPECT_FALSE(steps.empty()) << pod;
    EXPECT_EQ(where_steps_go_back(steps), "") << pod << "'s steps went back";
    EXPECT_EQ(text.find("restored checkpoint"), std::string::npos) << pod << " read a checkpoint";
  }
  EXPECT_EQ(start_steps(read_text(pod_log(chief))).size(), 2u)
      << "chief pod starts: the first and its replacement";
  EXPECT_EQ(start_steps(read_text(pod_log(worker))).size(), 3u)
      << "worker pod starts: the first and two replacements";

  // The logdir: the final checkpoint, the retained ones all valid, events files whose sessions
  // start at steps that never go back.
  const auto state = final_checkpoint_state(logdir, max_steps);
  ASSERT_TRUE(state);
  const std::vector<int64_t> sessions = session_start_steps(logdir);
  ASSERT_FALSE(sessions.empty());
  EXPECT_EQ(sessions.front(), 0);
  EXPECT_EQ(where_steps_go_back(sessions), "") << "events files' SessionLog START steps";

  std::vector<std::string> launch = {"launch", "--replicas", "2", "--"};
  launch.insert(launch.end(), args.begin(), args.end());
  maybe_compare_with_uninterrupted_run(launch, logdir, *state, max_steps);
}

}  // namespace
}  // namespace longhaul::e2e::testing
