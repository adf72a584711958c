// The TrainingJob spec: parse_spec (with the CRD's defaults and field-path errors),
// validate_runnable and to_json (see trainingjob.h). The status is in trainingjob.cc.
#include <algorithm>
#include <set>
#include <tuple>

#include "longhaul/api/trainingjob.h"
#include "longhaul/api/validation.h"
#include "longhaul/base/error.h"
#include "longhaul/base/field.h"

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
    validate_grace_period(r.pod_template, path + ".template");
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

}  // namespace longhaul::api
