// Device-side helpers shared by the kernels of longhaul::kernels_cuda (internal header).
//
// - 16-byte vector access: `Pack8` moves eight bf16 (one 128-bit load or store), the widest
//   access a thread can make; every bf16 tensor row here has a length divisible by 8 and starts
//   16-byte aligned (the model validates C % 8 == 0, every tensor's offset in the flat working
//   copy is a multiple of C, and every activation buffer starts 256-byte aligned).
// - Warp and block reductions by shuffles; block reductions return the result to every thread.
// - Stochastic rounding fp32 -> bf16: bf16 keeps the top 16 bits of an fp32. Adding a uniform
//   random 16-bit integer to the low half before truncating rounds up with probability equal to
//   the discarded fraction, so E[round(x)] = x: small AdamW updates (lr * update < ulp/2 of the
//   weight) survive in expectation instead of being rounded away.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace longhaul::kernels::cuda::detail {

struct alignas(16) Pack8 {
  __nv_bfloat16 v[8];
};

__device__ __forceinline__ Pack8 load8(const __nv_bfloat16* p) {
  Pack8 out;
  *reinterpret_cast<int4*>(&out) = *reinterpret_cast<const int4*>(p);
  return out;
}

__device__ __forceinline__ void store8(__nv_bfloat16* p, const Pack8& x) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&x);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` must hold 32 floats; the call contains barriers, so every thread must make it.
__device__ __forceinline__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(x);
}

__device__ __forceinline__ float block_max(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(x);
}

// A 32-bit integer hash with good avalanche (Chris Wellons' "lowbias32").
__host__ __device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ __nv_bfloat16 round_stochastic(float x, uint32_t random) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) != 0x7f800000u) {  // leave inf and NaN alone
    bits += random & 0xffffu;
  }
  return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

inline unsigned int ceil_div(long long a, long long b) {
  return static_cast<unsigned int>((a + b - 1) / b);
}

}  // namespace longhaul::kernels::cuda::detail
