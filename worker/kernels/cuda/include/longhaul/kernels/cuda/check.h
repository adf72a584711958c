// Error checking for every CUDA runtime, cuBLASLt call and kernel launch of the CUDA backend.
//
//   LH_CUDA_CHECK(cudaMemcpyAsync(...));   // throws when the call fails
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   LH_CUDA_CHECK_LAUNCH();                  // launch-configuration errors, named by file:line
//   LH_CUBLAS_CHECK(cublasLtMatmul(...));
//
// A failing call throws a longhaul::Error whose message names the expression, the error's name
// and description and the file:line of the check (as llm.c's cudaCheck does, but as an exception
// so the supervisor can stop cleanly and the worker exits with a code). No GPU, no driver or an
// unusable device map to Unavailable (retrying on another node may help); running out of device
// memory maps to FailedPrecondition (lower the micro-batch); everything else is Internal.
//
// Thread-safety: stateless; the macros may be used from any thread.
#pragma once

#include <string>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace longhaul::kernels::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expression,
                                     const char* file, int line);

}  // namespace longhaul::kernels::cuda

#define LH_CUDA_CHECK(expression)                                                         \
  do {                                                                                    \
    const cudaError_t lh_cuda_status_ = (expression);                                     \
    if (lh_cuda_status_ != cudaSuccess) {                                                 \
      ::longhaul::kernels::cuda::throw_cuda_error(lh_cuda_status_, #expression, __FILE__, \
                                                  __LINE__);                              \
    }                                                                                     \
  } while (0)

// Checks the launch just made (bad configuration, too much shared memory, no kernel image for
// this GPU). Faults inside the kernel surface at the next synchronising call's check.
#define LH_CUDA_CHECK_LAUNCH() LH_CUDA_CHECK(cudaGetLastError())

#define LH_CUBLAS_CHECK(expression)                                                           \
  do {                                                                                        \
    const cublasStatus_t lh_cublas_status_ = (expression);                                    \
    if (lh_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                         \
      ::longhaul::kernels::cuda::throw_cublas_error(lh_cublas_status_, #expression, __FILE__, \
                                                    __LINE__);                                \
    }                                                                                         \
  } while (0)

namespace longhaul::kernels::cuda {

// Whether this library's kernels can run on the current device (a GPU is present and the
// binary holds code for its architecture). On false, *why says what is wrong. Never throws.
bool kernels_runnable(std::string* why);

}  // namespace longhaul::kernels::cuda
