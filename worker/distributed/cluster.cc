// TF_CONFIG parsing and replica identity. See cluster.h.
#include "longhaul/distributed/cluster.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"

namespace longhaul::dist {
namespace {

using json = nlohmann::json;

std::vector<std::string> address_list(const json& cluster, const char* name) {
  std::vector<std::string> out;
  if (!cluster.contains(name) || cluster[name].is_null()) return out;
  const json& list = cluster[name];
  const std::string field = std::string("cluster.") + name;
  if (!list.is_array()) {
    throw InvalidArgument("TF_CONFIG " + field + " must be a list of \"host:port\" strings, got " +
                          list.dump());
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item_field = field + "[" + std::to_string(i) + "]";
    if (!list[i].is_string()) {
      throw InvalidArgument("TF_CONFIG " + item_field + " must be a \"host:port\" string, got " +
                            list[i].dump());
    }
    std::string address = list[i].get<std::string>();
    address_host(address, "TF_CONFIG " + item_field);  // validates
    out.push_back(std::move(address));
  }
  return out;
}

int parse_int(const std::string& text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < 0 || v > 1'000'000) {
    throw InvalidArgument(what + "='" + text + "' is not a non-negative integer");
  }
  return static_cast<int>(v);
}

std::string env_or(const std::map<std::string, std::string>& env, const std::string& key,
                   const std::string& fallback = "") {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::string_view task_type_name(TaskType type) {
  switch (type) {
    case TaskType::kChief:
      return "chief";
    case TaskType::kWorker:
      return "worker";
    case TaskType::kPs:
      return "ps";
    case TaskType::kEvaluator:
      return "evaluator";
  }
  return "unknown";
}

int ClusterSpec::world_size() const { return static_cast<int>(chief.size() + worker.size()); }

std::optional<int> ClusterSpec::rank() const {
  switch (task_type) {
    case TaskType::kChief:
      return 0;
    case TaskType::kWorker:
      return task_index + (chief.empty() ? 0 : 1);
    default:
      return std::nullopt;
  }
}

const std::string& ClusterSpec::address_of_rank(int r) const {
  if (r < 0 || r >= world_size()) {
    throw InvalidArgument("rank " + std::to_string(r) + " is outside the world of " +
                          std::to_string(world_size()) + " replicas");
  }
  if (!chief.empty()) return r == 0 ? chief[0] : worker[static_cast<size_t>(r - 1)];
  return worker[static_cast<size_t>(r)];
}

std::string ClusterSpec::rank_name(int r) const {
  if (!chief.empty()) return r == 0 ? "chief 0" : "worker " + std::to_string(r - 1);
  return "worker " + std::to_string(r);
}

std::string address_host(std::string_view address, std::string_view field) {
  const auto bad = [&](const char* why) {
    return InvalidArgument(std::string(field) + " '" + std::string(address) + "' " + why +
                           "; expected \"host:port\"");
  };
  if (address.empty()) throw bad("is empty");
  std::string_view host, port;
  if (address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      throw bad("is not a bracketed IPv6 address with a port");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) throw bad("has no port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (host.empty()) throw bad("has no host");
  if (port.empty() || port.find_first_not_of("0123456789") != std::string_view::npos ||
      port.size() > 5 || std::stoi(std::string(port)) > 65535) {
    throw bad("has no valid port");
  }
  return std::string(host);
}

namespace {

// TF_CONFIG's cluster: the addresses of each task type (master is read as chief).
void read_cluster(const json& doc, ClusterSpec& spec) {
  if (!doc.contains("cluster") || !doc["cluster"].is_object()) {
    throw InvalidArgument(
        "TF_CONFIG cluster is missing or not an object; expected {\"cluster\": {\"chief\": "
        "[...], \"worker\": [...]}, \"task\": {\"type\": ..., \"index\": ...}}");
  }
  const json& cluster = doc["cluster"];
  for (const auto& [key, value] : cluster.items()) {
    if (key != "chief" && key != "master" && key != "worker" && key != "ps" && key != "evaluator") {
      throw InvalidArgument("TF_CONFIG cluster." + key +
                            " is not a known task type (chief, worker, ps, evaluator)");
    }
  }
  spec.chief = address_list(cluster, "chief");
  auto master = address_list(cluster, "master");
  if (!master.empty()) {
    if (!spec.chief.empty()) {
      throw InvalidArgument("TF_CONFIG has both cluster.chief and cluster.master; keep one");
    }
    spec.chief = std::move(master);
  }
  spec.worker = address_list(cluster, "worker");
  spec.ps = address_list(cluster, "ps");
  spec.evaluator = address_list(cluster, "evaluator");
  if (spec.chief.size() > 1) {
    throw InvalidArgument("TF_CONFIG cluster.chief has " + std::to_string(spec.chief.size()) +
                          " addresses; a cluster has at most one chief");
  }
  if (spec.evaluator.size() > 1) {
    throw InvalidArgument("TF_CONFIG cluster.evaluator has " +
                          std::to_string(spec.evaluator.size()) +
                          " addresses; a cluster has at most one evaluator");
  }
  if (spec.world_size() == 0) {
    throw InvalidArgument("TF_CONFIG cluster has neither chief nor worker addresses");
  }
}

// TF_CONFIG's task: which of the cluster's addresses this process is.
void read_task(const json& doc, ClusterSpec& spec) {
  if (!doc.contains("task") || !doc["task"].is_object()) {
    throw InvalidArgument(
        "TF_CONFIG task is missing or not an object; expected \"task\": {\"type\": \"worker\", "
        "\"index\": 0}");
  }
  const json& task = doc["task"];
  if (!task.contains("type") || !task["type"].is_string()) {
    throw InvalidArgument("TF_CONFIG task.type is missing or not a string");
  }
  const std::string type = task["type"].get<std::string>();
  std::vector<std::string>* list = nullptr;
  std::string list_name = type;
  if (type == "chief" || type == "master") {
    spec.task_type = TaskType::kChief;
    list = &spec.chief;
    list_name = "chief";
  } else if (type == "worker") {
    spec.task_type = TaskType::kWorker;
    list = &spec.worker;
  } else if (type == "ps") {
    spec.task_type = TaskType::kPs;
    list = &spec.ps;
  } else if (type == "evaluator") {
    spec.task_type = TaskType::kEvaluator;
    list = &spec.evaluator;
  } else {
    throw InvalidArgument("TF_CONFIG task.type '" + type +
                          "' is not one of chief, worker, ps, evaluator");
  }
  if (!task.contains("index")) {
    spec.task_index = 0;
  } else if (task["index"].is_number_integer()) {
    spec.task_index = task["index"].get<int>();
  } else if (task["index"].is_string()) {
    spec.task_index = parse_int(task["index"].get<std::string>(), "TF_CONFIG task.index");
  } else {
    throw InvalidArgument("TF_CONFIG task.index must be an integer, got " + task["index"].dump());
  }
  if (spec.task_index < 0 || static_cast<size_t>(spec.task_index) >= list->size()) {
    throw InvalidArgument("TF_CONFIG task.index " + std::to_string(spec.task_index) +
                          " is outside cluster." + list_name + ", which has " +
                          std::to_string(list->size()) + " address(es)");
  }
}

}  // namespace

ClusterSpec parse_tf_config(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InvalidArgument(std::string("TF_CONFIG is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) throw InvalidArgument("TF_CONFIG must be a JSON object, got " + doc.dump());
  ClusterSpec spec;
  read_cluster(doc, spec);
  read_task(doc, spec);
  return spec;
}

std::map<std::string, std::string> replica_environment() {
  std::map<std::string, std::string> env;
  for (const char* name :
       {"TF_CONFIG", "LONGHAUL_RANK", "LONGHAUL_WORLD_SIZE", "LONGHAUL_HOST_OVERRIDE",
        "LONGHAUL_TASK_ADDRESSES", "LONGHAUL_GLOO_IFACE", "LONGHAUL_RESTART_ATTEMPT"}) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return env;
}

ReplicaIdentity resolve_replica(const std::map<std::string, std::string>& env,
                                const ExplicitReplica& flags) {
  ReplicaIdentity id;
  id.attempt = env_or(env, "LONGHAUL_RESTART_ATTEMPT", "0");
  if (id.attempt.find_first_of("/\\") != std::string::npos || id.attempt == "." ||
      id.attempt == "..") {
    throw InvalidArgument("LONGHAUL_RESTART_ATTEMPT='" + id.attempt +
                          "' must be a plain name (it names a folder under <logdir>/.rendezvous)");
  }
  id.bind_iface = env_or(env, "LONGHAUL_GLOO_IFACE");
  const std::string override_host = env_or(env, "LONGHAUL_HOST_OVERRIDE");
  const std::string tf_config = env_or(env, "TF_CONFIG");
  std::vector<std::string> task_hosts;
  if (std::string list = env_or(env, "LONGHAUL_TASK_ADDRESSES"); !list.empty()) {
    task_hosts = split_commas(list);
  }

  if (!tf_config.empty()) {
    id.cluster = parse_tf_config(tf_config);
    id.from_tf_config = true;
    id.rank = id.cluster.rank();
    id.world_size = id.cluster.world_size();
    if (flags.rank >= 0 && id.rank && flags.rank != *id.rank) {
      throw InvalidArgument("--rank " + std::to_string(flags.rank) + " contradicts TF_CONFIG (" +
                            std::string(task_type_name(id.cluster.task_type)) + " " +
                            std::to_string(id.cluster.task_index) + " is rank " +
                            std::to_string(*id.rank) + "); drop the flag or TF_CONFIG");
    }
    if (flags.world_size >= 0 && flags.world_size != id.world_size) {
      throw InvalidArgument(
          "--world-size " + std::to_string(flags.world_size) +
          " contradicts TF_CONFIG (chief + workers = " + std::to_string(id.world_size) + ")");
    }
  } else {
    int rank = flags.rank;
    int world = flags.world_size;
    if (rank < 0) rank = parse_int(env_or(env, "LONGHAUL_RANK", "0"), "LONGHAUL_RANK");
    if (world < 0) {
      world = parse_int(env_or(env, "LONGHAUL_WORLD_SIZE", "1"), "LONGHAUL_WORLD_SIZE");
    }
    if (world < 1) throw InvalidArgument("--world-size / LONGHAUL_WORLD_SIZE must be >= 1");
    if (rank >= world) {
      throw InvalidArgument("--rank / LONGHAUL_RANK " + std::to_string(rank) +
                            " is outside the world size " + std::to_string(world) +
                            " (ranks are 0 .. world_size-1)");
    }
    id.rank = rank;
    id.world_size = world;
    const std::string host = override_host.empty() ? "127.0.0.1" : override_host;
    id.cluster.chief = {host + ":0"};
    for (int r = 1; r < world; ++r) id.cluster.worker.push_back(host + ":0");
    id.cluster.task_type = rank == 0 ? TaskType::kChief : TaskType::kWorker;
    id.cluster.task_index = rank == 0 ? 0 : rank - 1;
  }

  if (!task_hosts.empty() && task_hosts.size() != static_cast<size_t>(id.world_size)) {
    throw InvalidArgument("LONGHAUL_TASK_ADDRESSES has " + std::to_string(task_hosts.size()) +
                          " hosts but the world has " + std::to_string(id.world_size) +
                          " replicas (list them in rank order: chief, then workers)");
  }
  if (id.rank) {
    if (!task_hosts.empty()) {
      id.bind_host = task_hosts[static_cast<size_t>(*id.rank)];
    } else if (!override_host.empty()) {
      id.bind_host = override_host;
    } else {
      id.bind_host =
          address_host(id.cluster.address_of_rank(*id.rank),
                       id.from_tf_config ? "TF_CONFIG address of this task" : "replica address");
    }
  }
  return id;
}

}  // namespace longhaul::dist
