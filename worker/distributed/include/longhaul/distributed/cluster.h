// The cluster a data-parallel replica belongs to: who is rank 0, how many replicas train, which
// address this replica binds its collectives to, and which rendezvous attempt it joins.
//
// Sources, in order:
//   1. TF_CONFIG (Kubeflow / TensorFlow format, set by the operator on every pod):
//        {"cluster": {"chief": ["job-chief-0.job.ns.svc:2222"],
//                     "worker": ["job-worker-0.job.ns.svc:2222", "job-worker-1.job.ns.svc:2222"],
//                     "ps": [...], "evaluator": [...]},
//         "task": {"type": "worker", "index": 1}}
//      Rank 0 is the chief task (type "chief", or the legacy "master"), or worker 0 when the
//      cluster has no chief; worker i is rank i + (1 if there is a chief). The world is the
//      chief plus the workers: "ps" tasks are ignored (all-reduce needs no parameter server) and
//      an "evaluator" task is outside the world (it follows the logdir, see evaluator.h).
//   2. Without TF_CONFIG: explicit values (--rank / --world-size flags or LONGHAUL_RANK /
//      LONGHAUL_WORLD_SIZE), every replica on LONGHAUL_HOST_OVERRIDE or 127.0.0.1.
//
// Environment understood here (all optional):
//   LONGHAUL_HOST_OVERRIDE=127.0.0.1   replaces the host of every TF_CONFIG address. Use it when
//        the TF_CONFIG host names (<pod>.<service>.<namespace>.svc) do not resolve, e.g. when a
//        local kubelet runs the pods as processes on one machine. Gloo binds this replica's
//        TCP transport to the (overridden) host of its own address.
//   LONGHAUL_TASK_ADDRESSES=h0,h1,...  per-rank hosts (rank order: chief, then workers) that
//        replace the TF_CONFIG hosts one by one; wins over LONGHAUL_HOST_OVERRIDE.
//   LONGHAUL_GLOO_IFACE=eth0           bind Gloo to this network interface instead of a host.
//   LONGHAUL_RESTART_ATTEMPT=<id>      the rendezvous attempt (the operator sets it on every pod
//        of a group restart; `longhaul-worker launch` sets it on its children). Every replica
//        of one attempt must see the same value; default "0".
// Only the host part of an address is used: Gloo listens on an ephemeral port of that host and
// publishes it through the rendezvous store, so the TF_CONFIG port (2222) need not be free.
//
// Thread-safety: plain values; the functions are reentrant (they read the environment).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::dist {

enum class TaskType { kChief, kWorker, kPs, kEvaluator };

std::string_view task_type_name(TaskType type);  // "chief", "worker", "ps", "evaluator"

struct ClusterSpec {
  std::vector<std::string> chief;      // "host:port", at most one
  std::vector<std::string> worker;     // "host:port"
  std::vector<std::string> ps;         // ignored for all-reduce
  std::vector<std::string> evaluator;  // at most one; not in the world
  TaskType task_type = TaskType::kWorker;
  int task_index = 0;

  // chief.size() + worker.size().
  int world_size() const;
  // This task's rank, or nullopt for ps and evaluator tasks.
  std::optional<int> rank() const;
  bool is_chief() const { return rank() == 0; }
  // The "host:port" of a rank (0 <= rank < world_size()).
  const std::string& address_of_rank(int rank) const;
  // "chief 0" / "worker 1" for a rank, for messages.
  std::string rank_name(int rank) const;
};

// Parses TF_CONFIG text. Throws InvalidArgument naming the TF_CONFIG field that is wrong
// (e.g. "TF_CONFIG task.index 3 is outside cluster.worker, which has 2 addresses").
ClusterSpec parse_tf_config(std::string_view json);

// Host of "host:port" (brackets of "[::1]:2222" removed). Throws InvalidArgument naming `field`
// when the address has no port.
std::string address_host(std::string_view address, std::string_view field);

// Explicit values for runs without TF_CONFIG; negative means "not given".
struct ExplicitReplica {
  int rank = -1;
  int world_size = -1;
};

// What one replica needs to join a group.
struct ReplicaIdentity {
  ClusterSpec cluster;
  std::optional<int> rank;  // nullopt: ps or evaluator
  int world_size = 1;
  std::string bind_host;      // where Gloo TCP binds (after overrides)
  std::string bind_iface;     // LONGHAUL_GLOO_IFACE, or empty
  std::string attempt = "0";  // LONGHAUL_RESTART_ATTEMPT
  bool from_tf_config = false;
};

// Resolves this replica from `env` (a copy of the variables named above plus TF_CONFIG,
// LONGHAUL_RANK and LONGHAUL_WORLD_SIZE) and the explicit flags (which win over LONGHAUL_RANK /
// LONGHAUL_WORLD_SIZE but may not contradict TF_CONFIG). Throws InvalidArgument naming the
// variable or flag.
ReplicaIdentity resolve_replica(const std::map<std::string, std::string>& env,
                                const ExplicitReplica& flags = {});

// The variables resolve_replica reads, taken from the process environment.
std::map<std::string, std::string> replica_environment();

}  // namespace longhaul::dist
