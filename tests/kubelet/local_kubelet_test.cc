// The local kubelet against the fake API server over HTTP: pods run as local shell processes and
// their status, deletion, preemption, node loss and shared claims behave as on a cluster.
#include "longhaul/kubelet/local_kubelet.h"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include <longhaul/fakeapi/server.h>
#include <longhaul/kube/http_client.h>
#include <longhaul/testing/temp_dir.h>

namespace longhaul::kubelet {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A process that runs until signalled; "ready" once its TERM trap is in place.
const char* kLongRunning = "trap 'exit 143' TERM; echo ready; while :; do sleep 0.05; done";
// A process that ignores SIGTERM: only SIGKILL stops it. One process (exec sleep), so no shell
// fork window can let a TERM through.
const char* kIgnoresTerm = "sleep 0.5; trap '' TERM; echo ready; exec sleep 600";

json pod_manifest(const std::string& name, const std::string& script,
                  const std::string& restart_policy = "Never", int grace = 30) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", {{"test", "1"}}}}},
          {"spec",
           {{"restartPolicy", restart_policy},
            {"terminationGracePeriodSeconds", grace},
            {"containers",
             {{{"name", "main"}, {"image", "busybox"}, {"command", {"/bin/sh", "-c", script}}}}}}}};
}

class LocalKubeletTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server.start();
    kube::ClusterConfig cfg;
    cfg.server = server.url();
    kube::HttpClientOptions co;
    co.qps = 0;
    co.initial_backoff = 20ms;
    client = std::make_shared<kube::HttpClient>(cfg, co);
    KubeletOptions o;
    o.root = root;
    o.nodes = {"node-a", "node-b"};
    o.crash_backoff_initial = 20ms;
    o.crash_backoff_max = 100ms;
    o.stop_grace = 2s;
    o.node_heartbeat = 200ms;
    kubelet = std::make_unique<LocalKubelet>(client, o);
    kubelet->start();
  }
  void TearDown() override {
    kubelet->stop();
    client->close();
    server.stop();
  }

  std::optional<json> pod(const std::string& name) {
    return server.try_get("pods", "default", name);
  }
  std::string phase(const std::string& name) {
    auto p = pod(name);
    return p ? p->value("status", json::object()).value("phase", "") : "<gone>";
  }
  bool wait_phase(const std::string& name, const std::string& want,
                  std::chrono::milliseconds timeout = 20s) {
    return server.wait_for([&] { return phase(name) == want; }, timeout);
  }
  json condition(const std::string& name, const std::string& type) {
    auto p = pod(name);
    if (!p) return nullptr;
    for (const json& c : p->value("status", json::object()).value("conditions", json::array())) {
      if (c.value("type", "") == type) return c;
    }
    return nullptr;
  }
  json terminated(const std::string& name) {
    return pod(name)
        ->at("status")
        .at("containerStatuses")
        .at(0)
        .at("state")
        .value("terminated", json(nullptr));
  }
  // What the pod's process printed. The kubelet's own lines in the same file are left out: its
  // "starting pod" line quotes the command, so a wait for "ready" would otherwise match the
  // script text `echo ready` before the shell has even set its trap.
  std::string log_of(const std::string& name) {
    std::ifstream in(kubelet->log_path("default", name));
    std::string out, line;
    while (std::getline(in, line)) {
      if (!line.starts_with("[local-kubelet]")) out += line + "\n";
    }
    return out;
  }
  bool wait_log(const std::string& name, const std::string& needle) {
    // Log lines reach the file without an API event: re-check on every local change and at
    // least every 50 ms of the deadline.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (log_of(name).find(needle) != std::string::npos) return true;
      kubelet->wait_for([&] { return log_of(name).find(needle) != std::string::npos; }, 50ms);
    }
    return false;
  }

  longhaul::testing::TempDir root_dir{"lh-kubelet"};
  const fs::path root = root_dir.path();
  fakeapi::FakeApiServer server;
  std::shared_ptr<kube::HttpClient> client;
  std::unique_ptr<LocalKubelet> kubelet;
};

