// Scenario-test harness: a FakeApiServer on a real socket, the operator's real HttpClient, the
// controller in-process (FakeServerScenario), and a simulated kubelet that runs on a thread of its
// own: it marks new pods Running and Ready (when
// auto_run is on) and finalizes the deletion of terminating pods, except pods the test marks as
// stuck on a lost node. Tests change pod status through the fake server's store, as a kubelet
// would, and wait on conditions with deadlines. Every status write carries the pod's
// metadata.uid, as a real kubelet's do: the server refuses it (422, metadata.uid is immutable)
// when the name belongs to a pod re-created since, so a deleted pod's status never reaches its
// same-name successor.
//
// Thread-safety: FakeKubelet's settings are GUARDED_BY its mutex (checked by clang); the harness
// is used from the test thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"
#include "longhaul/base/mutex.h"
#include "longhaul/controller/controller.h"
#include "longhaul/fakeapi/server.h"
#include "longhaul/kube/http_client.h"
#include "scenario.h"

namespace longhaul::testing {

using json = nlohmann::json;
using namespace std::chrono_literals;

inline constexpr const char* kJobs = "trainingjobs.longhaul.dev";

// Merge-patches `status` into pod ns/name's status, only while the pod is the incarnation with
// `uid` (the uid rides in the patch; see above). Throws fakeapi's 422 StatusError otherwise.
inline void patch_pod_status(fakeapi::FakeApiServer& server, const std::string& ns,
                             const std::string& name, const std::string& uid, const json& status) {
  server.patch("pods", ns, name, {{"metadata", {{"uid", uid}}}, {"status", status}},
               fakeapi::PatchType::kMerge, /*status_subresource=*/true);
}

class FakeKubelet {
 public:
  explicit FakeKubelet(fakeapi::FakeApiServer& server) : server_(server) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeKubelet() { stop(); }
  void stop() EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void set_auto_run(bool on) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto_run_ = on;
  }
  void set_stuck(const std::string& pod, bool stuck) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (stuck) {
      stuck_.insert(pod);
    } else {
      stuck_.erase(pod);
    }
  }

 private:
  void run() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (!stopping_) {
      const bool auto_run = auto_run_;
      const std::set<std::string> stuck = stuck_;
      lock.Unlock();
      try {
        for (const json& pod : server_.list("pods")) {
          const json& md = pod["metadata"];
          const std::string ns = md.value("namespace", ""), name = md.value("name", "");
          if (md.contains("deletionTimestamp")) {
            if (!stuck.contains(name)) server_.finalize_pod_deletion(ns, name);
            continue;
          }
          const std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
          if (auto_run && (phase.empty() || phase == "Pending")) {
            patch_pod_status(
                server_, ns, name, md.value("uid", ""),
                {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}});
          }
        }
      } catch (const std::exception&) {
        // A pod vanished (or was re-created) between list and write: the next round sees the
        // new state.
      }
      lock.Lock();
      // The kubelet's sync period; state is re-read each round, nothing waits on this delay.
      cv_.wait_for(mu_, 20ms, [this]() REQUIRES(mu_) { return stopping_; });
    }
  }

  fakeapi::FakeApiServer& server_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool auto_run_ GUARDED_BY(mu_) = true;
  std::set<std::string> stuck_ GUARDED_BY(mu_);  // pod names whose deletion is never finalized
  std::thread thread_;
};

inline fakeapi::Options server_options() {
  fakeapi::Options o;
  o.default_node_name = "node-1";
  o.bookmark_interval = 1s;
  return o;
}

inline std::shared_ptr<kube::HttpClient> make_client(const fakeapi::FakeApiServer& server) {
  kube::ClusterConfig cfg;
  cfg.server = server.url();
  cfg.source = "fake";
  kube::HttpClientOptions o;
  o.qps = 0;
  o.initial_backoff = 20ms;
  o.max_backoff = 200ms;
  o.max_retries = 20;
  return std::make_shared<kube::HttpClient>(cfg, o);
}

// A job of one Chief and `workers` Workers whose containers run image "lh" with fast backoff.
inline json job_manifest(const std::string& name, int workers = 2) {
  json job = training_job_manifest(name, workers, {{"name", "trainer"}, {"image", "lh"}});
  job["metadata"]["namespace"] = "default";
  return job;
}

