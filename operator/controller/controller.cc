// The controller loop (see controller.h).
#include "longhaul/controller/controller.h"

#include <time.h>

#include "longhaul/api/trainingjob.h"
#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/controller/ownership.h"
#include "longhaul/kube/stop.h"

namespace longhaul::controller {

namespace res = kube::resources;

namespace {

// A job update that changed only its status (this operator's own write, which already acted
// on everything it decided) needs no reconcile; spec, metadata or deletion changes do.
bool status_only_change(const json& old_job, const json& new_job) {
  const json& a = old_job.at("metadata");
  const json& b = new_job.at("metadata");
  for (const char* key : {"generation", "deletionTimestamp", "labels", "annotations", "uid"}) {
    if (a.value(key, json()) != b.value(key, json())) return false;
  }
  return old_job.value("spec", json()) == new_job.value("spec", json());
}

// CPU time of the calling thread.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

void trim_cached_pod(json& pod) {
  kube::strip_for_cache(pod);
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return;
  for (const char* key : {"volumes", "tolerations", "affinity", "topologySpreadConstraints"}) {
    spec->erase(key);
  }
  for (const char* kind : {"initContainers", "containers", "ephemeralContainers"}) {
    auto list = spec->find(kind);
    if (list == spec->end() || !list->is_array()) continue;
    for (json& c : *list) {
      if (!c.is_object()) continue;
      for (const char* key : {"env", "envFrom", "volumeMounts", "volumeDevices", "command", "args",
                              "livenessProbe", "readinessProbe", "startupProbe", "lifecycle"}) {
        c.erase(key);
      }
    }
  }
}

Controller::Controller(std::shared_ptr<kube::Client> client, EventSink* events,
                       ControllerOptions options)
    : client_(std::move(client)), options_(std::move(options)) {
  view_ = std::make_unique<InformerClusterView>(*client_, job_informers_, pod_informers_,
                                                child_informers_);
  if (events == nullptr) {
    own_events_ =
        std::make_unique<RecorderEventSink>(std::make_shared<kube::EventRecorder>(client_));
    events = own_events_.get();
  }
  // A read of a chief's metrics that brings new training progress reconciles its job.
  ReconcilerOptions reconciler = options_.reconciler;
  reconciler.progress.on_update = [this,
                                   also = reconciler.progress.on_update](const std::string& key) {
    if (also) also(key);
    enqueue(key);
  };
  reconciler_ = std::make_unique<Reconciler>(*client_, view_.get(), events, reconciler);
  kube::WorkQueueOptions q;
  q.base_delay = options_.retry_base_delay;
  q.max_delay = options_.retry_max_delay;
  q.on_depth = options_.on_queue_depth;
  q.on_latency = options_.on_queue_latency;
  queue_ = std::make_unique<kube::WorkQueue>(q);

  std::vector<std::string> namespaces = options_.namespaces;
  if (namespaces.empty()) namespaces.push_back("");
  const std::string owned_selector(api::kLabelJobName);  // "has the label"
  for (const std::string& ns : namespaces) {
    auto make = [&](const kube::Resource& r, const std::string& selector) {
      kube::InformerOptions o;
      o.resource = r;
      o.ns = ns;
      o.label_selector = selector;
      o.watch_timeout = options_.watch_timeout;
      // The caches keep what the operator reads (informer.h). The job's status is written from
      // its cached copy: it keeps everything but managedFields, which the server keeps. A job's
      // pods are looked up by its name label.
      const bool pods = r.kind == res::kPods.kind;
      o.transform = pods                                ? trim_cached_pod
                    : r.kind == res::kTrainingJobs.kind ? kube::strip_managed_fields
                                                        : kube::strip_for_cache;
      if (pods) o.indexed_labels = {std::string(api::kLabelJobName)};
      return std::make_unique<kube::Informer>(client_, o);
    };
    auto jobs = make(res::kTrainingJobs, "");
    jobs->add_handlers({[this](const json& o) { enqueue(kube::object_key(o)); },
                        [this](const json& old_job, const json& o) {
                          if (!status_only_change(old_job, o)) enqueue(kube::object_key(o));
                        },
                        [this](const json& o) { enqueue(kube::object_key(o)); }});
    job_informers_.push_back(std::move(jobs));
    auto pods = make(res::kPods, owned_selector);
    auto services = make(res::kServices, owned_selector);
    auto claims = make(res::kPersistentVolumeClaims, owned_selector);
    for (auto* inf : {pods.get(), services.get(), claims.get()}) {
      inf->add_handlers({[this](const json& o) { enqueue_owner(o); },
                         [this](const json&, const json& o) { enqueue_owner(o); },
                         [this](const json& o) { enqueue_owner(o); }});
    }
    pod_informers_.push_back(std::move(pods));
    child_informers_.push_back(std::move(services));
    child_informers_.push_back(std::move(claims));
  }
}

Controller::~Controller() {
  stop();
  reconciler_.reset();  // joins its progress reads, which enqueue into queue_
}

void Controller::enqueue(const std::string& key) { queue_->add(key); }

void Controller::enqueue_owner(const json& object) {
  const json& md = object.at("metadata");
  const std::string ns = md.value("namespace", std::string());
  if (const json* ref = controlling_job_reference(object)) {
    enqueue(kube::object_key(ns, ref->value("name", std::string())));
    return;
  }
  const json labels = md.value("labels", json::object());
  if (labels.contains(api::kLabelJobName) && labels[api::kLabelJobName].is_string()) {
    enqueue(kube::object_key(ns, labels[api::kLabelJobName].get<std::string>()));
  }
}

void Controller::start() {
  if (started_) return;
  started_ = true;
  for (auto* group : {&child_informers_, &pod_informers_, &job_informers_}) {
    for (auto& inf : *group) inf->start();
  }
  if (options_.resync_period.count() > 0) resync_ = std::thread([this] { resync_loop(); });
}

bool Controller::synced() const {
  for (const auto* group : {&child_informers_, &pod_informers_, &job_informers_}) {
    for (const auto& inf : *group) {
      if (!inf->has_synced()) return false;
    }
  }
  return true;
}

bool Controller::wait_for_sync(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto* group : {&child_informers_, &pod_informers_, &job_informers_}) {
    for (const auto& inf : *group) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !inf->wait_for_sync(left)) return false;
    }
  }
  return true;
}