TEST_F(LocalKubeletTest, RunsAPodToSucceededWithItsOutputInTheLog) {
  server.create("pods", "default", pod_manifest("ok", "echo hello from $HOSTNAME"));
  ASSERT_TRUE(wait_phase("ok", "Succeeded"));
  const json p = *pod("ok");
  EXPECT_FALSE(p["spec"].value("nodeName", "").empty());  // bound by the kubelet
  EXPECT_EQ(p["status"]["podIP"], "127.0.0.1");
  EXPECT_EQ(terminated("ok")["exitCode"], 0);
  EXPECT_EQ(terminated("ok")["reason"], "Completed");
  EXPECT_EQ(condition("ok", "Ready")["status"], "False");
  EXPECT_EQ(condition("ok", "Ready")["reason"], "PodCompleted");
  EXPECT_NE(log_of("ok").find("hello from ok"), std::string::npos);
}

// terminationMessagePath, emulated (the operator reads the worker's final progress there): the
// process finds the file in $LONGHAUL_TERMINATION_MESSAGE_PATH, and what it wrote (at most 4096
// bytes, as a kubelet keeps) is state.terminated.message; an in-place restart starts with an
// empty file and keeps the last run's message in lastState.
TEST_F(LocalKubeletTest, TheTerminationMessageIsReportedLikeAKubeletDoes) {
  server.create(
      "pods", "default",
      pod_manifest("said", "printf '{\"step\":1500}' > $LONGHAUL_TERMINATION_MESSAGE_PATH"));
  ASSERT_TRUE(wait_phase("said", "Succeeded"));
  EXPECT_EQ(terminated("said")["message"], "{\"step\":1500}");

  server.create("pods", "default",
                pod_manifest("long",
                             "head -c 10000 /dev/zero | tr '\\0' x "
                             "> $LONGHAUL_TERMINATION_MESSAGE_PATH; exit 1"));
  ASSERT_TRUE(wait_phase("long", "Failed"));
  EXPECT_EQ(terminated("long")["message"], std::string(4096, 'x'));

  server.create("pods", "default", pod_manifest("silent", "true"));
  ASSERT_TRUE(wait_phase("silent", "Succeeded"));
  EXPECT_FALSE(terminated("silent").contains("message"));

  json m = pod_manifest("again",
                        "n=$(cat /scratch/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > "
                        "/scratch/n; [ -s $LONGHAUL_TERMINATION_MESSAGE_PATH ] && exit 5; "
                        "echo run $n > $LONGHAUL_TERMINATION_MESSAGE_PATH; [ $n -ge 2 ]",
                        "OnFailure");
  m["spec"]["volumes"] = {{{"name", "scratch"}, {"emptyDir", json::object()}}};
  m["spec"]["containers"][0]["volumeMounts"] = {{{"name", "scratch"}, {"mountPath", "/scratch"}}};
  server.create("pods", "default", m);
  ASSERT_TRUE(wait_phase("again", "Succeeded"));
  const json cs = pod("again")->at("status").at("containerStatuses").at(0);
  EXPECT_EQ(cs["state"]["terminated"]["message"], "run 2\n");
  EXPECT_EQ(cs["lastState"]["terminated"]["message"], "run 1\n");
}

TEST_F(LocalKubeletTest, ANonZeroExitFailsThePodWithTheCode) {
  server.create("pods", "default", pod_manifest("bad", "exit 3"));
  ASSERT_TRUE(wait_phase("bad", "Failed"));
  EXPECT_EQ(terminated("bad")["exitCode"], 3);
  EXPECT_EQ(terminated("bad")["reason"], "Error");
  EXPECT_EQ(pod("bad")->at("status").at("containerStatuses").at(0).at("restartCount"), 0);
}

