// DataParallel: what a training loop does to train one model on N replicas.
//
//   auto comm = dist::rendezvous(options);            // the group (communicator.h)
//   dist::DataParallel dp(std::move(comm));
//   sv.managed_session(state, [&](Supervisor& sv) {
//     dp.broadcast_state(state);                      // every rank == the chief, bit for bit
//     while (!dp.any_stop(sv.should_stop()) && step < max_steps) {
//       for (micro-batches) {                         // this rank's shard of the batch
//         if (last micro-batch) dp.start_gradient_averaging(model);
//         model.forward_backward(...);                // buckets all-reduced while this runs
//       }
//       dp.average_gradients(model);                  // mean over ranks, in place
//       model.optimizer_step(...);                    // identical on every rank
//     }
//   });
//
// broadcast_state: rank 0 snapshots its TrainingState (parameters, optimizer moments, step,
// data position and every other metadata entry a checkpoint holds) and every other rank
// restores it from memory, so all ranks continue bit-identically whatever each found in the
// logdir. The tensors travel packed into chunks of up to 64 MiB (one collective per chunk, not
// one per tensor; a larger tensor travels alone). Rank 0 first sends its tensor list; when a rank's
// model has another shape, every rank throws InvalidArgument (the odd rank names the first
// differing tensor, the others name the odd rank): a config mismatch between replicas, which no
// restart fixes.
//
// Gradient averaging: the sum over ranks of the model's flat gradient buffer, then a scale by
// 1/world_size.
//   - CPU models with overlap on (the default): start_gradient_averaging(model), called right
//     before the forward_backward of a step's LAST micro-batch, sets the model's gradient-ready
//     callback (language_model.h). As the backward pass finishes ln_f, block L-1, ..., block 0,
//     wte+wpe, adjacent ready ranges are packed into buckets of up to bucket_bytes, and each
//     full bucket is handed to one communication thread that all-reduces (Gloo) and scales the
//     buckets in place, in issue order, while the backward pass continues. average_gradients
//     then issues the last partial bucket, waits for every bucket, removes the callback and
//     rethrows a communication failure (Aborted) on the training thread. Earlier micro-batches
//     are not reduced (no callback is set while they run). Bucket boundaries depend only on
//     the layout (identical on every rank), the order of the ranges (fixed by the model's code)
//     and bucket_bytes, so every rank issues the same buckets in the same order; the first
//     gradient collective checks that every rank has the same overlap setting, bucket size and
//     gradient count (else InvalidArgument on every rank: exit 2, a configuration error). A model
//     that reports an overlapping range or leaves part of the buffer unreported is a bug
//     (Internal). A model that does not report per layer is reduced in one call by
//     average_gradients.
//   - CPU models with overlap off, or average_gradients without start_gradient_averaging: one
//     all-reduce of the whole buffer after the backward pass, on the training thread.
//   - CUDA models: NCCL (ncclAvg) over the whole buffer after the backward pass when the build
//     has it (nccl.h), otherwise FailedPrecondition; start_gradient_averaging does nothing.
//
// any_stop: an all-reduce (max) of one flag per rank per step (world_size integers). Without
// regroup, a stop requested on any rank (SIGTERM on one pod) ends every rank at the same step;
// the chief then commits the final checkpoint. stop_requested_by_peer() tells a rank that
// stopped only because another did (it exits 138 so the group restarts, instead of 0 which would
// read as "finished"). With regroup (set_regroup), a stop on SOME ranks is a notice that they
// leave (a preempted pod's SIGTERM): they return true and stop, and every other rank gets
// PeerLost at once, naming them, and regroups without waiting for any timeout. A stop on every
// rank stops all, as without regroup.
//
// Recovery in place (regroup): when a collective throws (Aborted: a peer died, hung past the
// collective timeout, or left), the training loop abandons the step in flight (Trainer keeps
// the state of the last step it completed) and calls regroup(state):
//   1. the communication thread is joined and the communicator destroyed, which closes every
//      socket of this replica, so a peer still blocked in a collective with us fails at once
//      instead of after the collective timeout;
//   2. a new rendezvous in the same folder (RendezvousOptions::regroup): the survivors and a
//      replacement of the lost rank (a fresh process with the same rank and attempt) form a new
//      generation; waiting is bounded by the regroup timeout;
//   3. agree_state_source: one all-reduce (max) of world_size integers, each rank's last
//      completed step (-1 for a fresh replica). The state source is the lowest rank with the
//      highest step. Every step's collectives (gradients, then the loss mean) complete on all
//      ranks before anyone applies the update, and no rank can start step s+2's collectives
//      before every rank finished step s+1's, so the survivors' steps differ by at most one and
//      a rank at the higher step holds exactly what an uninterrupted run holds there. The
//      others catch up from it: no step is lost or redone, and no step costs anything extra
//      (the only per-step price is the world_size-integer stop agreement, and the Trainer's
//      copy of the data position at the step's start);
//   4. broadcast_state from that rank (parameters, moments, step, data position) to everyone.
// The same agreement settles the chief role (StateSource::chief, "Chief promotion" in
// worker/distributed/README.md): the role is separate from the rank, which stays the replica's
// TF_CONFIG index and data shard for life. Each survivor says whether it holds the role; a
// surviving chief keeps it, and when the chief is the one lost the lowest surviving rank takes
// it (its caller then promotes its Supervisor); the replacement joins as a worker.
// It returns false when the group could not be formed within the regroup timeout (the caller
// then commits a final checkpoint on the chief and exits 138), throws Cancelled when a stop was
// requested while waiting, and Aborted when a peer is lost again during the regroup itself (the
// caller simply regroups again).
//
// Errors: every collective throws Aborted when a peer is lost (see communicator.h); after that
// the group is unusable. The communication thread is started by the first overlapped step and
// stopped and joined by the destructor, and at once when an overlapped all-reduce fails.
// Thread-safety: one training thread calls every method. The communicator is used by one thread
// at a time (Gloo contexts are not thread-safe): while buckets are in flight only the
// communication thread uses it, and every other collective (broadcast_state, any_stop,
// mean_over_ranks, the non-overlapped path) first waits for the buckets already issued.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "longhaul/base/error.h"
#include "longhaul/base/mutex.h"
#include "longhaul/distributed/communicator.h"
#include "longhaul/model/language_model.h"
#include "longhaul/supervisor/training_state.h"

