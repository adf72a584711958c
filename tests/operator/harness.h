// Scenario-test harness: a FakeApiServer on a real socket, the operator's real HttpClient, and a
// simulated kubelet that runs on a thread of its own: it marks new pods Running and Ready (when
// auto_run is on) and finalizes the deletion of terminating pods, except pods the test marks as
// stuck on a lost node. Tests change pod status through the fake server's store, as a kubelet
// would, and wait on conditions with deadlines.
//
// Thread-safety: FakeKubelet's settings are guarded by its mutex; the harness is used from the
// test thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/api/trainingjob.h"
#include "longhaul/fakeapi/server.h"
#include "longhaul/kube/http_client.h"

namespace longhaul::testing {

using json = nlohmann::json;
using namespace std::chrono_literals;

inline constexpr const char* kJobs = "trainingjobs.longhaul.dev";

class FakeKubelet {
 public:
  explicit FakeKubelet(fakeapi::FakeApiServer& server) : server_(server) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeKubelet() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void set_auto_run(bool on) {
    std::lock_guard lock(mu_);
    auto_run_ = on;
  }
  void set_stuck(const std::string& pod, bool stuck) {
    std::lock_guard lock(mu_);
    if (stuck) {
      stuck_.insert(pod);
    } else {
      stuck_.erase(pod);
    }
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      const bool auto_run = auto_run_;
      const std::set<std::string> stuck = stuck_;
      lock.unlock();
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
            server_.patch_status(
                "pods", ns, name,
                {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}});
          }
        }
      } catch (const std::exception&) {
        // A pod vanished between list and write: the next round sees the new state.
      }
      lock.lock();
      // The kubelet's sync period; state is re-read each round, nothing waits on this delay.
      cv_.wait_for(lock, 20ms, [this] { return stopping_; });
    }
  }

  fakeapi::FakeApiServer& server_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool auto_run_ = true;
  std::set<std::string> stuck_;
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
  json container = {{"name", "trainer"}, {"image", "lh"}};
  json tmpl = {{"spec", {{"containers", {container}}, {"terminationGracePeriodSeconds", 5}}}};
  return {
      {"apiVersion", "longhaul.dev/v1alpha1"},
      {"kind", "TrainingJob"},
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      {"spec",
       {{"replicaSpecs",
         {{"Chief", {{"replicas", 1}, {"template", tmpl}}},
          {"Worker", {{"replicas", workers}, {"template", tmpl}}}}},
        {"runPolicy",
         {{"restartScope", "Group"}, {"backoff", {{"initialSeconds", 0}, {"maxSeconds", 0}}}}}}}};
}

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

inline void fail_pod(fakeapi::FakeApiServer& s, const std::string& pod, int exit_code) {
  s.patch_status("pods", "default", pod,
                 {{"phase", exit_code == 0 ? "Succeeded" : "Failed"},
                  {"conditions", {{{"type", "Ready"}, {"status", "False"}}}},
                  {"containerStatuses",
                   {{{"name", "trainer"},
                     {"ready", false},
                     {"restartCount", 0},
                     {"state", {{"terminated", {{"exitCode", exit_code}}}}}}}}});
}

inline void preempt_pod(fakeapi::FakeApiServer& s, const std::string& pod) {
  s.patch_status(
      "pods", "default", pod,
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
