// Collectives between the replicas of one data-parallel group, and the rendezvous that forms
// the group through the shared logdir.
//
// Rendezvous (rendezvous()): every replica of one attempt meets in
// `<logdir>/.rendezvous/<attempt>/`, a folder named by LONGHAUL_RESTART_ATTEMPT so that all
// replicas agree on it without talking to each other.
//   1. The chief (rank 0) removes the other attempt folders (stale), picks a fresh random
//      generation id G and writes `generation` (atomic rename), then `arrived.G.0`.
//   2. Every other rank writes `present.<rank>` (so a timeout can name who is missing even
//      before the chief came) and polls (base/poll.h: every 10 ms at first, at most every 250 ms;
//      one listing of the folder per look): it reads `generation` and writes
//      `arrived.G.<rank>` (rewriting it if the chief's clean-up removed it). A generation whose
//      arrival file for this rank was written by another process is stale (a previous run with
//      the same attempt id): the rank waits for the chief to write a new one.
//   3. Once `arrived.G.<r>` exists for every rank, the chief writes `members.G` (each rank with
//      the process identity its arrival file holds) and leaves; a non-chief leaves only when
//      `members.G` names it. Arrival files alone are not proof: a non-chief that polls while the
//      chief is clearing a reused folder (one file at a time) can still see the previous run's
//      `generation` and `arrived.G.0`; it would write its own arrival and find the group
//      complete, in a generation its chief had abandoned. A member list that names another
//      process marks G stale, as above.
//   4. The ranks connect a full mesh of Gloo TCP pairs through a gloo::rendezvous::FileStore in
//      the same folder, with keys under the prefix G (so a reused folder never holds a key
//      twice). The connect is bounded by connect_timeout_secs (a peer's address must appear
//      within it, and each peer's connection too), not by the collective
//      timeout: a member that died or froze between step 3 and here fails the connect within
//      seconds. Then the chief opens a new generation in the same folder (keeping its files) and
//      the others treat G as stale and follow, as in steps 1-3; a stop request is honoured
//      between the attempts.
//   After max_wait_secs without all ranks, rendezvous() throws DeadlineExceeded naming the
//   ranks that never arrived ("rank 0 (chief 0)" when the chief never wrote a generation).
//
// Liveness: a member that froze (SIGSTOP, a stalled host) keeps its sockets open, so no
// collective would fail before its timeout. Once connected, every member refreshes
// `alive.G.<rank>` (a counter, every 200 ms) from a heartbeat thread of its communicator and
// watches the other members' files; a member whose file did not change for
// liveness_timeout_secs (measured on the watcher's own clock, so host clocks need not agree) is
// declared lost: the watcher shuts its group's sockets down, and the collective in flight (or
// the next one) throws Aborted naming that rank, as for a peer that died. A call that waits
// for a slow peer on purpose (broadcast with an explicit timeout: the chief restoring, the
// final checkpoint) is also ended by `cancelled` (a stop request): it throws Cancelled and the
// group is unusable afterwards.
//
// Regroup (RendezvousOptions::regroup, data_parallel.h "Recovery in place"): survivors of a lost
// peer meet again in the SAME folder. The surviving chief opens a new generation without
// clearing the folder (so nothing a replacement or a slower survivor already wrote is lost); a
// surviving non-chief's new arrival identity differs from the one its old arrival file holds, so
// it ignores the old generation and waits for the next, exactly like a replacement replica
// (a fresh process that runs the ordinary rendezvous). Rank 0 coordinates the rendezvous whatever
// its role (the chief role may have moved to another rank, data_parallel.h): a replacement rank 0
// clears the folder and opens a generation as at any start, and the survivors follow it.
//
// Failure semantics of every collective: a peer that died (its sockets closed) is noticed at
// once; a peer that hangs or a cut network is noticed after collective_timeout_secs. Either way
// the collective throws Aborted naming the operation and the peers, and the communicator is
// unusable afterwards: the process either exits with the retryable code 138 so the group
// restarts (supervisor.on_peer_loss: exit), or destroys it and regroups (data_parallel.h,
// "Recovery in place").
//
// Thread-safety: NOT thread-safe. A Communicator (its Gloo context, pairs and tag counter) must
// be used by one thread at a time, and every rank must issue the same collectives in the same
// order. DataParallel hands it to its communication thread while gradient buckets are in flight
// and waits for them before any other collective on the training thread (data_parallel.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace longhaul::dist {

