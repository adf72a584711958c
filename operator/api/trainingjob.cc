// The TrainingJob status: parse_status (lenient: an operator reads what any version of it
// wrote), to_json, the condition helpers and API times (see trainingjob.h). The spec is in
// spec.cc.
#include "longhaul/api/trainingjob.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "longhaul/base/error.h"
#include "longhaul/base/rfc3339.h"

namespace longhaul::api {

namespace {
template <typename T>
T lenient(const json& obj, const char* key, T def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return def;
  }
}
}  // namespace

namespace {
// "job-worker-[0-2,5]" -> job-worker-0, -1, -2, -5; any other key is one pod name.
std::vector<std::string> expand_pod_key(const std::string& key) {
  const size_t open = key.rfind("-[");
  if (open == std::string::npos || key.back() != ']') return {key};
  const std::string prefix = key.substr(0, open);
  std::vector<std::string> out;
  std::string ranges = key.substr(open + 2, key.size() - open - 3);
  size_t start = 0;
  while (start <= ranges.size()) {
    const size_t comma = std::min(ranges.find(',', start), ranges.size());
    const std::string part = ranges.substr(start, comma - start);
    const size_t dash = part.find('-');
    try {
      const long first = std::stol(part.substr(0, dash));
      const long last = dash == std::string::npos ? first : std::stol(part.substr(dash + 1));
      for (long i = first; i <= last && last - first <= kMaxReplicasPerType; ++i) {
        out.push_back(prefix + "-" + std::to_string(i));
      }
    } catch (const std::exception&) {
      return {key};  // not ours: keep it as written
    }
    start = comma + 1;
  }
  return out;
}
}  // namespace

namespace {

std::map<std::string, PodRecord> parse_pod_records(const json& records) {
  std::map<std::string, PodRecord> out;
  for (const auto& [k, v] : records.items()) {
    if (!v.is_object()) continue;
    const PodRecord record{lenient<int64_t>(v, "restartAttempt", 0),
                           lenient<bool>(v, "created", false),
                           lenient<int32_t>(v, "containerRestarts", 0)};
    for (const std::string& name : expand_pod_key(k)) out[name] = record;
  }
  return out;
}

TrainingProgress parse_progress(const json& v) {
  return TrainingProgress{lenient<int64_t>(v, "step", 0),
                          lenient<int64_t>(v, "maxSteps", 0),
                          lenient<int64_t>(v, "lastCheckpointStep", 0),
                          lenient<std::string>(v, "lastCheckpointTime", ""),
                          lenient<std::string>(v, "observedTime", ""),
                          lenient<std::string>(v, "steps", ""),
                          lenient<std::string>(v, "pod", ""),
                          lenient<double>(v, "stepsPerSecond", 0.0),
                          lenient<std::string>(v, "eta", ""),
                          lenient<std::string>(v, "estimatedCompletionTime", ""),
                          lenient<std::string>(v, "lastStepTime", "")};
}

// Per-pod records, compactly: pods "<prefix>-<index>" with equal records share one key
// "<prefix>-[0-3,5]".
json pod_records_json(const std::map<std::string, PodRecord>& records) {
  std::map<std::tuple<std::string, int64_t, bool, int32_t>, std::vector<int64_t>> groups;
  json pods = json::object();
  auto record_json = [](const PodRecord& p) {
    return json{{"restartAttempt", p.restart_attempt},
                {"created", p.created},
                {"containerRestarts", p.container_restarts}};
  };
  for (const auto& [k, p] : records) {
    const size_t dash = k.rfind('-');
    const bool indexed = dash != std::string::npos && dash + 1 < k.size() && k.size() - dash < 10 &&
                         k.find_first_not_of("0123456789", dash + 1) == std::string::npos;
    if (!indexed) {
      pods[k] = record_json(p);
      continue;
    }
    groups[{k.substr(0, dash), p.restart_attempt, p.created, p.container_restarts}].push_back(
        std::stoll(k.substr(dash + 1)));
  }
  for (auto& [g, indices] : groups) {
    const auto& [prefix, attempt, created, restarts] = g;
    std::sort(indices.begin(), indices.end());
    std::string ranges;
    for (size_t i = 0; i < indices.size();) {
      size_t j = i;
      while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
      ranges += (ranges.empty() ? "" : ",") + std::to_string(indices[i]) +
                (j > i ? "-" + std::to_string(indices[j]) : "");
      i = j + 1;
    }
    pods[prefix + "-[" + ranges + "]"] = record_json(PodRecord{attempt, created, restarts});
  }
  return pods;
}

json progress_json(const TrainingProgress& p) {
  json j = {{"step", p.step}};
  if (p.max_steps > 0) j["maxSteps"] = p.max_steps;
  if (!p.last_checkpoint_time.empty()) {
    j["lastCheckpointStep"] = p.last_checkpoint_step;
    j["lastCheckpointTime"] = p.last_checkpoint_time;
  }
  if (!p.observed_time.empty()) j["observedTime"] = p.observed_time;
  if (!p.steps.empty()) j["steps"] = p.steps;
  if (!p.pod.empty()) j["pod"] = p.pod;
  if (p.steps_per_second > 0) j["stepsPerSecond"] = p.steps_per_second;
  if (!p.eta.empty()) j["eta"] = p.eta;
  if (!p.estimated_completion_time.empty()) {
    j["estimatedCompletionTime"] = p.estimated_completion_time;
  }
  if (!p.last_step_time.empty()) j["lastStepTime"] = p.last_step_time;
  return j;
}

}  // namespace

