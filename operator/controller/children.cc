// Builders for the objects a TrainingJob owns (see children.h).
#include "longhaul/controller/children.h"

#include <set>

namespace longhaul::controller {
namespace {

std::string job_name(const json& job) { return job.at("metadata").at("name").get<std::string>(); }
std::string job_namespace(const json& job) {
  return job.at("metadata").value("namespace", std::string("default"));
}

void set_env(json& container, const std::string& name, const std::string& value) {
  json& env = container["env"];
  if (!env.is_array()) env = json::array();
  for (json& e : env) {
    if (e.value("name", "") == name) {
      e = {{"name", name}, {"value", value}};
      return;
    }
  }
  env.push_back({{"name", name}, {"value", value}});
}

void add_mount(json& container, const std::string& mount_path) {
  json& mounts = container["volumeMounts"];
  if (!mounts.is_array()) mounts = json::array();
  for (const json& m : mounts) {
    if (m.value("mountPath", "") == mount_path) return;  // the user mounted something there
  }
  mounts.push_back({{"name", kLogdirVolume}, {"mountPath", mount_path}});
}

json job_labels(const std::string& job) { return {{api::kLabelJobName, job}}; }

}  // namespace

std::string pod_name(std::string_view job, api::ReplicaType type, int index) {
  return std::string(job) + "-" + std::string(api::replica_type_label(type)) + "-" +
         std::to_string(index);
}

std::string service_name(std::string_view job) { return std::string(job); }

std::string claim_name(std::string_view job, const api::TrainingJobSpec& spec) {
  if (!spec.logdir.claim_name.empty()) return spec.logdir.claim_name;
  return std::string(job) + "-logdir";
}

int replica_port(const api::ReplicaSpec& replica) {
  const json& spec =
      replica.pod_template.contains("spec") ? replica.pod_template["spec"] : json::object();
  const json containers = spec.value("containers", json::array());
  if (!containers.is_array()) return kDefaultPort;
  for (const json& c : containers) {
    if (!c.is_object()) continue;
    for (const json& p : c.value("ports", json::array())) {
      if (p.is_object() && p.value("name", "") == kPortName && p.contains("containerPort") &&
          p["containerPort"].is_number_integer()) {
        return p["containerPort"].get<int>();
      }
    }
  }
  if (!containers.empty() && containers[0].is_object()) {
    const json ports = containers[0].value("ports", json::array());
    if (ports.is_array() && !ports.empty() && ports[0].is_object() &&
        ports[0].contains("containerPort") && ports[0]["containerPort"].is_number_integer()) {
      return ports[0]["containerPort"].get<int>();
    }
  }
  return kDefaultPort;
}

std::string pod_host(std::string_view job, std::string_view ns, api::ReplicaType type, int index) {
  return pod_name(job, type, index) + "." + service_name(job) + "." + std::string(ns) + ".svc";
}

json tf_config(std::string_view job, std::string_view ns, const api::TrainingJobSpec& spec,
               api::ReplicaType type, int index) {
  json cluster = json::object();
  for (const auto& [t, r] : spec.replica_specs) {
    if (r.replicas <= 0) continue;
    json hosts = json::array();
    const int port = replica_port(r);
    for (int i = 0; i < r.replicas; ++i) {
      hosts.push_back(pod_host(job, ns, t, i) + ":" + std::to_string(port));
    }
    cluster[std::string(api::replica_type_label(t))] = std::move(hosts);
  }
  return {{"cluster", cluster},
          {"task", {{"type", std::string(api::replica_type_label(type))}, {"index", index}}},
          {"environment", "cloud"}};
}

json owner_reference(const json& job) {
  return {{"apiVersion", std::string(api::kApiVersion)},
          {"kind", std::string(api::kKind)},
          {"name", job_name(job)},
          {"uid", job.at("metadata").value("uid", std::string())},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

namespace {

// The pod's metadata: the template's labels and annotations (never its name, namespace or other
// identity), the job's labels, the restart-attempt annotation and the controller reference.
json pod_metadata(const json& job, const api::ReplicaSpec& replica, api::ReplicaType type,
                  int index, const std::string& name, bool is_chief, int64_t restart_attempt) {
  const std::string job_n = job_name(job);
  const std::string ns = job_namespace(job);
  json metadata = replica.pod_template.value("metadata", json::object());
  if (!metadata.is_object()) metadata = json::object();
  // A template's name/namespace/uid/etc. never carry over to the pod.
  for (const char* k : {"name", "generateName", "namespace", "uid", "resourceVersion",
                        "ownerReferences", "creationTimestamp", "deletionTimestamp"}) {
    metadata.erase(k);
  }
  metadata["name"] = name;
  metadata["namespace"] = ns;
  json& labels = metadata["labels"];
  if (!labels.is_object()) labels = json::object();
  labels[api::kLabelJobName] = job_n;
  labels[api::kLabelReplicaType] = std::string(api::replica_type_label(type));
  labels[api::kLabelReplicaIndex] = std::to_string(index);
  if (is_chief) labels[api::kLabelRole] = std::string(api::kRoleChief);
  json& annotations = metadata["annotations"];
  if (!annotations.is_object()) annotations = json::object();
  annotations[api::kAnnotationRestartAttempt] = std::to_string(restart_attempt);
  metadata["ownerReferences"] = json::array({owner_reference(job)});
  return metadata;
}

// Every container's and init container's environment for its place in the group (TF_CONFIG and
// the LONGHAUL_* variables) and the logdir mount.
void set_replica_env(json& pod_spec, const json& job, const api::TrainingJobSpec& spec,
                     api::ReplicaType type, int index, int64_t restart_attempt_env) {
  const std::string job_n = job_name(job);
  const std::string ns = job_namespace(job);
  const auto chief = spec.chief();
  // Ranks: chief first, then the workers in index order.
  int chiefs = 0, workers = 0;
  if (auto it = spec.replica_specs.find(api::ReplicaType::kChief); it != spec.replica_specs.end()) {
    chiefs = it->second.replicas;
  }
  if (auto it = spec.replica_specs.find(api::ReplicaType::kWorker);
      it != spec.replica_specs.end()) {
    workers = it->second.replicas;
  }
  int rank = -1;
  if (type == api::ReplicaType::kChief) rank = index;
  if (type == api::ReplicaType::kWorker) rank = chiefs + index;
  std::string chief_address;
  if (chief) {
    chief_address = pod_host(job_n, ns, chief->first, chief->second) + ":" +
                    std::to_string(replica_port(spec.replica_specs.at(chief->first)));
  }
  const std::string tf = tf_config(job_n, ns, spec, type, index).dump();

  for (const char* kind : {"initContainers", "containers"}) {
    if (!pod_spec.contains(kind) || !pod_spec[kind].is_array()) continue;
    for (json& c : pod_spec[kind]) {
      if (!c.is_object()) continue;
      set_env(c, "TF_CONFIG", tf);
      set_env(c, "LONGHAUL_JOB_NAME", job_n);
      set_env(c, "LONGHAUL_REPLICA_TYPE", std::string(api::replica_type_label(type)));
      set_env(c, "LONGHAUL_REPLICA_INDEX", std::to_string(index));
      set_env(c, "LONGHAUL_RANK", std::to_string(rank));
      set_env(c, "LONGHAUL_WORLD_SIZE", std::to_string(chiefs + workers));
      set_env(c, "LONGHAUL_CHIEF_ADDRESS", chief_address);
      set_env(c, "LONGHAUL_RESTART_ATTEMPT", std::to_string(restart_attempt_env));
      set_env(c, "LONGHAUL_LOGDIR", spec.logdir.mount_path);
      add_mount(c, spec.logdir.mount_path);
    }
  }
}

}  // namespace

json build_pod(const json& job, const api::TrainingJobSpec& spec, api::ReplicaType type, int index,
               int64_t restart_attempt, std::optional<int64_t> rendezvous_attempt) {
  const std::string job_n = job_name(job);
  const api::ReplicaSpec& replica = spec.replica_specs.at(type);
  const std::string name = pod_name(job_n, type, index);
  const auto chief = spec.chief();
  const bool is_chief = chief && chief->first == type && chief->second == index;
  json metadata = pod_metadata(job, replica, type, index, name, is_chief, restart_attempt);

  json pod_spec = replica.pod_template.value("spec", json::object());
  pod_spec["hostname"] = name;
  pod_spec["subdomain"] = service_name(job_n);
  pod_spec["restartPolicy"] =
      replica.restart_policy == api::RestartPolicy::kOnFailure ? "OnFailure" : "Never";
  json& volumes = pod_spec["volumes"];
  if (!volumes.is_array()) volumes = json::array();
  bool has_volume = false;
  for (const json& v : volumes) has_volume |= v.value("name", "") == kLogdirVolume;
  if (!has_volume) {
    volumes.push_back({{"name", kLogdirVolume},
                       {"persistentVolumeClaim", {{"claimName", claim_name(job_n, spec)}}}});
  }

  set_replica_env(pod_spec, job, spec, type, index, rendezvous_attempt.value_or(restart_attempt));
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", metadata}, {"spec", pod_spec}};
}

json build_service(const json& job, const api::TrainingJobSpec& spec) {
  const std::string job_n = job_name(job);
  json ports = json::array();
  std::set<int> seen;
  for (const auto& [_, r] : spec.replica_specs) {
    const int port = replica_port(r);
    if (!seen.insert(port).second) continue;
    const std::string name = ports.empty() ? std::string(kPortName)
                                           : std::string(kPortName) + "-" + std::to_string(port);
    ports.push_back({{"name", name}, {"port", port}, {"targetPort", port}, {"protocol", "TCP"}});
  }
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", service_name(job_n)},
            {"namespace", job_namespace(job)},
            {"labels", job_labels(job_n)},
            {"ownerReferences", json::array({owner_reference(job)})}}},
          {"spec",
           {{"clusterIP", "None"},
            {"publishNotReadyAddresses", true},
            {"selector", job_labels(job_n)},
            {"ports", ports}}}};
}

json build_claim(const json& job, const api::TrainingJobSpec& spec) {
  const std::string job_n = job_name(job);
  json metadata = {{"name", claim_name(job_n, spec)},
                   {"namespace", job_namespace(job)},
                   {"labels", job_labels(job_n)}};
  if (spec.logdir.reclaim_policy == api::ReclaimPolicy::kDelete) {
    metadata["ownerReferences"] = json::array({owner_reference(job)});
  }
  json claim_spec = {{"accessModes", spec.logdir.access_modes},
                     {"resources", {{"requests", {{"storage", spec.logdir.size}}}}}};
  if (!spec.logdir.storage_class_name.empty()) {
    claim_spec["storageClassName"] = spec.logdir.storage_class_name;
  }
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata", metadata},
          {"spec", claim_spec}};
}

}  // namespace longhaul::controller
