// The chief's training progress (see progress.h).
#include "longhaul/controller/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/controller/prometheus_text.h"
#include "longhaul/kube/cpprest_transport.h"
#include "longhaul/kube/http_client.h"

namespace longhaul::controller {

using json = nlohmann::json;
using std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

constexpr std::string_view kGlobalStep = "longhaul_train_global_step";
constexpr std::string_view kMaxSteps = "longhaul_train_max_steps";
constexpr std::string_view kCheckpointStep = "longhaul_checkpoint_last_step";
constexpr std::string_view kCheckpointTime = "longhaul_checkpoint_last_timestamp_seconds";
constexpr std::string_view kIsChief = "longhaul_worker_is_chief";

// A non-negative finite value as an integer; nullopt otherwise.
std::optional<int64_t> count(double v) {
  if (!std::isfinite(v) || v < 0 || v > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(std::llround(v));
}

}  // namespace

std::optional<ProgressSample> parse_progress_metrics(std::string_view text) {
  const auto first =
      first_samples(text, {kGlobalStep, kMaxSteps, kCheckpointStep, kCheckpointTime, kIsChief});
  auto get = [&](std::string_view name) -> std::optional<int64_t> {
    auto it = first.find(name);
    return it == first.end() ? std::nullopt : count(it->second);
  };
  const auto step = get(kGlobalStep);
  if (!step) return std::nullopt;
  ProgressSample s;
  s.step = *step;
  s.max_steps = get(kMaxSteps).value_or(0);
  const int64_t when = get(kCheckpointTime).value_or(0);
  if (when > 0) {
    s.last_checkpoint_unix = when;
    s.last_checkpoint_step = get(kCheckpointStep).value_or(0);
  }
  if (const auto chief = get(kIsChief)) s.is_chief = *chief == 0 ? 0 : 1;
  return s;
}

std::optional<MetricsEndpoint> metrics_endpoint(const json& pod) {
  if (!pod.is_object()) return std::nullopt;
  const json status = pod.value("status", json::object());
  if (!status.is_object() || status.value("phase", "") != "Running") return std::nullopt;
  const std::string ip = status.value("podIP", std::string());
  if (ip.empty()) return std::nullopt;
  const json spec = pod.value("spec", json::object());
  if (!spec.is_object()) return std::nullopt;
  for (const json& c : spec.value("containers", json::array())) {
    if (!c.is_object()) continue;
    for (const json& port : c.value("ports", json::array())) {
      if (!port.is_object() || port.value("name", "") != "metrics") continue;
      const auto number = port.find("containerPort");
      if (number == port.end() || !number->is_number_integer()) continue;
      const int p = number->get<int>();
      if (p > 0 && p < 65536) {
        return MetricsEndpoint{ip, p, pod.value("metadata", json::object()).value("name", "")};
      }
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// One GET, through the operator's HTTP client (kube/http_transport.h over cpprestsdk)

std::string fetch_metrics(const MetricsEndpoint& endpoint, milliseconds timeout) {
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  const std::string base = "http://" + (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" +
                           std::to_string(endpoint.port);
  const std::string where = "reading the chief's progress from " + base + "/metrics: ";
  kube::HttpResponse response;
  try {
    kube::CpprestTransportOptions options;
    options.server = base;
    options.request_timeout = timeout;
    options.unreachable_hint = "is the pod running and serving its metrics port?";
    kube::CpprestTransport transport(options);
    response = transport.request(
        kube::HttpRequest{"GET",
                          "/metrics",
                          {{"Accept", "text/plain"}, {"User-Agent", kube::default_user_agent()}},
                          "",
                          {}});
  } catch (const Error& e) {
    throw Unavailable(where + e.what());
  }
  if (response.status != 200) {
    throw Unavailable(where + "HTTP status " + std::to_string(response.status));
  }
  return std::move(response.body);
}

// ---------------------------------------------------------------------------------------------
// The rate limit

namespace {

// "3d04h", "2h05m", "26m16s", "40s".
std::string format_eta(int64_t seconds) {
  char buf[48];
  if (seconds >= 86400) {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(seconds / 86400),
                  static_cast<long long>(seconds % 86400 / 3600));
  } else if (seconds >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(seconds / 3600),
                  static_cast<long long>(seconds % 3600 / 60));
  } else if (seconds >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(seconds / 60),
                  static_cast<long long>(seconds % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(seconds));
  }
  return buf;
}

std::string format_unix(int64_t seconds) {
  return api::format_time(api::Time(std::chrono::seconds(seconds)));
}

// What status.progress says for `sample` (observedTime left empty).
api::TrainingProgress progress_of(const ProgressSample& sample) {
  api::TrainingProgress next;
  next.step = sample.step;
  next.max_steps = sample.max_steps;
  if (sample.last_checkpoint_unix > 0) {
    next.last_checkpoint_step = sample.last_checkpoint_step;
    next.last_checkpoint_time = format_unix(sample.last_checkpoint_unix);
  }
  next.steps = std::to_string(sample.step) +
               (sample.max_steps > 0 ? "/" + std::to_string(sample.max_steps) : std::string());
  next.pod = sample.pod;
  if (sample.steps_per_second > 0) next.steps_per_second = sample.steps_per_second;
  if (sample.eta_seconds > 0) next.eta = format_eta(sample.eta_seconds);
  if (sample.completion_unix > 0) {
    next.estimated_completion_time = format_unix(sample.completion_unix);
  }
  if (sample.last_step_unix > 0) next.last_step_time = format_unix(sample.last_step_unix);
  return next;
}

// `x` rounded to 3 significant digits (a rate that jitters in the 4th digit is not a change).
double three_digits(double x) {
  if (!(x > 0) || !std::isfinite(x)) return 0;
  const double scale = std::pow(10.0, 2 - std::floor(std::log10(x)));
  return std::round(x * scale) / scale;
}

}  // namespace

std::optional<milliseconds> apply_progress(api::TrainingJobStatus& status,
                                           const ProgressSample& sample,
                                           std::chrono::seconds interval, api::Time now) {
  api::TrainingProgress next = progress_of(sample);
  if (status.progress) {
    // A chief at step 0 without a checkpoint has not restored yet (a restarted incarnation
    // serves its metrics before its session starts): never a step back to 0 over a recorded one.
    if (sample.step == 0 && sample.last_checkpoint_unix == 0) return std::nullopt;
    // The recorded progress already shows this step: it has been the step since then (a
    // tracker that starts afresh, after an operator restart, first sees it now).
    if (sample.step == status.progress->step && !status.progress->last_step_time.empty()) {
      next.last_step_time = status.progress->last_step_time;
    }
    next.observed_time = status.progress->observed_time;
    if (next == *status.progress) return std::nullopt;
    // An observedTime further in the future than one interval was written by a clock that was
    // wrong (another operator replica before a leader change): it does not hold changes back.
    // Nor does a recorded step 0 without a checkpoint (a new job's chief before its first
    // step): the first real progress is shown at once, one write more per job at most.
    const bool recorded_start =
        status.progress->step == 0 && status.progress->last_checkpoint_time.empty();
    if (auto last = api::parse_time_or_null(status.progress->observed_time);
        last && *last <= now + interval && !recorded_start) {
      const api::Time allowed = *last + interval + std::chrono::seconds(1);
      if (now < allowed) {
        return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(allowed - now));
      }
    }
  }
  next.observed_time = api::format_time(now);
  status.progress = std::move(next);
  return std::nullopt;
}

bool apply_final_progress(api::TrainingJobStatus& status, const ProgressSample& sample,
                          api::Time now) {
  api::TrainingProgress next = progress_of(sample);
  if (status.progress) {
    if (sample.step == 0 && sample.last_checkpoint_unix == 0) return false;
    next.observed_time = status.progress->observed_time;
    if (next == *status.progress) return false;
  }
  next.observed_time = api::format_time(now);
  status.progress = std::move(next);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Termination messages

std::optional<ProgressSample> parse_termination_message(std::string_view message) {
  const json j = json::parse(message, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto integer = [&](const char* key) -> std::optional<int64_t> {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0) return std::nullopt;
    return it->get<int64_t>();
  };
  auto unix_time = [&](const char* key) -> int64_t {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return 0;
    const auto t = api::parse_time_or_null(it->get<std::string>());
    return t ? std::chrono::duration_cast<std::chrono::seconds>(t->time_since_epoch()).count() : 0;
  };
  const auto step = integer("step");
  if (!step) return std::nullopt;
  ProgressSample s;
  s.step = *step;
  s.max_steps = integer("maxSteps").value_or(0);
  if (const int64_t when = unix_time("lastCheckpointTime"); when > 0) {
    s.last_checkpoint_unix = when;
    s.last_checkpoint_step = integer("lastCheckpointStep").value_or(0);
  }
  s.last_step_unix = unix_time("lastStepTime");
  if (const auto rate = j.find("stepsPerSecond"); rate != j.end() && rate->is_number()) {
    s.steps_per_second = three_digits(rate->get<double>());
  }
  if (const auto chief = j.find("chief"); chief != j.end() && chief->is_boolean()) {
    s.is_chief = chief->get<bool>() ? 1 : 0;
  }
  return s;
}

namespace {

// obj[key] when it is a string; "" when absent, null (an unset time, as the API server writes
// it) or of another type.
std::string string_field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::optional<TerminatedProgress> terminated_progress(const json& pod) {
  if (!pod.is_object()) return std::nullopt;
  const json status = pod.value("status", json::object());
  if (!status.is_object()) return std::nullopt;
  const auto statuses = status.find("containerStatuses");
  if (statuses == status.end() || !statuses->is_array()) return std::nullopt;
  const auto metadata = pod.find("metadata");
  const std::string name =
      metadata != pod.end() && metadata->is_object() ? string_field(*metadata, "name") : "";
  for (const json& c : *statuses) {
    if (!c.is_object()) continue;
    const json state = c.value("state", json::object());
    if (!state.is_object()) continue;
    const auto terminated = state.find("terminated");
    if (terminated == state.end() || !terminated->is_object()) continue;
    const auto message = terminated->find("message");
    if (message == terminated->end() || !message->is_string()) continue;
    auto sample = parse_termination_message(message->get<std::string>());
    if (!sample) continue;
    sample->pod = name;
    return TerminatedProgress{*sample, name + "/" + string_field(c, "name") + "@" +
                                           string_field(*terminated, "finishedAt")};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// ProgressTracker

ProgressTracker::ProgressTracker(ProgressTrackerOptions options) : options_(std::move(options)) {
  if (!options_.fetch) options_.fetch = fetch_metrics;
  const int n = std::max(1, options_.threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { scrape_loop(); });
}

ProgressTracker::~ProgressTracker() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

namespace {

// How long after a read to start the next: the interval, or after `failures` failed reads in a
// row the retry delay (retry_initial doubled per failure, at most the interval).
milliseconds next_read_after(int failures, milliseconds retry_initial,
                             std::chrono::seconds interval) {
  if (failures <= 0) return interval;
  milliseconds delay = retry_initial;
  for (int i = 1; i < failures && delay < interval; ++i) delay *= 2;
  return std::min<milliseconds>(delay, interval);
}

}  // namespace

std::optional<milliseconds> ProgressTracker::track(const std::string& key, const json* chief_pod,
                                                   std::chrono::seconds interval,
                                                   api::TrainingJobStatus& status, api::Time now,
                                                   const std::vector<const json*>& other_pods) {
  // The chief role's terminated container: its termination message is the exact end.
  std::optional<TerminatedProgress> terminated;
  if (chief_pod) {
    if (auto t = terminated_progress(*chief_pod); t && t->sample.is_chief != 0) terminated = t;
  }
  for (const json* pod : other_pods) {
    if (terminated || pod == nullptr) break;
    if (auto t = terminated_progress(*pod); t && t->sample.is_chief == 1) terminated = t;
  }
  const bool finished = api::is_finished(status);
  if (finished) {
    // The job's last word: nothing is read any more, and a termination message (the same one
    // on every later reconcile) is no change once applied.
    forget(key);
    if (terminated) apply_final_progress(status, terminated->sample, now);
    return std::nullopt;
  }

  const std::optional<MetricsEndpoint> tf_config_chief =
      chief_pod ? metrics_endpoint(*chief_pod) : std::nullopt;
  std::vector<MetricsEndpoint> endpoints;
  if (tf_config_chief) endpoints.push_back(*tf_config_chief);
  for (const json* pod : other_pods) {
    if (pod == nullptr) continue;
    if (auto e = metrics_endpoint(*pod);
        e && std::find(endpoints.begin(), endpoints.end(), *e) == endpoints.end()) {
      endpoints.push_back(*e);
    }
  }
  std::optional<ProgressSample> sample;
  std::optional<milliseconds> wait;
  bool queued = false;
  {
    MutexLock lock(mu_);
    if (terminated) {
      // Each termination once (a later read of another pod may move on from it); it replaces
      // the metrics sample, so an older read is never applied over it.
      Entry& e = entries_.try_emplace(key).first->second;
      if (e.id == 0) e.id = next_id_++;
      if (e.termination != terminated->termination) {
        e.termination = terminated->termination;
        if (!status.progress || terminated->sample.step >= status.progress->step) {
          apply_final_progress(status, terminated->sample, now);
          e.sample = terminated->sample;
          e.sample_time.reset();
        }
      }
    }
    if (endpoints.empty()) {
      // No pod to read: keep the newest sample (it may still be written, rate limits
      // permitting) but start nothing.
      if (auto it = entries_.find(key); it != entries_.end()) sample = it->second.sample;
    } else {
      auto [it, created] = entries_.try_emplace(key);
      Entry& e = it->second;
      if (e.id == 0) e.id = next_id_++;
      if (e.endpoints != endpoints || e.first_is_tf_config_chief != tf_config_chief.has_value()) {
        e.endpoints = endpoints;
        e.first_is_tf_config_chief = tf_config_chief.has_value();
        e.last_attempt.reset();  // a new incarnation of some pod: read at once
      }
      const milliseconds after = next_read_after(e.failures, options_.retry_initial, interval);
      if (!e.in_flight &&
          (!e.last_attempt || now - *e.last_attempt >= after || now < *e.last_attempt)) {
        e.in_flight = true;
        e.last_attempt = now;
        // The pod that last said it is the chief first, then the rest in rank order.
        std::vector<MetricsEndpoint> order;
        if (e.chief && std::find(endpoints.begin(), endpoints.end(), *e.chief) != endpoints.end()) {
          order.push_back(*e.chief);
        }
        for (const auto& ep : endpoints) {
          if (order.empty() || !(ep == order.front())) order.push_back(ep);
        }
        queue_.push_back(Read{key, e.id, now, std::move(order), tf_config_chief});
        queued = true;
      }
      wait = std::max(milliseconds(1),
                      std::chrono::duration_cast<milliseconds>(*e.last_attempt + after - now));
      sample = e.sample;
    }
  }
  if (queued) work_cv_.notify_one();
  if (sample) {
    if (auto limited = apply_progress(status, *sample, interval, now)) {
      wait = wait ? std::min(*wait, *limited) : *limited;
    }
  }
  return wait;
}

void ProgressTracker::derive_rate(const Entry& e, api::Time when, ProgressSample& s) {
  const int64_t at =
      std::chrono::duration_cast<std::chrono::seconds>(when.time_since_epoch()).count();
  const bool same_pod = e.sample && e.sample_time && e.sample->pod == s.pod;
  if (!same_pod || s.step < e.sample->step) {
    // The first read of this pod, or a step back (the chief restored an older checkpoint).
    s.last_step_unix = s.step > 0 ? at : 0;
    return;
  }
  const ProgressSample& prev = *e.sample;
  if (s.step == prev.step) {
    s.last_step_unix = prev.last_step_unix;  // not advancing: no rate, no ETA
    return;
  }
  s.last_step_unix = at;
  const double seconds = std::chrono::duration<double>(when - *e.sample_time).count();
  if (seconds <= 0) return;
  const double now_rate = static_cast<double>(s.step - prev.step) / seconds;
  s.steps_per_second = three_digits(
      prev.steps_per_second > 0 ? 0.5 * prev.steps_per_second + 0.5 * now_rate : now_rate);
  if (s.steps_per_second > 0 && s.max_steps > s.step) {
    s.eta_seconds = std::llround(static_cast<double>(s.max_steps - s.step) / s.steps_per_second);
    s.completion_unix = at + s.eta_seconds;
  }
}

void ProgressTracker::forget(const std::string& key) {
  MutexLock lock(mu_);
  entries_.erase(key);
  std::erase_if(queue_, [&](const Read& r) { return r.key == key; });
  idle_cv_.notify_all();
}

bool ProgressTracker::wait_idle(milliseconds timeout) {
  MutexLock lock(mu_);
  return idle_cv_.wait_for(mu_, timeout,
                           [&]() REQUIRES(mu_) { return queue_.empty() && busy_ == 0; });
}

void ProgressTracker::scrape_loop() {
  MutexLock lock(mu_);
  for (;;) {
    work_cv_.wait(mu_, [&]() REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Read read = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.Unlock();

    // The first endpoint that holds the chief role answers (see progress.h).
    std::optional<ProgressSample> sample;
    std::optional<MetricsEndpoint> answered;
    std::string error;
    // A hand-over tries several pods; the whole read stays within twice the per-pod deadline,
    // so a group of unreachable pods cannot hold a scrape thread for long.
    const auto budget_end = std::chrono::steady_clock::now() + 2 * options_.timeout;
    for (const MetricsEndpoint& endpoint : read.endpoints) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(budget_end - std::chrono::steady_clock::now());
      if (left <= milliseconds(0)) break;
      try {
        auto s = parse_progress_metrics(options_.fetch(endpoint, std::min(left, options_.timeout)));
        if (!s) {
          error = "no longhaul_train_global_step in its /metrics";
        } else if (s->is_chief == 1 || (s->is_chief < 0 && endpoint == read.tf_config_chief)) {
          s->pod = endpoint.pod;
          sample = s;
          answered = endpoint;
          break;
        } else {
          error = "no pod of the group says longhaul_worker_is_chief 1";
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }

    lock.Lock();
    bool changed = false, retry = false;
    auto it = entries_.find(read.key);
    if (it != entries_.end() && it->second.id == read.id) {
      Entry& e = it->second;
      e.in_flight = false;
      if (sample) {
        derive_rate(e, read.when, *sample);
        changed = e.sample != sample;
        e.sample = sample;
        e.sample_time = read.when;
        // A chief at step 0 without a checkpoint has not started training (loading its data and
        // model, or a restarted one not restored yet): read it again soon, as after a failure.
        const bool started = sample->step > 0 || sample->last_checkpoint_unix > 0;
        e.failures = started ? 0 : e.failures + 1;
        if (e.chief != answered) {
          LH_LOG(INFO) << "reading the training progress from the pod that holds the chief role"
                       << kv("job", read.key) << kv("pod", answered->pod)
                       << kv("endpoint", answered->host + ":" + std::to_string(answered->port));
        }
        e.chief = answered;
      } else if (++e.failures == 1) {
        retry = true;
        LH_LOG(INFO) << "could not read the chief's training progress; status.progress keeps "
                        "its last value"
                     << kv("job", read.key) << kv("error", error);
      }
    }
    if ((changed || retry) && options_.on_update) {
      lock.Unlock();
      options_.on_update(read.key);
      lock.Lock();
    }
    --busy_;  // after on_update: wait_idle() covers the whole read, its report included
    idle_cv_.notify_all();
  }
}

}  // namespace longhaul::controller