TrainingJobStatus parse_status(const json& status) {
  TrainingJobStatus s;
  if (!status.is_object()) return s;
  s.phase = lenient<std::string>(status, "phase", "");
  if (auto it = status.find("conditions"); it != status.end() && it->is_array()) {
    for (const json& c : *it) {
      if (!c.is_object()) continue;
      s.conditions.push_back(
          Condition{lenient<std::string>(c, "type", ""), lenient<std::string>(c, "status", ""),
                    lenient<std::string>(c, "reason", ""), lenient<std::string>(c, "message", ""),
                    lenient<std::string>(c, "lastTransitionTime", "")});
    }
  }
  if (auto it = status.find("replicaStatuses"); it != status.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (!v.is_object()) continue;
      s.replica_statuses[k] =
          ReplicaStatus{lenient<int32_t>(v, "replicas", 0), lenient<int32_t>(v, "active", 0),
                        lenient<int32_t>(v, "ready", 0), lenient<int32_t>(v, "succeeded", 0),
                        lenient<int32_t>(v, "failed", 0)};
    }
  }
  // unsettledPods; status.pods is what operators before it wrote (a record for every pod).
  if (auto it = status.find("unsettledPods"); it != status.end() && it->is_object()) {
    s.pods = parse_pod_records(*it);
  } else if (auto legacy = status.find("pods"); legacy != status.end() && legacy->is_object()) {
    s.pods = parse_pod_records(*legacy);
    s.legacy_pods = true;
  }
  if (auto it = status.find("podStatuses"); it != status.end() && it->is_array()) {
    for (const json& v : *it) {
      if (!v.is_object()) continue;
      s.pod_statuses.push_back({lenient<std::string>(v, "name", ""),
                                lenient<std::string>(v, "phase", ""),
                                lenient<std::string>(v, "reason", "")});
    }
  }
  s.pod_statuses_omitted = lenient<int32_t>(status, "podStatusesOmitted", 0);
  s.ready = lenient<std::string>(status, "ready", "");
  s.restart_count = lenient<int32_t>(status, "restartCount", 0);
  s.preemption_count = lenient<int32_t>(status, "preemptionCount", 0);
  s.failure_count = lenient<int32_t>(status, "failureCount", 0);
  s.failure_budget = lenient<std::string>(status, "failureBudget", "");
  s.chief_pod = lenient<std::string>(status, "chiefPod", "");
  s.restart_attempt = lenient<int64_t>(status, "restartAttempt", 0);
  if (auto it = status.find("groupRestartAttempt"); it != status.end() && it->is_number_integer()) {
    s.group_restart_attempt = it->get<int64_t>();
  }
  s.recoveries = lenient<int32_t>(status, "recoveries", 0);
  s.recovering_since = lenient<std::string>(status, "recoveringSince", "");
  if (auto it = status.find("lastRecoveryMilliseconds");
      it != status.end() && it->is_number_integer()) {
    s.last_recovery_milliseconds = it->get<int64_t>();
  }
  if (auto it = status.find("replicaFailures"); it != status.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (!v.is_object()) continue;
      s.replica_failures[k] =
          ReplicaFailures{lenient<int32_t>(v, "count", 0), lenient<std::string>(v, "since", "")};
    }
  }
  s.next_restart_time = lenient<std::string>(status, "nextRestartTime", "");
  s.observed_generation = lenient<int64_t>(status, "observedGeneration", 0);
  s.start_time = lenient<std::string>(status, "startTime", "");
  s.completion_time = lenient<std::string>(status, "completionTime", "");
  if (auto it = status.find("progress"); it != status.end() && it->is_object()) {
    s.progress = parse_progress(*it);
  }
  return s;
}