void Controller::start_workers() {
  if (workers_running_.exchange(true)) return;
  // Every known job is queued: events seen while not leading were queued but may predate the
  // previous leader's last writes.
  for (auto& inf : job_informers_) {
    for (const std::string& key : inf->store().keys()) queue_->add(key);
  }
  std::stop_token token;
  {
    MutexLock lock(term_mu_);
    term_ = std::stop_source();
    token = term_.get_token();
  }
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this, token] {
      kube::ScopedStopToken scope(token);
      worker_loop();
    });
  }
  LH_LOG(INFO) << "controller workers started" << kv("workers", options_.workers);
}

bool Controller::workers_active() {
  MutexLock lock(term_mu_);
  return workers_running_.load() && !term_.stop_requested();
}

void Controller::cancel_workers() {
  MutexLock lock(term_mu_);
  term_.request_stop();
}

void Controller::stop_workers() {
  cancel_workers();
  if (!workers_running_.exchange(false)) return;
  // Workers notice within one get_for() timeout and finish the reconcile they are in. The queue
  // stays: informer handlers keep adding to it while this replica does not lead.
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  LH_LOG(INFO) << "controller workers stopped";
}

void Controller::stop() {
  stop_workers();
  queue_->shutdown();
  {
    std::lock_guard lock(resync_mu_);
    started_ = false;
  }
  resync_cv_.notify_all();
  if (resync_.joinable()) resync_.join();
  for (auto* group : {&job_informers_, &pod_informers_, &child_informers_}) {
    for (auto& inf : *group) inf->stop();
  }
}

void Controller::resync_loop() {
  std::unique_lock lock(resync_mu_);
  while (started_) {
    resync_cv_.wait_for(lock, options_.resync_period);
    if (!started_) break;
    if (!workers_running_) continue;
    for (auto& inf : job_informers_) {
      for (const std::string& key : inf->store().keys()) queue_->add(key);
    }
  }
}

void Controller::worker_loop() {
  kube::WorkQueue& queue = *queue_;
  while (workers_running_ && !kube::stop_requested()) {
    const auto key = queue.get_for(std::chrono::milliseconds(200));
    if (!key) continue;
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_seconds();
    const auto slash = key->find('/');
    const std::string ns = slash == std::string::npos ? "" : key->substr(0, slash);
    const std::string name = slash == std::string::npos ? *key : key->substr(slash + 1);
    std::string result = "success";
    try {
      const ReconcileResult r = reconciler_->reconcile(ns, name);
      queue.forget(*key);
      if (r.requeue_after) {
        queue.add_after(*key, *r.requeue_after);
        result = "requeue";
      }
    } catch (const Cancelled& e) {
      // Leadership lost or shutting down: the next term (this replica's or another's)
      // reconciles the key again; start_workers() queues every job.
      LH_LOG(INFO) << "reconcile stopped" << kv("job", *key) << kv("error", e.what());
      result = "cancelled";
    } catch (const kube::ConflictError& e) {
      // The job changed under us: reconcile again from the fresh object.
      LH_LOG(DEBUG) << "conflict, requeueing" << kv("job", *key) << kv("error", e.what());
      queue.add_rate_limited(*key);
      result = "requeue";
    } catch (const std::exception& e) {
      LH_LOG(WARNING) << "reconcile failed" << kv("job", *key) << kv("error", e.what());
      queue.add_rate_limited(*key);
      result = "error";
    }
    queue.done(*key);
    if (options_.on_reconcile) {
      options_.on_reconcile(
          result, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (options_.on_reconcile_cpu) options_.on_reconcile_cpu(thread_cpu_seconds() - cpu_start);
  }
}

}  // namespace longhaul::controller
