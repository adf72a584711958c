#include "longhaul/api/trainingjob.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <set>
#include <tuple>

#include "longhaul/api/validation.h"
#include "longhaul/base/error.h"
#include "longhaul/base/field.h"
#include "longhaul/base/rfc3339.h"

namespace longhaul::api {
namespace {

using field::fail;

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& expect_object(const json& v, const std::string& path) {
  if (!v.is_object()) fail(path, "must be an object");
  return v;
}

int64_t get_int(const json& obj, const char* key, const std::string& path, int64_t def, int64_t min,
                int64_t max) {
  const json* v = field(obj, key);
  if (v == nullptr) return def;
  const std::string p = field::path(path, key);
  int64_t value = 0;
  if (v->is_number_integer()) {
    value = v->get<int64_t>();
  } else if (v->is_number_float() && v->get<double>() == static_cast<int64_t>(v->get<double>())) {
    value = static_cast<int64_t>(v->get<double>());
  } else {
    fail(p, "must be an integer");
  }
  if (value < min) fail(p, "must be >= " + std::to_string(min));
  if (value > max) fail(p, "must be <= " + std::to_string(max));
  return value;
}

std::optional<int64_t> get_opt_int(const json& obj, const char* key, const std::string& path,
                                   int64_t min, int64_t max) {
  if (field(obj, key) == nullptr) return std::nullopt;
  return get_int(obj, key, path, 0, min, max);
}

std::string get_string(const json& obj, const char* key, const std::string& path,
                       const std::string& def) {
  const json* v = field(obj, key);
  if (v == nullptr) return def;
  if (!v->is_string()) fail(field::path(path, key), "must be a string");
  return v->get<std::string>();
}

bool get_bool(const json& obj, const char* key, const std::string& path, bool def) {
  const json* v = field(obj, key);
  if (v == nullptr) return def;
  if (!v->is_boolean()) fail(field::path(path, key), "must be a boolean");
  return v->get<bool>();
}

template <typename E, size_t N>
E get_enum(const json& obj, const char* key, const std::string& path, E def,
           const std::pair<const char*, E> (&values)[N]) {
  const json* v = field(obj, key);
  if (v == nullptr) return def;
  const std::string p = field::path(path, key);
  if (!v->is_string()) fail(p, "must be a string");
  const std::string s = v->get<std::string>();
  std::string allowed;
  for (const auto& [name, value] : values) {
    if (s == name) return value;
    allowed += (allowed.empty() ? "" : ", ") + std::string(name);
  }
  fail(p, "unsupported value \"" + s + "\": must be one of " + allowed);
}

template <typename E, size_t N>
const char* enum_name(E value, const std::pair<const char*, E> (&values)[N]) {
  for (const auto& [name, v] : values) {
    if (v == value) return name;
  }
  return "";
}

constexpr std::pair<const char*, RestartPolicy> kRestartPolicies[] = {
    {"Never", RestartPolicy::kNever},
    {"OnFailure", RestartPolicy::kOnFailure},
    {"ExitCode", RestartPolicy::kExitCode}};
// "Pod" (the name before Replica) is still read; it is written back as Replica.
constexpr std::pair<const char*, RestartScope> kRestartScopes[] = {
    {"Replica", RestartScope::kReplica},
    {"Group", RestartScope::kGroup},
    {"Pod", RestartScope::kReplica}};
constexpr std::pair<const char*, CleanPodPolicy> kCleanPodPolicies[] = {
    {"Running", CleanPodPolicy::kRunning},
    {"All", CleanPodPolicy::kAll},
    {"None", CleanPodPolicy::kNone}};
constexpr std::pair<const char*, SuccessPolicy> kSuccessPolicies[] = {
    {"ChiefSucceeds", SuccessPolicy::kChiefSucceeds}, {"AllWorkers", SuccessPolicy::kAllWorkers}};
constexpr std::pair<const char*, ReclaimPolicy> kReclaimPolicies[] = {
    {"Retain", ReclaimPolicy::kRetain}, {"Delete", ReclaimPolicy::kDelete}};

std::vector<int32_t> get_exit_codes(const json& obj, const char* key, const std::string& path) {
  std::vector<int32_t> out;
  const json* v = field(obj, key);
  if (v == nullptr) return out;
  const std::string p = field::path(path, key);
  if (!v->is_array()) fail(p, "must be an array of exit codes");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    const std::string ep = field::element(p, i);
    if (!e.is_number_integer()) fail(ep, "must be an integer");
    const int64_t code = e.get<int64_t>();
    if (code < 1 || code > 255) fail(ep, "must be an exit code between 1 and 255");
    out.push_back(static_cast<int32_t>(code));
  }
  return out;
}

ReplicaSpec parse_replica(const json& v, const std::string& path, ReplicaType type) {
  expect_object(v, path);
  static const std::set<std::string> kKnown = {"replicas", "template", "restartPolicy"};
  for (const auto& [key, _] : v.items()) {
    if (!kKnown.contains(key)) fail(path + "." + key, "unknown field");
  }
  ReplicaSpec r;
  r.replicas = static_cast<int32_t>(get_int(v, "replicas", path, 1, 0, kMaxReplicasPerType));
  if (type == ReplicaType::kChief && r.replicas > 1) {
    fail(path + ".replicas", "must be <= 1 (at most one Chief replica)");
  }
  r.restart_policy = get_enum(v, "restartPolicy", path, RestartPolicy::kExitCode, kRestartPolicies);
  const json* t = field(v, "template");
  if (t == nullptr) fail(path + ".template", "is required (a PodTemplateSpec)");
  expect_object(*t, path + ".template");
  if (const json* m = field(*t, "metadata")) expect_object(*m, path + ".template.metadata");
  if (const json* s = field(*t, "spec")) expect_object(*s, path + ".template.spec");
  r.pod_template = *t;
  return r;
}

bool is_dns_label(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

}  // namespace

std::string_view replica_type_name(ReplicaType t) {
  switch (t) {
    case ReplicaType::kChief:
      return "Chief";
    case ReplicaType::kWorker:
      return "Worker";
    case ReplicaType::kPS:
      return "PS";
    case ReplicaType::kEvaluator:
      return "Evaluator";
  }
  return "";
}

std::string_view replica_type_label(ReplicaType t) {
  switch (t) {
    case ReplicaType::kChief:
      return "chief";
    case ReplicaType::kWorker:
      return "worker";
    case ReplicaType::kPS:
      return "ps";
    case ReplicaType::kEvaluator:
      return "evaluator";
  }
  return "";
}

std::optional<ReplicaType> parse_replica_type(std::string_view s) {
  for (ReplicaType t : kAllReplicaTypes) {
    if (s == replica_type_name(t) || s == replica_type_label(t)) return t;
  }
  return std::nullopt;
}

std::optional<std::pair<ReplicaType, int>> TrainingJobSpec::chief() const {
  auto c = replica_specs.find(ReplicaType::kChief);
  if (c != replica_specs.end() && c->second.replicas > 0) return std::pair{ReplicaType::kChief, 0};
  auto w = replica_specs.find(ReplicaType::kWorker);
  if (w != replica_specs.end() && w->second.replicas > 0) {
    return std::pair{ReplicaType::kWorker, 0};
  }
  return std::nullopt;
}

int32_t TrainingJobSpec::total_replicas() const {
  int32_t n = 0;
  for (const auto& [_, r] : replica_specs) n += r.replicas;
  return n;
}

namespace {

// spec.replicaSpecs: one ReplicaSpec per known type, at least one.
std::map<ReplicaType, ReplicaSpec> parse_replica_specs(const json& spec, const std::string& root) {
  std::map<ReplicaType, ReplicaSpec> specs;
  const json* rs = field(spec, "replicaSpecs");
  if (rs == nullptr) fail(root + ".replicaSpecs", "is required");
  expect_object(*rs, root + ".replicaSpecs");
  for (const auto& [key, value] : rs->items()) {
    const std::string path = root + ".replicaSpecs." + key;
    std::optional<ReplicaType> type;
    for (ReplicaType t : kAllReplicaTypes) {
      if (key == replica_type_name(t)) type = t;
    }
    if (!type) fail(path, "unknown replica type: must be one of Chief, Worker, PS, Evaluator");
    specs[*type] = parse_replica(value, path, *type);
  }
  if (specs.empty()) fail(root + ".replicaSpecs", "must name at least one replica type");
  return specs;
}

// spec.logdir: the shared claim every replica mounts.
LogdirSpec parse_logdir(const json& l, const std::string& path) {
  expect_object(l, path);
  LogdirSpec d;
  d.claim_name = get_string(l, "claimName", path, "");
  d.storage_class_name = get_string(l, "storageClassName", path, "");
  if (!d.claim_name.empty() && !d.storage_class_name.empty()) {
    fail(path, "give either claimName or storageClassName, not both");
  }
  d.size = get_string(l, "size", path, d.size);
  if (auto q = parse_quantity(d.size); !q || *q <= 0) {
    fail(path + ".size", "invalid quantity \"" + d.size +
                             "\": must be a positive Kubernetes quantity such as \"10Gi\"");
  }
  if (!d.storage_class_name.empty() && !is_dns1123_subdomain(d.storage_class_name)) {
    fail(path + ".storageClassName",
         "invalid name \"" + d.storage_class_name + "\": must be a DNS-1123 subdomain");
  }
  if (!d.claim_name.empty() && !is_dns1123_subdomain(d.claim_name)) {
    fail(path + ".claimName",
         "invalid name \"" + d.claim_name + "\": must be a DNS-1123 subdomain");
  }
  if (const json* am = field(l, "accessModes")) {
    if (!am->is_array()) fail(path + ".accessModes", "must be an array");
    d.access_modes.clear();
    static const std::set<std::string> kModes = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                                 "ReadWriteOncePod"};
    for (size_t i = 0; i < am->size(); ++i) {
      const std::string p = path + ".accessModes[" + std::to_string(i) + "]";
      if (!(*am)[i].is_string() || !kModes.contains((*am)[i].get<std::string>())) {
        fail(p, "must be one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod");
      }
      d.access_modes.push_back((*am)[i].get<std::string>());
    }
    if (d.access_modes.empty()) d.access_modes = {"ReadWriteMany"};
  }
  d.mount_path = get_string(l, "mountPath", path, d.mount_path);
  if (d.mount_path.empty() || d.mount_path.front() != '/') {
    fail(path + ".mountPath", "must be an absolute path");
  }
  d.reclaim_policy = get_enum(l, "reclaimPolicy", path, ReclaimPolicy::kRetain, kReclaimPolicies);
  return d;
}

// spec.runPolicy: restarts, backoff, deadlines and cleanup.
RunPolicy parse_run_policy(const json& rp, const std::string& path) {
  expect_object(rp, path);
  RunPolicy p;
  p.backoff_limit = static_cast<int32_t>(get_int(rp, "backoffLimit", path, 6, 0, INT32_MAX));
  p.restart_scope = get_enum(rp, "restartScope", path, RestartScope::kReplica, kRestartScopes);
  p.retryable_exit_codes = get_exit_codes(rp, "retryableExitCodes", path);
  p.permanent_exit_codes = get_exit_codes(rp, "permanentExitCodes", path);
  for (int32_t c : p.retryable_exit_codes) {
    if (std::find(p.permanent_exit_codes.begin(), p.permanent_exit_codes.end(), c) !=
        p.permanent_exit_codes.end()) {
      fail(path + ".permanentExitCodes",
           "exit code " + std::to_string(c) + " is also listed in retryableExitCodes");
    }
  }
  if (const json* b = field(rp, "backoff")) {
    const std::string bp = path + ".backoff";
    expect_object(*b, bp);
    p.backoff.initial_seconds =
        static_cast<int32_t>(get_int(*b, "initialSeconds", bp, 10, 0, INT32_MAX));
    p.backoff.max_seconds = static_cast<int32_t>(get_int(*b, "maxSeconds", bp, 300, 0, INT32_MAX));
    if (p.backoff.max_seconds < p.backoff.initial_seconds) {
      fail(bp + ".maxSeconds", "must be >= initialSeconds");
    }
  }
  p.node_lost_timeout_seconds =
      static_cast<int32_t>(get_int(rp, "nodeLostTimeoutSeconds", path, 120, 0, INT32_MAX));
  p.active_deadline_seconds = get_opt_int(rp, "activeDeadlineSeconds", path, 1, INT64_MAX);
  if (auto ttl = get_opt_int(rp, "ttlSecondsAfterFinished", path, 0, INT32_MAX)) {
    p.ttl_seconds_after_finished = static_cast<int32_t>(*ttl);
  }
  p.clean_pod_policy =
      get_enum(rp, "cleanPodPolicy", path, CleanPodPolicy::kRunning, kCleanPodPolicies);
  p.suspend = get_bool(rp, "suspend", path, false);
  return p;
}

}  // namespace

