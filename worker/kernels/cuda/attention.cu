// Causal self-attention, per (b, h) with q, k, v (T, HS), scale = 1/sqrt(HS):
//   S = scale * Q K^T,  P = causal_softmax(S) (P[t,s] = 0 for s > t),  Y = P V
// Backward, with dY:
//   dP = dY V^T,   dV = P^T dY
//   dS[t,s] = scale * P[t,s] (dP[t,s] - sum_j P[t,j] dP[t,j])     (softmax backward)
//   dQ = dS K,     dK = dS^T Q
//
// Implementation: the four products per direction are cuBLASLt strided-batched GEMMs over the
// B*NH heads (tensor cores, bf16 in, fp32 accumulate), so q, k, v are first split into a
// head-major (3, B, NH, T, HS) copy — each head's (T, HS) block contiguous — and the result
// merged back to (B, T, C). Only two custom kernels touch the (T, T) scores: a fused causal
// softmax (scale, mask, max, exp, sum, normalise: one warp per row, one reading pass with an
// online max/sum, one writing pass, fp32 math) writing P over S in place, and its backward
// writing dS over dP in place. Entries above the diagonal are written as exact zeros, so the
// following GEMMs over the full (T, T) square need no masking.
//
// Memory: P is kept for the backward pass (B*NH*T*T bf16 per layer); this is the price of not
// having a flash-style kernel (which would recompute it from the saved logsumexp). The square
// products also do ~2x the causal FLOPs.
//
// Column-major GEMM forms (a row-major (T, HS) block is column-major HS x T, see matmul.cc):
//   S^T  (T x T)  = op_T(K^T) * Q^T         m=T,  n=T, k=HS, trans_a
//   Y^T  (HS x T) = V^T * P^T               m=HS, n=T, k=T
//   dP^T (T x T)  = op_T(V^T) * dY^T        m=T,  n=T, k=HS, trans_a
//   dV^T (HS x T) = dY^T * op_T(P^T)        m=HS, n=T, k=T,  trans_b
//   dQ^T (HS x T) = K^T * dS^T              m=HS, n=T, k=T
//   dK^T (HS x T) = Q^T * op_T(dS^T)        m=HS, n=T, k=T,  trans_b
#include <cmath>

#include "device_util.cuh"
#include "longhaul/kernels/cuda/attention.h"
#include "longhaul/kernels/cuda/check.h"

