// DataParallel: what a training loop does to train one model on N replicas.
//
//   auto comm = dist::rendezvous(options);            // the group (communicator.h)
//   dist::DataParallel dp(std::move(comm));
//   sv.managed_session(state, [&](Supervisor& sv) {
//     dp.broadcast_state(state);                      // every rank == the chief, bit for bit
//     while (!dp.any_stop(sv.should_stop()) && step < max_steps) {
//       model.forward_backward(...);                  // this rank's shard of the batch
//       dp.average_gradients(model);                  // mean over ranks, in place
//       model.optimizer_step(...);                    // identical on every rank
//     }
//   });
//
// broadcast_state: rank 0 snapshots its TrainingState (parameters, optimizer moments, step,
// data position and every other metadata entry a checkpoint holds) and every other rank
// restores it from memory, so all ranks continue bit-identically whatever each found in the
// logdir. Rank 0 first sends its tensor list; a rank whose model has another shape fails with
// FailedPrecondition naming the first differing tensor (a config mismatch between replicas).
//
// average_gradients: all-reduce (sum) of the model's flat gradient buffer, then a scale by
// 1/world_size. CPU models use the communicator (Gloo); a CUDA model uses NCCL (ncclAvg) when
// the build has it (nccl.h), otherwise it is refused with FailedPrecondition. The all-reduce runs
// after the backward pass, in one call over the whole buffer: LanguageModel has no per-layer
// completion hook, so it does not overlap with the backward pass.
//
// any_stop: an all-reduce (max) of one flag per step, so a stop requested on any rank (SIGTERM
// on one pod, max_steps) ends every rank at the same step; the chief then commits the final
// checkpoint. stop_requested_by_peer() tells a rank that stopped only because another did (it
// exits 138 so the group restarts, instead of 0 which would read as "finished").
//
// Errors: every collective throws Aborted when a peer is lost (see communicator.h).
// Thread-safety: one training thread.
#pragma once

#include <chrono>
#include <memory>

#include "longhaul/dist/communicator.h"
#include "longhaul/model/language_model.h"
#include "longhaul/supervisor/training_state.h"

namespace longhaul::dist {

// All-reduce over device memory (NCCL); see nccl.h.
class DeviceAllreduce {
 public:
  virtual ~DeviceAllreduce() = default;
  // Mean over ranks, in place, of `count` floats at `device_ptr`; Aborted on failure/timeout.
  virtual void allreduce_mean(float* device_ptr, size_t count) = 0;
};

class DataParallel {
 public:
  // `device` may be null: a CUDA model then gets an NCCL all-reduce at its first step when the
  // build has NCCL (device_timeout bounds each NCCL collective), else FailedPrecondition.
  explicit DataParallel(std::unique_ptr<Communicator> comm,
                        std::unique_ptr<DeviceAllreduce> device = nullptr,
                        std::chrono::milliseconds device_timeout = std::chrono::seconds(300));
  ~DataParallel();

  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }
  Communicator& communicator() { return *comm_; }

  // See above. `timeout` bounds the wait for rank 0 (it may still be restoring a large
  // checkpoint when the others arrive); zero: the collective timeout.
  void broadcast_state(supervisor::TrainingState& state,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  void average_gradients(model::LanguageModel& model);
  bool any_stop(bool local_stop);
  // The mean of `value` over all ranks (one all-reduce of one float); every rank calls it at the
  // same step. Used for the loss the chief prints and writes, so it is the global batch's loss.
  double mean_over_ranks(double value);
  bool stop_requested_by_peer() const { return stop_by_peer_; }

  // Seconds spent in average_gradients so far (for benchmarks and logs).
  double allreduce_seconds() const { return allreduce_seconds_; }

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<DeviceAllreduce> device_;
  std::chrono::milliseconds device_timeout_;
  bool stop_by_peer_ = false;
  double allreduce_seconds_ = 0;
};

}  // namespace longhaul::dist
