// fp32 -> bf16 conversion with round-to-nearest-even, one element per thread (memory-bound,
// runs only at initialisation and restore, so not vectorised).
#include <string>

#include "device_util.cuh"
#include "longhaul/kernels/cuda/cast.h"
#include "longhaul/kernels/cuda/check.h"

namespace longhaul::kernels::cuda {
namespace {

__global__ void cast_to_bf16_kernel(bf16* __restrict__ out,         // (n)
                                    const float* __restrict__ inp,  // (n)
                                    long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(inp[i]);
}

}  // namespace

bool kernels_runnable(std::string* why) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why != nullptr) {
      if (status == cudaErrorInsufficientDriver) {
        // What the runtime says when there is no driver at all, too: say both.
        int runtime = 0;
        (void)cudaRuntimeGetVersion(&runtime);
        *why =
            "no usable NVIDIA driver: none is installed, or it is older than this build's CUDA " +
            std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
            " runtime needs";
      } else if (status == cudaSuccess || status == cudaErrorNoDevice) {
        *why = "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
      } else {
        *why = std::string("no CUDA device: ") + cudaGetErrorString(status);
      }
    }
    (void)cudaGetLastError();
    return false;
  }
  cudaFuncAttributes attributes{};
  status = cudaFuncGetAttributes(&attributes, cast_to_bf16_kernel);
  if (status != cudaSuccess) {
    if (why != nullptr) {
      *why = std::string("the CUDA kernels cannot run on this GPU (") + cudaGetErrorString(status) +
             "); rebuild with CMAKE_CUDA_ARCHITECTURES including its compute capability";
    }
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void cast_to_bf16(bf16* out, const float* inp, long long n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  cast_to_bf16_kernel<<<detail::ceil_div(n, threads), threads, 0, stream>>>(out, inp, n);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