// The operator's writes to `server` since the last call, as "METHOD path", for
// expect_forced_reconciles_write_nothing.
inline std::vector<std::string> take_writes(fakeapi::FakeApiServer& server) {
  std::vector<std::string> writes;
  for (const auto& r : server.take_requests()) {
    if (r.write) writes.push_back(r.method + " " + r.path);
  }
  return writes;
}

// A fixture with the fake API server, the operator's client and the simulated kubelet running,
// and the controller started on demand (in-process, as the binary wires it), stopped and joined
// in TearDown on every path.
class FakeServerScenario : public ::testing::Test {
 protected:
  void SetUp() override {
    server.start();
    client = make_client(server);
    kubelet = std::make_unique<FakeKubelet>(server);
  }
  void TearDown() override {
    if (ctl) ctl->stop();
    kubelet->stop();
    client->close();
    server.stop();
  }
  // Starts the controller with scenario_controller_options, changed by `tweak`, and its workers
  // once its caches are in sync.
  void start_operator(const std::function<void(controller::ControllerOptions&)>& tweak = {}) {
    controller::ControllerOptions o = scenario_controller_options(reconciles);
    if (tweak) tweak(o);
    ctl = std::make_unique<controller::Controller>(client, nullptr, o);
    ctl->start();
    ASSERT_TRUE(ctl->wait_for_sync(30s));
    ctl->start_workers();
  }

  fakeapi::FakeApiServer server{server_options()};
  std::shared_ptr<kube::HttpClient> client;
  std::unique_ptr<FakeKubelet> kubelet;
  std::unique_ptr<controller::Controller> ctl;
  std::atomic<int> reconciles{0};
};

inline api::TrainingJobStatus job_status(const fakeapi::FakeApiServer& s, const std::string& n) {
  auto job = s.try_get(kJobs, "default", n);
  if (!job) return {};
  return api::parse_status(job->value("status", json::object()));
}

inline std::vector<json> job_pods(const fakeapi::FakeApiServer& s, const std::string& job) {
  return s.list("pods", "default", std::string(api::kLabelJobName) + "=" + job);
}

inline std::string attempt_of(const json& pod) {
  return pod["metadata"]["annotations"].value(std::string(api::kAnnotationRestartAttempt), "");
}

// All `n` pods of the job exist, are Running, not terminating, and carry restart attempt `a`.
inline bool pods_running_at(const fakeapi::FakeApiServer& s, const std::string& job, size_t n,
                            int64_t a) {
  const auto pods = job_pods(s, job);
  if (pods.size() != n) return false;
  for (const json& p : pods) {
    if (p["metadata"].contains("deletionTimestamp")) return false;
    if (!p.contains("status") || p["status"].value("phase", "") != "Running") return false;
    if (attempt_of(p) != std::to_string(a)) return false;
  }
  return true;
}

// The container of the current pod `pod` exited (the write is aimed at the incarnation read).
inline void fail_pod(fakeapi::FakeApiServer& s, const std::string& pod, int exit_code) {
  patch_pod_status(s, "default", pod, s.get("pods", "default", pod)["metadata"].value("uid", ""),
                   {{"phase", exit_code == 0 ? "Succeeded" : "Failed"},
                    {"conditions", {{{"type", "Ready"}, {"status", "False"}}}},
                    {"containerStatuses",
                     {{{"name", "trainer"},
                       {"ready", false},
                       {"restartCount", 0},
                       {"state", {{"terminated", {{"exitCode", exit_code}}}}}}}}});
}

inline void preempt_pod(fakeapi::FakeApiServer& s, const std::string& pod) {
  patch_pod_status(
      s, "default", pod, s.get("pods", "default", pod)["metadata"].value("uid", ""),
      {{"phase", "Failed"},
       {"reason", "Preempted"},
       {"conditions",
        {{{"type", "DisruptionTarget"}, {"status", "True"}, {"reason", "PreemptionByScheduler"}}}},
       {"containerStatuses",
        {{{"name", "trainer"},
          {"restartCount", 0},
          {"state", {{"terminated", {{"exitCode", 143}}}}}}}}});
}

}  // namespace longhaul::testing