// Gloo all-reduce algorithm for the CPU path.
enum class AllreduceAlgorithm { kRing, kHalvingDoubling, kBcube };
// "ring" | "halving-doubling" | "bcube"; throws InvalidArgument listing the names.
AllreduceAlgorithm parse_allreduce_algorithm(std::string_view name);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Element-wise sum over all ranks, in place (host memory).
  virtual void allreduce_sum(std::span<float> data) = 0;
  // Element-wise max over all ranks, in place.
  virtual void allreduce_max(std::span<int64_t> data) = 0;
  // Copies `data` of rank `root` into `data` on every rank (same size on all ranks).
  // `timeout` overrides the collective timeout for this call (e.g. the first broadcast, which
  // waits while the chief restores a large checkpoint); zero means the default. A call with a
  // timeout is a wait: a stop request (RendezvousOptions::cancelled) ends it with Cancelled.
  virtual void broadcast(std::span<std::byte> data, int root,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
  virtual void barrier() = 0;
};

struct RendezvousOptions {
  std::filesystem::path logdir;  // shared by every replica
  std::string attempt = "0";     // folder under <logdir>/.rendezvous
  // Where attempt folders live instead of <logdir>/.rendezvous (--rendezvous-dir); shared.
  std::filesystem::path rendezvous_root;
  int rank = 0;
  int world_size = 1;
  std::string bind_host = "127.0.0.1";   // Gloo TCP binds here (ignored when bind_iface is set)
  std::string bind_iface;                // network interface, e.g. "eth0"
  double max_wait_secs = 7200;           // DeadlineExceeded after this
  double collective_timeout_secs = 300;  // a peer alive but silent is declared lost after this
  double connect_timeout_secs = 2;       // one connect attempt of the mesh (see step 4)
  double liveness_timeout_secs = 10;     // a member whose heartbeat stopped is lost after this
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;
  // Polled while waiting; returning true abandons the rendezvous with Cancelled (a SIGTERM).
  std::function<bool()> cancelled;
  // A survivor meeting again after a lost peer: the chief keeps the folder's files (see above).
  bool regroup = false;
};

// Forms the group (see the top of this file). world_size 1 returns a communicator whose
// collectives are no-ops. For world_size > 1 it sets SIGPIPE to SIG_IGN process-wide, so that
// writing to a dead peer is an error (Aborted) rather than a kill. Throws DeadlineExceeded (peers
// never came, or the mesh could not be connected before max_wait_secs: a member kept dying
// during the connect), Cancelled, InvalidArgument (bad bind address), PermissionDenied (the
// logdir is not writable).
std::unique_ptr<Communicator> rendezvous(const RendezvousOptions& options);

// The folder of one attempt: <logdir>/.rendezvous/<attempt>.
std::filesystem::path rendezvous_dir(const std::filesystem::path& logdir,
                                     const std::string& attempt);

// Removes <logdir>/.rendezvous/<attempt> (the chief calls it after a finished run). Never
// throws; logs a warning on failure.
void remove_rendezvous_dir(const std::filesystem::path& logdir, const std::string& attempt);

// Test-only fault injection: with LONGHAUL_TEST_STOP_AT=<phase> in the environment, the first
// time this process reaches `phase` it says so on stderr ("LONGHAUL_TEST_STOP_AT: stopped at
// <phase>") and stops itself with SIGSTOP, so a test can kill it (SIGKILL) or leave it frozen
// at exactly that point. Phases: "rendezvous" (arrived, the group not yet formed), "connect"
// (a member of the generation, before the mesh connects), "sync" (before the state broadcast
// of a (re)formed group), "regroup" (a survivor, before it meets again), "finish" (before the
// end-of-run meeting with the chief). Never set it in production.
void stop_here_for_test(std::string_view phase);

}  // namespace longhaul::dist