TrainingJobSpec parse_spec(const json& spec) {
  const std::string root = "spec";
  expect_object(spec, root);
  TrainingJobSpec out;
  out.replica_specs = parse_replica_specs(spec, root);
  if (const json* l = field(spec, "logdir")) out.logdir = parse_logdir(*l, root + ".logdir");
  if (const json* rp = field(spec, "runPolicy")) {
    out.run_policy = parse_run_policy(*rp, root + ".runPolicy");
  }
  out.success_policy =
      get_enum(spec, "successPolicy", root, SuccessPolicy::kChiefSucceeds, kSuccessPolicies);
  out.progress_interval_seconds = static_cast<int32_t>(
      get_int(spec, "progressIntervalSeconds", root, kDefaultProgressIntervalSeconds,
              kMinProgressIntervalSeconds, kMaxProgressIntervalSeconds));
  return out;
}

void validate_runnable(const TrainingJobSpec& spec, std::string_view job_name) {
  if (!spec.chief()) {
    fail("spec.replicaSpecs", "needs a Chief or a Worker replica with replicas >= 1");
  }
  for (const auto& [type, r] : spec.replica_specs) {
    const std::string path = "spec.replicaSpecs." + std::string(replica_type_name(type));
    validate_pod_template(r.pod_template, path + ".template", spec.logdir);
    if (r.replicas > 0) {
      const std::string longest = std::string(job_name) + "-" +
                                  std::string(replica_type_label(type)) + "-" +
                                  std::to_string(r.replicas - 1);
      if (!is_dns_label(longest)) {
        fail("metadata.name", "pod name \"" + longest +
                                  "\" is not a DNS label (<= 63 lower-case alphanumerics or "
                                  "'-'): use a shorter job name");
      }
    }
  }
}