namespace longhaul::kernels::cuda {
namespace {

// One thread per 8 channels of qkv: (B, T, 3, NH, HS) -> (3, B, NH, T, HS). HS % 8 == 0.
__global__ void split_heads_kernel(bf16* __restrict__ qkvr,       // (3, B, NH, T, HS)
                                   const bf16* __restrict__ qkv,  // (B, T, 3*C)
                                   int B, int T, int C, int NH) {
  const long long idx = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (idx >= 3LL * B * T * C) return;
  const int HS = C / NH;
  const int c3 = static_cast<int>(idx % (3 * C));
  const long long bt = idx / (3 * C);
  const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
  const int part = c3 / C, h = (c3 % C) / HS, d = c3 % HS;
  const long long dst = (((static_cast<long long>(part) * B + b) * NH + h) * T + t) * HS + d;
  detail::store8(qkvr + dst, detail::load8(qkv + idx));
}

// (B, NH, T, HS) -> (B, T, NH, HS) = (B, T, C), one thread per 8 channels.
__global__ void merge_heads_kernel(bf16* __restrict__ out,      // (B, T, C)
                                   const bf16* __restrict__ y,  // (B, NH, T, HS)
                                   int B, int T, int C, int NH) {
  const long long idx = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (idx >= static_cast<long long>(B) * T * C) return;
  const int HS = C / NH;
  const int c = static_cast<int>(idx % C);
  const long long bt = idx / C;
  const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
  const int h = c / HS, d = c % HS;
  const long long src = ((static_cast<long long>(b) * NH + h) * T + t) * HS + d;
  detail::store8(out + idx, detail::load8(y + src));
}

// (B, T, C) -> (B, NH, T, HS), the inverse of merge_heads (for dY).
__global__ void split_dout_kernel(bf16* __restrict__ dy,          // (B, NH, T, HS)
                                  const bf16* __restrict__ dout,  // (B, T, C)
                                  int B, int T, int C, int NH) {
  const long long idx = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (idx >= static_cast<long long>(B) * T * C) return;
  const int HS = C / NH;
  const int c = static_cast<int>(idx % C);
  const long long bt = idx / C;
  const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
  const int h = c / HS, d = c % HS;
  const long long dst = ((static_cast<long long>(b) * NH + h) * T + t) * HS + d;
  detail::store8(dy + dst, detail::load8(dout + idx));
}

// (3, B, NH, T, HS) -> (B, T, 3*C), the inverse of split_heads (for dq, dk, dv).
__global__ void merge_qkv_grad_kernel(bf16* __restrict__ dqkv,         // (B, T, 3*C)
                                      const bf16* __restrict__ dqkvr,  // (3, B, NH, T, HS)
                                      int B, int T, int C, int NH) {
  const long long idx = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (idx >= 3LL * B * T * C) return;
  const int HS = C / NH;
  const int c3 = static_cast<int>(idx % (3 * C));
  const long long bt = idx / (3 * C);
  const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
  const int part = c3 / C, h = (c3 % C) / HS, d = c3 % HS;
  const long long src = (((static_cast<long long>(part) * B + b) * NH + h) * T + t) * HS + d;
  detail::store8(dqkv + idx, detail::load8(dqkvr + src));
}

// One warp per query row t of one head: P[t, s] = softmax over s <= t of scale * S[t, s];
// P[t, s] = 0 for s > t. In place over S. Online max/sum in one pass, then one writing pass.
__global__ void causal_softmax_forward_kernel(bf16* __restrict__ att,  // (B*NH, T, T)
                                              long long rows, int T, float scale) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  bf16* p = att + row * T;
  float maxval = -INFINITY, sum = 0.0f;
  for (int s = lane; s <= t; s += 32) {
    const float x = __bfloat162float(p[s]) * scale;
    const float new_max = fmaxf(maxval, x);
    sum = sum * __expf(maxval - new_max) + __expf(x - new_max);
    maxval = new_max;
  }
  // Combine the lanes' (max, sum) pairs.
  const float row_max = detail::warp_max(maxval);
  sum = maxval == -INFINITY ? 0.0f : sum * __expf(maxval - row_max);
  const float inv_sum = 1.0f / detail::warp_sum(sum);
  for (int s = lane; s < T; s += 32) {
    const float value = s <= t ? __expf(__bfloat162float(p[s]) * scale - row_max) * inv_sum : 0.0f;
    p[s] = __float2bfloat16_rn(value);
  }
}

// One warp per row: dS[t, s] = scale * P (dP - sum_j P dP), in place over dP, 0 for s > t.
__global__ void causal_softmax_backward_kernel(bf16* __restrict__ datt,       // (B*NH, T, T)
                                               const bf16* __restrict__ att,  // (B*NH, T, T)
                                               long long rows, int T, float scale) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  bf16* dp = datt + row * T;
  const bf16* p = att + row * T;
  float dot = 0.0f;
  for (int s = lane; s <= t; s += 32) dot += __bfloat162float(p[s]) * __bfloat162float(dp[s]);
  dot = detail::warp_sum(dot);
  for (int s = lane; s < T; s += 32) {
    const float value =
        s <= t ? scale * __bfloat162float(p[s]) * (__bfloat162float(dp[s]) - dot) : 0.0f;
    dp[s] = __float2bfloat16_rn(value);
  }
}

GemmDesc batched(int m, int n, int k, bool trans_a, bool trans_b, int batch, long long stride_a,
                 long long stride_b, long long stride_d) {
  GemmDesc g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.batch = batch;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_d = stride_d;
  return g;
}

