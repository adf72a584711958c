// NCCL gradient all-reduce, bootstrapped over the Gloo communicator. See nccl.h.
#include "longhaul/distributed/nccl.h"

#include "longhaul/base/error.h"

#if defined(LONGHAUL_HAVE_NCCL)
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "longhaul/base/log.h"
#include "longhaul/selfcheck/selfcheck.h"
#endif

namespace longhaul::dist {

#if defined(LONGHAUL_HAVE_NCCL)
namespace {

void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) {
    throw Aborted(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  cudaGetErrorString(err));
  }
}
#define LH_DIST_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)

class NcclAllreduce : public DeviceAllreduce {
 public:
  NcclAllreduce(Communicator& comm, int device, std::chrono::milliseconds timeout)
      : rank_(comm.rank()), world_(comm.world_size()), device_(device), timeout_(timeout) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    comm.broadcast(std::as_writable_bytes(std::span<char>(id.internal, sizeof id.internal)), 0);
    if (device_ < 0) LH_DIST_CUDA(cudaGetDevice(&device_));
    LH_DIST_CUDA(cudaSetDevice(device_));
    LH_DIST_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&nccl_, world_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) check(r, "ncclCommInitRankConfig");
    wait_ready("ncclCommInitRankConfig");
  }

  ~NcclAllreduce() override {
    if (nccl_ != nullptr) {
      if (failed_) {
        ncclCommAbort(nccl_);
      } else {
        ncclCommFinalize(nccl_);
        ncclCommDestroy(nccl_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void allreduce_mean(float* device_ptr, size_t count) override {
    if (failed_)
      throw Aborted("NCCL communicator of rank " + std::to_string(rank_) +
                    " already failed; exit with code 138 so the group restarts");
    ncclResult_t r =
        ncclAllReduce(device_ptr, device_ptr, count, ncclFloat, ncclAvg, nccl_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) check(r, "ncclAllReduce");
    wait_ready("ncclAllReduce");
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (true) {
      cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) {
        failed_ = true;
        check_cuda(done, "cudaStreamQuery after ncclAllReduce", __FILE__, __LINE__);
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(nccl_, &async);
      if (async != ncclSuccess && async != ncclInProgress) check(async, "ncclAllReduce (async)");
      if (std::chrono::steady_clock::now() > deadline) {
        failed_ = true;
        throw Aborted("NCCL all-reduce of " + std::to_string(count) + " floats on rank " +
                      std::to_string(rank_) + " did not finish within " +
                      std::to_string(timeout_.count()) +
                      " ms: a peer is lost; exit with code 138 so the group restarts");
      }
      std::this_thread::yield();
    }
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    failed_ = true;
    throw Aborted(std::string(what) + " failed on rank " + std::to_string(rank_) + ": " +
                  ncclGetErrorString(r) + " (" +
                  (nccl_ ? ncclGetLastError(nccl_) : "no communicator") +
                  "); exit with code 138 so the group restarts");
  }

  void wait_ready(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(nccl_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check(state, what);
      if (std::chrono::steady_clock::now() > deadline) {
        failed_ = true;
        throw Aborted(std::string(what) + " on rank " + std::to_string(rank_) +
                      " did not complete within the timeout; a peer is lost");
      }
      std::this_thread::yield();
    }
  }

  int rank_, world_, device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool failed_ = false;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<DeviceAllreduce> make_nccl_allreduce(Communicator& comm, int device,
                                                     std::chrono::milliseconds timeout) {
  return std::make_unique<NcclAllreduce>(comm, device, timeout);
}

void verify_device_allreduce(DeviceAllreduce& allreduce, int rank, int world_size) {
  const selfcheck::CollectiveCheck check = selfcheck::check_allreduce_mean(
      [&](std::vector<float>& host) {
        float* device = nullptr;
        const size_t bytes = host.size() * sizeof(float);
        LH_DIST_CUDA(cudaMalloc(&device, bytes));
        try {
          LH_DIST_CUDA(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice));
          allreduce.allreduce_mean(device, host.size());
          LH_DIST_CUDA(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
        } catch (...) {
          cudaFree(device);
          throw;
        }
        cudaFree(device);
      },
      "nccl", rank, world_size);
  if (!check.passed) {
    throw InvalidArgument(
        "the GPUs failed the start-up self-check of the gradient all-reduce: " + check.failure +
        ". Check the interconnect and NCCL_* settings (run `longhaul-worker "
        "doctor` on each node), or train on the CPU");
  }
  LH_LOG(INFO) << "self-check: NCCL all-reduce matches the reference" << kv("rank", rank)
               << kv("world_size", world_size) << kv("relative_error", check.error);
}

#else

bool nccl_available() { return false; }

void verify_device_allreduce(DeviceAllreduce&, int, int) {
  throw FailedPrecondition("this longhaul-worker was built without NCCL");
}

std::unique_ptr<DeviceAllreduce> make_nccl_allreduce(Communicator&, int,
                                                     std::chrono::milliseconds) {
  throw FailedPrecondition(
      "this longhaul-worker was built without NCCL (no CUDA toolkit with nccl.h at build time); "
      "GPU replicas cannot all-reduce gradients");
}

#endif

}  // namespace longhaul::dist