namespace longhaul::dist {

// A collective failed because a peer is gone (died, hung, or announced that it leaves). The
// group is unusable; with regroup the survivors form a new one (see above).
class PeerLost : public Aborted {
 public:
  using Aborted::Aborted;
};

// Which replica's state the group continues from after a (re)formation: see
// agree_state_source.
struct StateSource {
  int root = 0;            // the rank whose state every rank takes
  int64_t step = -1;       // its last completed step; -1: no replica holds state (a fresh start)
  bool survivors = false;  // some replica kept its state (a regroup, not a fresh group)
  // The rank that holds the chief role from here on (checkpoints, events, training.done): the
  // surviving chief; when the chief was lost, the lowest surviving rank; rank 0 at a fresh
  // start. A replacement (a fresh process) never becomes chief while a survivor exists.
  int chief = 0;
};

// All-reduce over device memory (NCCL); see nccl.h.
class DeviceAllreduce {
 public:
  virtual ~DeviceAllreduce() = default;
  // Mean over ranks, in place, of `count` floats at `device_ptr`; Aborted on failure/timeout.
  virtual void allreduce_mean(float* device_ptr, size_t count) = 0;
};

struct DataParallelOptions {
  // CPU models: all-reduce gradient buckets on a communication thread while the backward pass
  // of the last micro-batch runs. Off: one all-reduce of the whole buffer after it.
  bool overlap_allreduce = true;
  // Upper bound of a bucket (it closes at the first range boundary at or past it; a single
  // range larger than this is one bucket). 0: automatic, min(kDefaultBucketBytes, a quarter of
  // the gradient buffer), so that a small model still gets a few buckets to overlap.
  size_t bucket_bytes = 0;
  // Bounds each NCCL collective of a CUDA model.
  std::chrono::milliseconds device_timeout = std::chrono::seconds(300);
  // Makes a device model's all-reduce over `group` (the Gloo group formed through the logdir):
  // at the first gradient collective and again after every regroup, because a device
  // communicator is bound to the members of the group it was made for. Empty (production): NCCL,
  // bootstrapped over the group (make_nccl_allreduce) and checked once (verify_device_allreduce),
  // when the build has it; FailedPrecondition otherwise. Tests inject an all-reduce that fails on
  // demand, so the regroup path of device models runs without a GPU. Everything else about a
  // lost peer (the stop agreement, the commit rule, the state broadcast, the chief role) is the
  // Gloo path's, shared by CPU and device models.
  std::function<std::unique_ptr<DeviceAllreduce>(Communicator& group)> make_device_allreduce;