TEST_F(LocalKubeletTest, AProgramThatCannotStartFailsWith127) {
  json m = pod_manifest("missing", "");
  m["spec"]["containers"][0]["command"] = {"/nonexistent/program"};
  server.create("pods", "default", m);
  ASSERT_TRUE(wait_phase("missing", "Failed"));
  EXPECT_EQ(terminated("missing")["exitCode"], 127);
  EXPECT_EQ(terminated("missing")["reason"], "StartError");
}

TEST_F(LocalKubeletTest, RunningPodIsReadyAndDeletionStopsItWithSigterm) {
  server.create("pods", "default", pod_manifest("long", kLongRunning));
  ASSERT_TRUE(server.wait_for(
      [&] {
        return phase("long") == "Running" && !condition("long", "Ready").is_null() &&
               condition("long", "Ready")["status"] == "True";
      },
      20s));
  EXPECT_TRUE(
      pod("long")->at("status").at("containerStatuses").at(0).at("state").contains("running"));
  EXPECT_EQ(condition("long", "ContainersReady")["status"], "True");
  ASSERT_TRUE(wait_log("long", "ready"));

  server.remove("pods", "default", "long", {.grace_period_seconds = 30});
  // The kubelet stops the process and finalizes the deletion: the pod is gone.
  ASSERT_TRUE(server.wait_for([&] { return !pod("long"); }, 20s));
  auto info = kubelet->pod("default", "long");
  if (info) {
    EXPECT_EQ(info->exit_code, 143);  // the TERM trap ran: stopped by SIGTERM, not SIGKILL
  }
}