constexpr int kThreads = 256;

}  // namespace

void attention_forward(Matmul& mm, bf16* out, bf16* qkvr, bf16* att, bf16* scratch_y,
                       const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  const int HS = C / NH, heads = B * NH;
  const long long head_block = static_cast<long long>(T) * HS;
  const long long square = static_cast<long long>(T) * T;
  const long long btc = static_cast<long long>(B) * T * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bf16* q = qkvr;
  const bf16* k = qkvr + btc;
  const bf16* v = qkvr + 2 * btc;

  split_heads_kernel<<<detail::ceil_div(3 * btc / 8, kThreads), kThreads, 0, stream>>>(qkvr, qkv, B,
                                                                                       T, C, NH);
  LH_CUDA_CHECK_LAUNCH();
  // S^T = op_T(K^T) * Q^T, unscaled (the softmax applies the scale in fp32).
  mm.run(batched(T, T, HS, true, false, heads, head_block, head_block, square), att, k, q, stream);
  const long long rows = static_cast<long long>(heads) * T;
  causal_softmax_forward_kernel<<<detail::ceil_div(rows, kThreads / 32), kThreads, 0, stream>>>(
      att, rows, T, scale);
  LH_CUDA_CHECK_LAUNCH();
  // Y^T = V^T * P^T, per head, then merged to (B, T, C).
  mm.run(batched(HS, T, T, false, false, heads, head_block, square, head_block), scratch_y, v, att,
         stream);
  merge_heads_kernel<<<detail::ceil_div(btc / 8, kThreads), kThreads, 0, stream>>>(out, scratch_y,
                                                                                   B, T, C, NH);
  LH_CUDA_CHECK_LAUNCH();
}

void attention_backward(Matmul& mm, bf16* dqkv, bf16* scratch_heads, bf16* scratch_att,
                        const bf16* dout, const bf16* qkvr, const bf16* att, int B, int T, int C,
                        int NH, cudaStream_t stream) {
  const int HS = C / NH, heads = B * NH;
  const long long head_block = static_cast<long long>(T) * HS;
  const long long square = static_cast<long long>(T) * T;
  const long long btc = static_cast<long long>(B) * T * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bf16* q = qkvr;
  const bf16* k = qkvr + btc;
  const bf16* v = qkvr + 2 * btc;
  bf16* dq = scratch_heads;
  bf16* dk = scratch_heads + btc;
  bf16* dv = scratch_heads + 2 * btc;
  bf16* dy = scratch_heads + 3 * btc;

  split_dout_kernel<<<detail::ceil_div(btc / 8, kThreads), kThreads, 0, stream>>>(dy, dout, B, T, C,
                                                                                  NH);
  LH_CUDA_CHECK_LAUNCH();
  // dP^T = op_T(V^T) * dY^T.
  mm.run(batched(T, T, HS, true, false, heads, head_block, head_block, square), scratch_att, v, dy,
         stream);
  // dV^T = dY^T * op_T(P^T).
  mm.run(batched(HS, T, T, false, true, heads, head_block, square, head_block), dv, dy, att,
         stream);
  const long long rows = static_cast<long long>(heads) * T;
  causal_softmax_backward_kernel<<<detail::ceil_div(rows, kThreads / 32), kThreads, 0, stream>>>(
      scratch_att, att, rows, T, scale);
  LH_CUDA_CHECK_LAUNCH();
  // dQ^T = K^T * dS^T;  dK^T = Q^T * op_T(dS^T).
  mm.run(batched(HS, T, T, false, false, heads, head_block, square, head_block), dq, k, scratch_att,
         stream);
  mm.run(batched(HS, T, T, false, true, heads, head_block, square, head_block), dk, q, scratch_att,
         stream);
  merge_qkv_grad_kernel<<<detail::ceil_div(3 * btc / 8, kThreads), kThreads, 0, stream>>>(
      dqkv, scratch_heads, B, T, C, NH);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