  static constexpr size_t kDefaultBucketBytes = size_t{25} << 20;  // PyTorch DDP's bucket_cap_mb
};

class DataParallel {
 public:
  // `device` may be null: a device model then gets one from options.make_device_allreduce at its
  // first step (see there).
  explicit DataParallel(std::unique_ptr<Communicator> comm, DataParallelOptions options = {},
                        std::unique_ptr<DeviceAllreduce> device = nullptr);
  // Stops and joins the communication thread (waiting for a bucket in flight, which the
  // collective timeout bounds). Never touches the model.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // The rank holding the chief role, as of the last agree_state_source (rank 0 before it).
  int chief_rank() const { return chief_; }
  bool is_chief() const { return chief_ == rank_; }
  Communicator& communicator() { return group(); }

  // See above. `timeout` bounds the wait for rank 0 (it may still be restoring a large
  // checkpoint when the others arrive); zero: the collective timeout.
  // `root` is the rank whose state every rank takes (0 at a fresh start; after a regroup, the
  // StateSource's root).
  void broadcast_state(supervisor::TrainingState& state,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(0),
                       int root = 0);
  // Every rank gives its last completed step, or nullopt when it holds no state yet (a fresh
  // process); all get the same answer (see above), and chief_rank() is the agreed chief from
  // then on. One all-reduce of 2 * world_size + 2 integers (steps, chief claims, and the
  // recovery policy: set_regroup or not; InvalidArgument on every rank when the replicas
  // disagree).
  StateSource agree_state_source(std::optional<int64_t> completed_step);

  // Enables recovery in place: `options` re-forms the group (its regroup flag and max_wait_secs
  // are set from here; max_wait_secs = timeout_secs) and any_stop treats a stop on some ranks
  // as their leaving.
  void set_regroup(RendezvousOptions options, double timeout_secs);
  bool regroup_enabled() const { return regroup_enabled_; }
  // See "Recovery in place" above. `state` must hold this replica's last completed step.
  bool regroup(supervisor::TrainingState& state);
  // Successful regroups so far (tests, logs).
  int64_t regroups() const { return regroups_; }
  // Device all-reduces made so far (tests: one per group a device model trained in).
  int64_t device_allreduces_made() const { return device_allreduces_made_; }
  // Call right before the forward_backward of a step's last micro-batch (see above); the model
  // must stay alive until average_gradients. Does nothing for one replica, a CUDA model, a model
  // that does not report per layer, or with overlap off.
  void start_gradient_averaging(model::LanguageModel& model);
  // After the last backward pass: the model's gradients are the mean over ranks on return.
  // Throws Aborted when a peer is lost (the communication thread is joined first), Internal
  // when the model's ready ranges broke the gradient-ready contract.
  void average_gradients(model::LanguageModel& model);
  bool any_stop(bool local_stop);
  // The end of a finished run with recovery in place: every replica meets the chief once more
  // after the chief committed its final checkpoint and wrote training.done, so that no replica
  // exits before the chief's writes are done (an operator's ChiefSucceeds policy watches the
  // TF_CONFIG chief pod, which after a promotion is a worker, and cleans up the running pods once
  // it succeeded). One broadcast of `step` from the chief; returns the chief's. `timeout` bounds
  // the wait for the chief. Aborted when a peer is lost first.
  int64_t finish_with_chief(int64_t step, std::chrono::milliseconds timeout);
  // The mean of `value` over all ranks (one all-reduce of one float); every rank calls it at the
  // same step. Used for the loss the chief prints and writes, so it is the global batch's loss.
  double mean_over_ranks(double value);
  bool stop_requested_by_peer() const { return stop_by_peer_; }