json to_json(const TrainingJobStatus& s) {
  json out = json::object();
  if (!s.phase.empty()) out["phase"] = s.phase;
  json conds = json::array();
  for (const Condition& c : s.conditions) {
    json j = {{"type", c.type}, {"status", c.status}};
    if (!c.reason.empty()) j["reason"] = c.reason;
    if (!c.message.empty()) j["message"] = c.message;
    if (!c.last_transition_time.empty()) j["lastTransitionTime"] = c.last_transition_time;
    conds.push_back(std::move(j));
  }
  out["conditions"] = std::move(conds);
  json rs = json::object();
  for (const auto& [k, r] : s.replica_statuses) {
    rs[k] = {{"replicas", r.replicas},
             {"active", r.active},
             {"ready", r.ready},
             {"succeeded", r.succeeded},
             {"failed", r.failed}};
  }
  out["replicaStatuses"] = std::move(rs);
  if (!s.pods.empty()) out[s.legacy_pods ? "pods" : "unsettledPods"] = pod_records_json(s.pods);
  if (!s.pod_statuses.empty()) {
    json list = json::array();
    for (const TrainingJobStatus::PodStatus& p : s.pod_statuses) {
      json j = {{"name", p.name}, {"phase", p.phase}};
      if (!p.reason.empty()) j["reason"] = p.reason;
      list.push_back(std::move(j));
    }
    out["podStatuses"] = std::move(list);
  }
  if (s.pod_statuses_omitted > 0) out["podStatusesOmitted"] = s.pod_statuses_omitted;
  if (!s.ready.empty()) out["ready"] = s.ready;
  out["restartCount"] = s.restart_count;
  out["preemptionCount"] = s.preemption_count;
  out["failureCount"] = s.failure_count;
  if (!s.failure_budget.empty()) out["failureBudget"] = s.failure_budget;
  if (!s.chief_pod.empty()) out["chiefPod"] = s.chief_pod;
  out["restartAttempt"] = s.restart_attempt;
  if (s.group_restart_attempt) out["groupRestartAttempt"] = *s.group_restart_attempt;
  if (s.recoveries != 0) out["recoveries"] = s.recoveries;
  if (!s.recovering_since.empty()) out["recoveringSince"] = s.recovering_since;
  if (s.last_recovery_milliseconds) out["lastRecoveryMilliseconds"] = *s.last_recovery_milliseconds;
  if (!s.replica_failures.empty()) {
    json failures = json::object();
    for (const auto& [pod, f] : s.replica_failures) {
      failures[pod] = {{"count", f.count}, {"since", f.since}};
    }
    out["replicaFailures"] = std::move(failures);
  }
  if (!s.next_restart_time.empty()) out["nextRestartTime"] = s.next_restart_time;
  out["observedGeneration"] = s.observed_generation;
  if (!s.start_time.empty()) out["startTime"] = s.start_time;
  if (!s.completion_time.empty()) out["completionTime"] = s.completion_time;
  if (s.progress) out["progress"] = progress_json(*s.progress);
  return out;
}

bool set_condition(TrainingJobStatus& s, std::string_view type, std::string_view status,
                   std::string_view reason, std::string_view message, Time now) {
  for (Condition& c : s.conditions) {
    if (c.type != type) continue;
    bool changed = false;
    if (c.status != status) {
      c.status = status;
      c.last_transition_time = format_time(now);
      changed = true;
    }
    if (c.reason != reason) {
      c.reason = reason;
      changed = true;
    }
    if (c.message != message) {
      c.message = message;
      changed = true;
    }
    return changed;
  }
  s.conditions.push_back(Condition{std::string(type), std::string(status), std::string(reason),
                                   std::string(message), format_time(now)});
  return true;
}

const Condition* find_condition(const TrainingJobStatus& s, std::string_view type) {
  for (const Condition& c : s.conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

bool condition_true(const TrainingJobStatus& s, std::string_view type) {
  const Condition* c = find_condition(s, type);
  return c != nullptr && c->status == "True";
}

bool is_finished(const TrainingJobStatus& s) {
  return s.phase == phase::kSucceeded || s.phase == phase::kFailed;
}

std::string format_time(Time t) { return format_rfc3339(t); }

std::string format_micro_time(Time t) { return format_rfc3339_micro(t); }

Time parse_time(std::string_view text) {
  int y, mo, d, h, mi, sec;
  char rest[40] = {0};
  const std::string s(text);
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%39s", &y, &mo, &d, &h, &mi, &sec, rest) < 6) {
    throw InvalidArgument("time \"" + s + "\" is not RFC 3339 (2026-11-21T13:20:39Z)");
  }
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  Time t = std::chrono::system_clock::from_time_t(timegm(&tm));
  std::string_view r(rest);
  if (!r.empty() && r.front() == '.') {
    size_t i = 1;
    double frac = 0, scale = 0.1;
    while (i < r.size() && r[i] >= '0' && r[i] <= '9') {
      frac += (r[i] - '0') * scale;
      scale /= 10;
      ++i;
    }
    t += std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(frac));
    r.remove_prefix(i);
  }
  if (!r.empty() && (r.front() == '+' || r.front() == '-') && r.size() >= 6) {
    const int oh = std::stoi(std::string(r.substr(1, 2)));
    const int om = std::stoi(std::string(r.substr(4, 2)));
    const auto off = std::chrono::hours(oh) + std::chrono::minutes(om);
    t = r.front() == '+' ? t - off : t + off;
  }
  return t;
}

std::optional<Time> parse_time_or_null(std::string_view text) {
  if (text.empty()) return std::nullopt;
  try {
    return parse_time(text);
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

}  // namespace longhaul::api
