#include "longhaul/envtest/fake_kubelet.h"

#include <atomic>
#include <ctime>
#include <thread>
#include <vector>

#include "longhaul/base/error.h"
#include "longhaul/base/rfc3339.h"

namespace longhaul::envtest {
namespace {

using namespace std::chrono_literals;

std::string now_rfc3339() { return format_rfc3339(std::chrono::system_clock::now()); }

const kube::Resource kNodes{"", "v1", "nodes", false, "Node"};

}  // namespace

FakeKubelet::FakeKubelet(const ControlPlane& plane, std::string ns, std::string node)
    : plane_(plane), ns_(std::move(ns)), node_(std::move(node)) {
  kube::HttpClientOptions o;
  o.qps = 0;
  o.initial_backoff = 20ms;
  o.max_backoff = 500ms;
  o.max_retries = 20;
  o.user_agent = "longhaul-envtest-kubelet";
  client_ = std::make_shared<kube::HttpClient>(plane_.admin_config(), o);
  try {
    client_->create(
        kNodes, "",
        {{"apiVersion", "v1"},
         {"kind", "Node"},
         {"metadata", {{"name", node_}, {"labels", {{"kubernetes.io/hostname", node_}}}}}});
  } catch (const kube::AlreadyExistsError&) {
    // Another test's kubelet registered it.
  }
  heartbeat();
  thread_ = std::thread([this] { run(); });
}

FakeKubelet::~FakeKubelet() { stop(); }

void FakeKubelet::stop() {
  {
    longhaul::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  client_->close();
}

void FakeKubelet::set_auto_run(bool on) {
  longhaul::MutexLock lock(mu_);
  auto_run_ = on;
}

void FakeKubelet::set_stuck(const std::string& pod, bool stuck) {
  longhaul::MutexLock lock(mu_);
  if (stuck) {
    stuck_.insert(pod);
  } else {
    stuck_.erase(pod);
  }
}

void FakeKubelet::heartbeat() {
  // The node lifecycle controller marks a node without heartbeats NotReady after 40 s and then
  // its pods not Ready: keep it Ready.
  const std::string now = now_rfc3339();
  client_->patch(kNodes, "", node_,
                 {{"status",
                   {{"conditions",
                     {{{"type", "Ready"},
                       {"status", "True"},
                       {"reason", "KubeletReady"},
                       {"message", "longhaul envtest fake kubelet"},
                       {"lastHeartbeatTime", now},
                       {"lastTransitionTime", now}}}}}}},
                 kube::PatchType::kStrategicMerge, /*status_subresource=*/true);
  last_heartbeat_ = std::chrono::steady_clock::now();
}

json FakeKubelet::container_statuses_of(const json& p, const json& state, bool ready) {
  json statuses = json::array();
  for (const json& c : p["spec"]["containers"]) {
    statuses.push_back({{"name", c["name"]},
                        {"image", c.value("image", "")},
                        {"imageID", ""},
                        {"ready", ready},
                        {"restartCount", 0},
                        {"state", state}});
  }
  return statuses;
}

// By name, with the uid of the incarnation `pod` in the patch: metadata.uid is immutable, so the
// API server refuses the write (422) once the name belongs to a pod re-created since, and a
// deleted pod's status never lands on its same-name successor (as a real kubelet's patches).
void FakeKubelet::patch_status(const json& pod, const json& status) {
  const json& md = pod.at("metadata");
  client_->patch(kube::resources::kPods, ns_, md.value("name", ""),
                 {{"metadata", {{"uid", md.value("uid", "")}}}, {"status", status}},
                 kube::PatchType::kMerge, /*status_subresource=*/true);
}

void FakeKubelet::terminate(const std::string& pod, int exit_code, const std::string& message) {
  const json p = client_->get(kube::resources::kPods, ns_, pod);
  json terminated = {{"exitCode", exit_code}};
  if (!message.empty()) terminated["message"] = message;
  patch_status(
      p, {{"phase", exit_code == 0 ? "Succeeded" : "Failed"},
          {"conditions", {{{"type", "Ready"}, {"status", "False"}}}},
          {"containerStatuses", container_statuses_of(p, {{"terminated", terminated}}, false)}});
}

void FakeKubelet::preempt(const std::string& pod) {
  const json p = client_->get(kube::resources::kPods, ns_, pod);
  patch_status(
      p,
      {{"phase", "Failed"},
       {"reason", "Preempted"},
       {"conditions",
        {{{"type", "Ready"}, {"status", "False"}},
         {{"type", "DisruptionTarget"}, {"status", "True"}, {"reason", "PreemptionByScheduler"}}}},
       {"containerStatuses",
        container_statuses_of(p, {{"terminated", {{"exitCode", 143}}}}, false)}});
}

void FakeKubelet::sync_once() {
  bool auto_run;
  std::set<std::string> stuck;
  {
    longhaul::MutexLock lock(mu_);
    auto_run = auto_run_;
    stuck = stuck_;
  }
  if (std::chrono::steady_clock::now() - last_heartbeat_ > 10s) heartbeat();
  const json pods = client_->list(kube::resources::kPods, ns_, {});
  std::vector<const json*> to_start;
  for (const json& pod : pods["items"]) {
    const json& md = pod["metadata"];
    const std::string name = md.value("name", "");
    if (md.contains("deletionTimestamp")) {
      if (stuck.contains(name) || !pod["spec"].contains("nodeName")) continue;
      // The containers stopped: complete the deletion of exactly this incarnation.
      kube::DeleteOptions now;
      now.grace_period_seconds = 0;
      now.precondition_uid = md.value("uid", "");
      try {
        client_->remove(kube::resources::kPods, ns_, name, now);
      } catch (const kube::NotFoundError&) {
      } catch (const kube::ConflictError&) {
      }
      continue;
    }
    const std::string phase = pod.value(json::json_pointer("/status/phase"), std::string());
    if (!auto_run || (phase != "Pending" && !phase.empty())) continue;
    to_start.push_back(&pod);
  }
  // Bind and start new pods a few at a time, as a node's kubelet works its pods concurrently:
  // a 1000-replica job starts in seconds, not in a minute of one request after another.
  std::atomic<size_t> next{0};
  auto start_pods = [&] {
    for (size_t i = next++; i < to_start.size(); i = next++) {
      const json& pod = *to_start[i];
      const std::string name = pod["metadata"].value("name", "");
      try {
        if (!pod["spec"].contains("nodeName")) {
          plane_.call("POST", "/api/v1/namespaces/" + ns_ + "/pods/" + name + "/binding",
                      {{"apiVersion", "v1"},
                       {"kind", "Binding"},
                       {"metadata", {{"name", name}}},
                       {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node_}}}});
        }
        patch_status(
            pod,
            {{"phase", "Running"},
             {"conditions",
              {{{"type", "Ready"}, {"status", "True"}},
               {{"type", "ContainersReady"}, {"status", "True"}}}},
             {"containerStatuses",
              container_statuses_of(pod, {{"running", {{"startedAt", now_rfc3339()}}}}, true)}});
      } catch (const std::exception&) {
        // Deleted or changed meanwhile: the next round sees the new state.
      }
    }
  };
  constexpr size_t kParallel = 4;
  std::vector<std::thread> threads;
  for (size_t t = 1; t < kParallel && t < to_start.size(); ++t) threads.emplace_back(start_pods);
  start_pods();
  for (std::thread& t : threads) t.join();
}

void FakeKubelet::run() {
  longhaul::MutexLock lock(mu_);
  while (!stopping_) {
    lock.Unlock();
    try {
      sync_once();
    } catch (const std::exception&) {
      // A pod changed or vanished between list and write: the next round sees the new state.
    }
    lock.Lock();
    // The kubelet's sync period; state is re-read each round, nothing waits on this delay.
    cv_.wait_for(mu_, 30ms, [this]() REQUIRES(mu_) { return stopping_; });
  }
}

}  // namespace longhaul::envtest