// Issue #27: the status of a pod deleted since never lands on a pod re-created under the same
// name. The old pod's exit (SIGTERM, 143) cannot be written at first (403), and the kubelet's
// watch reconnects slowly, so it still sees the old pod when the name already holds a successor
// and its status write goes through again: the write carries the old uid and is refused.
TEST_F(LocalKubeletTest, StatusOfADeletedPodNeverLandsOnItsSameNameSuccessor) {
  server.create("pods", "default", pod_manifest("same", kLongRunning));
  ASSERT_TRUE(wait_phase("same", "Running"));
  ASSERT_TRUE(wait_log("same", "ready"));
  const std::string old_uid = pod("same")->at("metadata").at("uid");
  const int refused =
      server.add_fault({.verb = "patch", .path_regex = "/pods/same/status$", .status = 403});
  server.remove("pods", "default", "same", {.grace_period_seconds = 30});
  ASSERT_TRUE(kubelet->wait_for(
      [&] {
        auto info = kubelet->pod("default", "same");
        return info && info->exit_code.has_value();
      },
      20s));
  server.add_fault({.verb = "list", .path_regex = "/pods$", .status = 0, .latency = 3000ms});
  server.add_fault({.verb = "watch", .path_regex = "/pods$", .status = 0, .latency = 3000ms});
  server.drop_watches();
  // The old pod goes at once; a successor (on a node this kubelet does not run) takes the name.
  server.finalize_pod_deletion("default", "same");
  json successor = pod_manifest("same", kLongRunning);
  successor["spec"]["nodeName"] = "node-elsewhere";
  const json created = server.create("pods", "default", successor);
  ASSERT_NE(created["metadata"]["uid"], old_uid);
  server.remove_fault(refused);
  // The kubelet forgets the old pod once its watch shows it gone.
  ASSERT_TRUE(kubelet->wait_for([&] { return !kubelet->pod("default", "same"); }, 20s));

  const json now = *pod("same");
  EXPECT_EQ(now["metadata"]["uid"], created["metadata"]["uid"]);
  EXPECT_FALSE(now.value("status", json::object()).contains("containerStatuses"))
      << "the old pod's container state landed on its successor: " << now["status"].dump();
  EXPECT_EQ(now["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);
  EXPECT_GE(server.count_requests(
                {.verb = "patch", .subresource = "status", .name = "same", .status = 422}),
            1U)
      << "the old pod's status was never written again (the test did not race)";
}

TEST_F(LocalKubeletTest, DeletionKillsAProcessThatIgnoresSigtermAfterTheGracePeriod) {
  server.create("pods", "default", pod_manifest("stubborn", kIgnoresTerm, "Never", 1));
  ASSERT_TRUE(wait_phase("stubborn", "Running"));
  ASSERT_TRUE(wait_log("stubborn", "ready"));
  pid_t pid = kubelet->pod("default", "stubborn")->pid;
  server.remove("pods", "default", "stubborn", {.grace_period_seconds = 1});
  ASSERT_TRUE(server.wait_for([&] { return !pod("stubborn"); }, 20s));
  // Gone from the API only once the process is dead, and it died of SIGKILL.
  EXPECT_NE(::kill(pid, 0), 0);
  auto info = kubelet->pod("default", "stubborn");
  if (info) {
    EXPECT_EQ(info->exit_code, 128 + SIGKILL);
  }
}

// True once `pid` has exited (gone, or a zombie nobody reaped yet).
bool exited(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] == 'Z' ||
         line[paren + 2] == 'X';
}

TEST_F(LocalKubeletTest, ProcessesTheContainerLeavesBehindAreKilledWhenItExits) {
  // As when a container's main process exits: nothing it started survives it.
  server.create("pods", "default", pod_manifest("parent", "sleep 600 & echo child=$!; exit 0"));
  ASSERT_TRUE(wait_phase("parent", "Succeeded"));
  const std::string out = log_of("parent");
  const size_t at = out.find("child=");
  ASSERT_NE(at, std::string::npos) << out;
  const pid_t child = std::stoi(out.substr(at + 6));
  // SIGKILL was sent before the pod was reported; the child dies when the kernel next runs it,
  // which no event of ours tells: poll /proc, bounded by the deadline.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!exited(child) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(exited(child)) << "pid " << child << " outlived its pod";
}

TEST_F(LocalKubeletTest, PreemptionMarksDisruptionThenFailsThePodAsPreempted) {
  server.create("pods", "default", pod_manifest("victim", kLongRunning));
  ASSERT_TRUE(wait_phase("victim", "Running"));
  ASSERT_TRUE(wait_log("victim", "ready"));
  kubelet->preempt("default", "victim");
  ASSERT_TRUE(wait_phase("victim", "Failed"));
  const json d = condition("victim", "DisruptionTarget");
  ASSERT_FALSE(d.is_null());
  EXPECT_EQ(d["status"], "True");
  EXPECT_EQ(d["reason"], "PreemptionByScheduler");
  EXPECT_EQ(pod("victim")->at("status").at("reason"), "Preempted");
  EXPECT_EQ(terminated("victim")["exitCode"], 143);
}

TEST_F(LocalKubeletTest, PreemptionGraceOverrideEndsInSigkill) {
  server.create("pods", "default", pod_manifest("stubborn", kIgnoresTerm));
  ASSERT_TRUE(wait_phase("stubborn", "Running"));
  ASSERT_TRUE(wait_log("stubborn", "ready"));
  kubelet->preempt("default", "stubborn", "TerminationByKubelet", 200ms);
  ASSERT_TRUE(wait_phase("stubborn", "Failed"));
  EXPECT_EQ(terminated("stubborn")["exitCode"], 128 + SIGKILL);
  EXPECT_EQ(condition("stubborn", "DisruptionTarget")["reason"], "TerminationByKubelet");
  EXPECT_THROW(kubelet->preempt("default", "stubborn"), NotFound);
}

TEST_F(LocalKubeletTest, ALostNodeKillsItsPodsAndNeverReportsThemAgain) {
  server.create("pods", "default", pod_manifest("doomed", kLongRunning));
  ASSERT_TRUE(wait_phase("doomed", "Running"));
  const std::string node = pod("doomed")->at("spec").at("nodeName");
  const pid_t pid = kubelet->pod("default", "doomed")->pid;
  const size_t writes_before =
      server.count_requests({.verb = "patch", .resource = "pods", .name = "doomed"});

  kubelet->lose_node(node);
  ASSERT_TRUE(kubelet->wait_for([&] { return !kubelet->pod("default", "doomed")->running; }, 20s));
  EXPECT_EQ(kubelet->pod("default", "doomed")->exit_code, 128 + SIGKILL);
  EXPECT_NE(::kill(pid, 0), 0);

  // A new pod lands on the surviving node and runs; by then the kubelet has synced the lost pod
  // several times without writing it.
  server.create("pods", "default", pod_manifest("survivor", "exit 0"));
  ASSERT_TRUE(wait_phase("survivor", "Succeeded"));
  EXPECT_NE(pod("survivor")->at("spec").at("nodeName"), node);
  EXPECT_EQ(phase("doomed"), "Running");  // as on a dead node
  EXPECT_EQ(server.count_requests({.verb = "patch", .resource = "pods", .name = "doomed"}),
            writes_before);
  // Nobody finalizes its deletion: it stays Terminating until force-deleted.
  server.remove("pods", "default", "doomed", {.grace_period_seconds = 1});
  server.create("pods", "default", pod_manifest("marker", "exit 0"));
  ASSERT_TRUE(wait_phase("marker", "Succeeded"));
  ASSERT_TRUE(pod("doomed"));
  server.remove("pods", "default", "doomed", {.grace_period_seconds = 0});
  EXPECT_FALSE(pod("doomed"));
}

TEST_F(LocalKubeletTest, ALostNodeCanBeEvictedLikeTheNodeLifecycleControllerDoes) {
  server.create("pods", "default", pod_manifest("evictee", kLongRunning));
  ASSERT_TRUE(wait_phase("evictee", "Running"));
  const std::string node = pod("evictee")->at("spec").at("nodeName");
  kubelet->lose_node(node, {.evict_after = 0ms});
  ASSERT_TRUE(server.wait_for(
      [&] {
        return pod("evictee") && pod("evictee")->at("metadata").contains("deletionTimestamp");
      },
      20s));
  EXPECT_EQ(condition("evictee", "DisruptionTarget")["reason"], "DeletionByTaintManager");
  EXPECT_EQ(phase("evictee"), "Running");
  EXPECT_THROW(kubelet->lose_node(node), NotFound);
}

TEST_F(LocalKubeletTest, PodsMountingOneClaimShareItsDirectory) {
  auto with_claim = [](json m, const std::string& mount) {
    m["spec"]["volumes"] = {{{"name", "shared"}, {"persistentVolumeClaim", {{"claimName", "c1"}}}}};
    m["spec"]["containers"][0]["volumeMounts"] = {{{"name", "shared"}, {"mountPath", mount}}};
    m["spec"]["containers"][0]["env"] = {{{"name", "DIR"}, {"value", mount}}};
    return m;
  };
  server.create("pods", "default",
                with_claim(pod_manifest("writer", "echo from-writer > $DIR/note.txt"), "/data"));
  ASSERT_TRUE(wait_phase("writer", "Succeeded"));
  server.create("pods", "default",
                with_claim(pod_manifest("reader", "cat /mnt/x/note.txt"), "/mnt/x"));
  ASSERT_TRUE(wait_phase("reader", "Succeeded"));
  EXPECT_NE(log_of("reader").find("from-writer"), std::string::npos);
  EXPECT_TRUE(fs::exists(root / "pvc" / "default" / "c1" / "note.txt"));
}

TEST_F(LocalKubeletTest, OnFailureRestartsTheContainerInPlace) {
  // Fails twice, then succeeds; the count lives in the pod's emptyDir.
  json m =
      pod_manifest("flaky",
                   "n=$(cat /scratch/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /scratch/n; "
                   "[ $n -ge 3 ]",
                   "OnFailure");
  m["spec"]["volumes"] = {{{"name", "scratch"}, {"emptyDir", json::object()}}};
  m["spec"]["containers"][0]["volumeMounts"] = {{{"name", "scratch"}, {"mountPath", "/scratch"}}};
  server.create("pods", "default", m);
  ASSERT_TRUE(wait_phase("flaky", "Succeeded"));
  const json cs = pod("flaky")->at("status").at("containerStatuses").at(0);
  EXPECT_EQ(cs["restartCount"], 2);
  EXPECT_EQ(cs["lastState"]["terminated"]["exitCode"], 1);
}

TEST_F(LocalKubeletTest, StopKillsEveryProcess) {
  server.create("pods", "default", pod_manifest("a", kIgnoresTerm));
  server.create("pods", "default", pod_manifest("b", kLongRunning));
  ASSERT_TRUE(wait_phase("a", "Running"));
  ASSERT_TRUE(wait_phase("b", "Running"));
  ASSERT_TRUE(wait_log("a", "ready"));
  const pid_t pa = kubelet->pod("default", "a")->pid, pb = kubelet->pod("default", "b")->pid;
  kubelet->stop();
  EXPECT_NE(::kill(pa, 0), 0);
  EXPECT_NE(::kill(pb, 0), 0);
  EXPECT_FALSE(kubelet->pod("default", "a")->running);
}

// On a real API server a kubelet without Node objects had its pods deleted by the pod garbage
// collector within a minute. Each live node is registered Ready and heartbeats a Lease in
// kube-node-lease; a lost node stops heartbeating.
TEST_F(LocalKubeletTest, RegistersItsNodesAndHeartbeatsTheirLeases) {
  ASSERT_TRUE(server.wait_for(
      [&] {
        return server.try_get("leases.coordination.k8s.io", "kube-node-lease", "node-a")
            .has_value();
      },
      20s));
  const json node = server.get("nodes", "", "node-a");
  bool ready = false;
  for (const json& c : node["status"]["conditions"]) {
    ready |= c["type"] == "Ready" && c["status"] == "True";
  }
  EXPECT_TRUE(ready) << node.dump();
  EXPECT_EQ(node["status"]["addresses"][0]["address"], "127.0.0.1");
  const json lease = server.get("leases.coordination.k8s.io", "kube-node-lease", "node-a");
  EXPECT_EQ(lease["spec"]["holderIdentity"], "node-a");
  EXPECT_EQ(lease["metadata"]["ownerReferences"][0]["uid"], node["metadata"]["uid"]);
  // Renewed: the renewTime moves on.
  const std::string first = lease["spec"]["renewTime"];
  ASSERT_TRUE(server.wait_for(
      [&] {
        return server.get("leases.coordination.k8s.io", "kube-node-lease",
                          "node-a")["spec"]["renewTime"] != first;
      },
      20s));
  kubelet->add_node("n9");
  EXPECT_TRUE(server.wait_for([&] { return server.try_get("nodes", "", "n9").has_value(); }, 20s));
}

// Control commands assumed namespace "default": a bare pod name is resolved among the pods the
// kubelet runs, and NS/POD is taken as written.
TEST_F(LocalKubeletTest, ControlCommandsNameThePodsNamespace) {
  json sleeper = pod_manifest("sleeper", kLongRunning);
  sleeper["metadata"]["namespace"] = "team-a";
  server.create("pods", "team-a", sleeper);
  ASSERT_TRUE(kubelet->wait_for(
      [&] {
        return kubelet->pod("team-a", "sleeper") && kubelet->pod("team-a", "sleeper")->running;
      },
      20s));
  EXPECT_EQ(kubelet->resolve_pod("sleeper"),
            std::make_pair(std::string("team-a"), std::string("sleeper")));
  EXPECT_EQ(kubelet->resolve_pod("x/y"), std::make_pair(std::string("x"), std::string("y")));
  EXPECT_THROW(kubelet->resolve_pod("nobody"), NotFound);
  EXPECT_THROW(run_control_command(*kubelet, "preempt"), InvalidArgument);
  EXPECT_EQ(run_control_command(*kubelet, "preempt team-a/sleeper"), "preempting team-a/sleeper");
  EXPECT_TRUE(server.wait_for(
      [&] {
        auto p = server.try_get("pods", "team-a", "sleeper");
        return p && p->value("status", json::object()).value("reason", "") == "Preempted";
      },
      30s));
}

}  // namespace
}  // namespace longhaul::kubelet
