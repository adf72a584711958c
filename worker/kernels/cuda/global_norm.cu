// Deterministic sums over a large fp32 vector (the ~124M gradients for the global norm, the
// B*T losses for the mean loss).
//
// Two stages, both with a fixed shape so the floating-point summation order never changes:
//   1. kBlocks blocks (a constant, not the SM count) each sum the elements i with
//      i % (kBlocks * threads) in their slice, grid-striding with 16-byte float4 loads where
//      aligned, then a shuffle tree within the block -> scratch[block];
//   2. one block sums the kBlocks partials in a fixed tree -> *out.
// Partial sums are fp32 over at most n / (kBlocks * threads) terms per thread (~500 for 124M),
// which keeps the relative error near 1e-6; the CPU reference accumulates in double.
// The clipping itself is folded into AdamW's grad_scale (min(1, max_norm / norm)), so no pass
// rewrites the gradients.
#include "device_util.cuh"
#include "longhaul/kernels/cuda/check.h"
#include "longhaul/kernels/cuda/global_norm.h"

namespace longhaul::kernels::cuda {
namespace {

constexpr int kBlocks = 1024;
constexpr int kThreads = 256;

template <bool kSquare>
__device__ __forceinline__ float term(float x) {
  return kSquare ? x * x : x;
}

template <bool kSquare>
__global__ void partial_sum_kernel(float* __restrict__ partials,  // (kBlocks)
                                   const float* __restrict__ x,   // (n)
                                   long long n) {
  __shared__ float shared[32];
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) % 16) == 0;
  if (aligned) {
    const long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (long long i = first; i < n4; i += stride) {
      const float4 v = x4[i];
      acc += term<kSquare>(v.x) + term<kSquare>(v.y) + term<kSquare>(v.z) + term<kSquare>(v.w);
    }
    for (long long i = n4 * 4 + first; i < n; i += stride) acc += term<kSquare>(x[i]);
  } else {
    for (long long i = first; i < n; i += stride) acc += term<kSquare>(x[i]);
  }
  acc = detail::block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void final_sum_kernel(float* __restrict__ out,             // (1)
                                 const float* __restrict__ partials,  // (kBlocks)
                                 int count) {
  __shared__ float shared[32];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = detail::block_sum(acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

template <bool kSquare>
void reduce(float* out, float* scratch, const float* x, long long n, cudaStream_t stream) {
  partial_sum_kernel<kSquare><<<kBlocks, kThreads, 0, stream>>>(scratch, x, n);
  LH_CUDA_CHECK_LAUNCH();
  final_sum_kernel<<<1, kThreads, 0, stream>>>(out, scratch, kBlocks);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace

long long reduction_scratch_floats() { return kBlocks; }

void sum_of_squares(float* out, float* scratch, const float* x, long long n, cudaStream_t stream) {
  reduce<true>(out, scratch, x, n, stream);
}

void sum(float* out, float* scratch, const float* x, long long n, cudaStream_t stream) {
  reduce<false>(out, scratch, x, n, stream);
}

}  // namespace longhaul::kernels::cuda