  // For benchmarks and logs, summed over the steps so far (steps whose gradients were averaged):
  // allreduce_seconds: the training thread blocked in average_gradients (the all-reduce time
  // the step could not hide); allreduce_busy_seconds: time spent inside all-reduce calls (on
  // the communication thread when overlapped), so 1 - allreduce_seconds / allreduce_busy_seconds
  // is the fraction hidden behind the backward pass.
  double allreduce_seconds() const { return allreduce_seconds_; }
  double allreduce_busy_seconds() const;
  int64_t averaged_steps() const { return averaged_steps_; }
  // Buckets issued in the last overlapped step (0 when it was not overlapped).
  size_t last_bucket_count() const { return last_bucket_count_; }
  // Whether the communication thread is running (tests: it is joined after a failure).
  bool communication_thread_running() const { return comm_thread_.joinable(); }

 private:
  struct Span {
    size_t begin = 0, end = 0;
  };
  bool overlaps(const model::LanguageModel& model) const;
  size_t bucket_limit(size_t elements) const;
  // Once, at the first gradient collective: every rank must plan the same buckets, else
  // InvalidArgument on every rank.
  void check_gradient_plan(model::LanguageModel& model);
  void on_gradients_ready(size_t begin, size_t end);
  void issue_bucket(Span bucket);
  void communication_loop();
  // Waits until every issued bucket is done; returns the first communication error, if any.
  std::exception_ptr wait_for_buckets();
  // Stops and joins the communication thread (idempotent).
  void stop_communication_thread();
  // Waits for buckets in flight so the training thread may use the communicator.
  void quiesce();
  void allreduce_whole(model::LanguageModel& model);
  // A device model's all-reduce over the current group (DataParallelOptions).
  std::unique_ptr<DeviceAllreduce> make_device_allreduce(const model::LanguageModel& model);
  // The live communicator; PeerLost when there is none (a regroup failed).
  Communicator& group();

  std::unique_ptr<Communicator> comm_;  // null between a failed regroup and the next one
  DataParallelOptions options_;
  int rank_ = 0, world_size_ = 1;  // fixed for the life of the group, across regroups
  int chief_ = 0;                  // the chief role (agree_state_source); may move on a regroup
  bool regroup_enabled_ = false;
  RendezvousOptions regroup_options_;
  int64_t regroups_ = 0;
  std::unique_ptr<DeviceAllreduce> device_;  // bound to comm_'s members; dropped at a regroup
  int64_t device_allreduces_made_ = 0;
  bool stop_by_peer_ = false;
  double allreduce_seconds_ = 0;
  int64_t averaged_steps_ = 0;
  size_t last_bucket_count_ = 0;
  bool plan_checked_ = false;

  // The overlapped step in progress (training thread only).
  model::LanguageModel* overlap_model_ = nullptr;  // non-null between start and average
  std::span<float> overlap_grads_;
  size_t bucket_limit_ = 0;     // elements
  Span pending_;                // ready, not yet issued (empty: begin == end)
  std::vector<Span> reported_;  // every range reported this step (contract checks)
  size_t reported_elements_ = 0;
  std::exception_ptr contract_error_;  // a broken gradient-ready contract, thrown at the end

  // Shared with the communication thread.
  std::thread comm_thread_;
  mutable Mutex mu_;
  CondVar work_cv_;                                // the thread waits for buckets or stop
  CondVar done_cv_;                                // the training thread waits for completions
  std::deque<Span> queue_ GUARDED_BY(mu_);         // issued, not yet started
  float* queue_base_ GUARDED_BY(mu_) = nullptr;    // the buffer the spans index
  float queue_scale_ GUARDED_BY(mu_) = 1.0f;       // 1 / world_size
  size_t issued_buckets_ GUARDED_BY(mu_) = 0;      // issued since construction
  size_t completed_buckets_ GUARDED_BY(mu_) = 0;   // done (or skipped) since construction
  std::exception_ptr comm_error_ GUARDED_BY(mu_);  // the first failure of the thread
  bool stop_ GUARDED_BY(mu_) = false;
  double busy_seconds_ GUARDED_BY(mu_) = 0;
  // Test-only: LONGHAUL_TEST_KILL_MID_ALLREDUCE=k (read at construction) makes this process
  // SIGKILL itself after the first gradient bucket of its k-th averaged step (overlapped CPU
  // path): a replica lost in the middle of a step's all-reduce, for the recovery tests.
  int64_t kill_mid_allreduce_at_ = 0;
  bool kill_after_bucket_ GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::dist
