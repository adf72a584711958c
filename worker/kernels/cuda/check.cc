#include "longhaul/kernels/cuda/check.h"

#include <string>

#include <longhaul/base/error.h>

namespace longhaul::kernels::cuda {
namespace {

std::string location(const char* expression, const char* file, int line) {
  return std::string(" in `") + expression + "` at " + file + ":" + std::to_string(line);
}

}  // namespace

void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line) {
  // Clear a sticky-free error so that later unrelated checks do not report it again.
  (void)cudaGetLastError();
  const std::string message = std::string("CUDA error ") + cudaGetErrorName(status) + " (" +
                              cudaGetErrorString(status) + ")" + location(expression, file, line);
  switch (status) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemNotReady:
    case cudaErrorNoKernelImageForDevice:
      throw Unavailable(message + ": no usable GPU; run with device: cpu or on a GPU node");
    case cudaErrorMemoryAllocation:
      throw FailedPrecondition(
          message + ": out of GPU memory; lower the micro-batch size or sequence length");
    default:
      throw Internal(message);
  }
}

void throw_cublas_error(cublasStatus_t status, const char* expression, const char* file, int line) {
  const std::string message = std::string("cuBLAS error ") + cublasLtGetStatusName(status) + " (" +
                              cublasLtGetStatusString(status) + ")" +
                              location(expression, file, line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    throw FailedPrecondition(message +
                             ": out of GPU memory; lower the micro-batch size or sequence length");
  }
  if (status == CUBLAS_STATUS_NOT_INITIALIZED || status == CUBLAS_STATUS_ARCH_MISMATCH) {
    throw Unavailable(message + ": cuBLASLt cannot run on this GPU");
  }
  throw Internal(message);
}

}  // namespace longhaul::kernels::cuda
