// NCCL all-reduce of device gradients for CUDA models (built only when LONGHAUL_HAVE_CUDA and
// NCCL are found; nccl_available() says which).
//
// Bootstrap: rank 0 creates an ncclUniqueId and sends it to the others over the Gloo
// communicator that the logdir rendezvous formed (communicator.h), so NCCL needs no extra
// rendezvous. The NCCL communicator is created non-blocking so that a lost peer cannot hang the
// process: allreduce_mean polls the stream and ncclCommGetAsyncError, and after
// `timeout` (or on an async error) aborts the communicator (ncclCommAbort) and throws Aborted.
//
// The reduction is ncclAvg: after allreduce_mean the buffer holds the mean over ranks, which
// verify_device_allreduce checks once before the first gradients are reduced.
//
// Thread-safety: one training thread; the model's CUDA device must be current on it.
#pragma once

#include <chrono>
#include <memory>

#include "longhaul/distributed/communicator.h"
#include "longhaul/distributed/data_parallel.h"

namespace longhaul::dist {

// True when this build has NCCL.
bool nccl_available();

// Creates the NCCL communicator for `comm`'s group on CUDA device `device` (-1: the calling
// thread's current device). Throws
// FailedPrecondition when the build has no NCCL, Aborted when NCCL cannot form the group.
std::unique_ptr<DeviceAllreduce> make_nccl_allreduce(Communicator& comm, int device,
                                                     std::chrono::milliseconds timeout);

// The start-up self-check of the device all-reduce (selfcheck::check_allreduce_mean on 1 Mi
// floats in device memory of the current device): called once, right after the communicator is
// made and before the first gradients are reduced. Throws InvalidArgument (exit 2) naming the
// collective, the rank, the error and the tolerance when the mean is wrong, so no update is
// ever applied with wrongly reduced gradients.
void verify_device_allreduce(DeviceAllreduce& allreduce, int rank, int world_size);

}  // namespace longhaul::dist