json to_json(const TrainingJobSpec& spec) {
  json out = json::object();
  json rs = json::object();
  for (const auto& [type, r] : spec.replica_specs) {
    rs[std::string(replica_type_name(type))] = {
        {"replicas", r.replicas},
        {"restartPolicy", enum_name(r.restart_policy, kRestartPolicies)},
        {"template", r.pod_template}};
  }
  out["replicaSpecs"] = rs;
  json l = {{"accessModes", spec.logdir.access_modes},
            {"mountPath", spec.logdir.mount_path},
            {"reclaimPolicy", enum_name(spec.logdir.reclaim_policy, kReclaimPolicies)},
            {"size", spec.logdir.size}};
  if (!spec.logdir.claim_name.empty()) l["claimName"] = spec.logdir.claim_name;
  if (!spec.logdir.storage_class_name.empty()) {
    l["storageClassName"] = spec.logdir.storage_class_name;
  }
  out["logdir"] = l;
  const RunPolicy& p = spec.run_policy;
  json rp = {
      {"backoffLimit", p.backoff_limit},
      {"restartScope", enum_name(p.restart_scope, kRestartScopes)},
      {"backoff",
       {{"initialSeconds", p.backoff.initial_seconds}, {"maxSeconds", p.backoff.max_seconds}}},
      {"nodeLostTimeoutSeconds", p.node_lost_timeout_seconds},
      {"cleanPodPolicy", enum_name(p.clean_pod_policy, kCleanPodPolicies)},
      {"suspend", p.suspend}};
  if (!p.retryable_exit_codes.empty()) rp["retryableExitCodes"] = p.retryable_exit_codes;
  if (!p.permanent_exit_codes.empty()) rp["permanentExitCodes"] = p.permanent_exit_codes;
  if (p.active_deadline_seconds) rp["activeDeadlineSeconds"] = *p.active_deadline_seconds;
  if (p.ttl_seconds_after_finished) rp["ttlSecondsAfterFinished"] = *p.ttl_seconds_after_finished;
  out["runPolicy"] = rp;
  out["successPolicy"] = enum_name(spec.success_policy, kSuccessPolicies);
  out["progressIntervalSeconds"] = spec.progress_interval_seconds;
  return out;
}

// ---- status ----

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
                          lenient<std::string>(v, "pod", "")};
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
