// Layer normalisation fused with the residual add (eps = 1e-5, biased variance, as GPT-2).
//
// Forward, one warp per row (a row of C <= a few thousand bf16 fits the warp's L1 traffic):
//   x = round_bf16(a + b)            written to `residual` (the next residual stream value)
//   mean = sum(x)/C,  var = sum((x-mean)^2)/C,  rstd = 1/sqrt(var + eps)
//   out = (x - mean) * rstd * w + bias
// Three passes over the row: the first writes x, the later two re-read it (the warp's own writes,
// served from L1/L2), so device memory sees 2 reads + 2 writes of N*C bf16 — the fused minimum —
// instead of the 3 reads + 2 writes of a separate residual kernel. The variance is taken around
// the mean (two-pass) rather than E[x^2] - mean^2, which cancels badly for large activations.
// The statistics are computed on the *rounded* residual, the same values the backward re-reads.
//
// Backward, with n = (x - mean) * rstd and g = dout * w:
//   dinp   += rstd * (g - mean(g) - n * mean(g * n))
//   dweight += sum_rows dout * n,   dbias += sum_rows dout
// dinp: one warp per row, two passes (row means of g and g*n, then the update).
// dweight/dbias: a column reduction over N rows. Atomics would make the summation order differ
// between runs, so it is two fixed-order stages: kReductionChunks row chunks each write partial
// sums to scratch (thread = channel, coalesced along C, rows walked in order), then one thread
// per channel adds the chunks in chunk order and accumulates into the fp32 gradient.
#include "device_util.cuh"
#include "longhaul/kernels/cuda/check.h"
#include "longhaul/kernels/cuda/layernorm.h"

namespace longhaul::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void residual_layernorm_forward_kernel(bf16* __restrict__ residual,   // (N, C)
                                                  bf16* __restrict__ out,        // (N, C)
                                                  float* __restrict__ mean_out,  // (N)
                                                  float* __restrict__ rstd_out,  // (N)
                                                  const bf16* __restrict__ a,    // (N, C)
                                                  const bf16* __restrict__ b,    // (N, C) or null
                                                  const bf16* __restrict__ weight,  // (C)
                                                  const bf16* __restrict__ bias,    // (C)
                                                  int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const long long base = static_cast<long long>(row) * C;
  // The row the statistics are taken over: the fresh residual, or `a` itself.
  const bf16* x = b != nullptr ? residual + base : a + base;

  float sum = 0.0f;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    if (b != nullptr) {
      const detail::Pack8 pa = detail::load8(a + base + c), pb = detail::load8(b + base + c);
      detail::Pack8 r;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        r.v[i] = __float2bfloat16_rn(__bfloat162float(pa.v[i]) + __bfloat162float(pb.v[i]));
        sum += __bfloat162float(r.v[i]);
      }
      detail::store8(residual + base + c, r);
    } else {
      const detail::Pack8 pa = detail::load8(a + base + c);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += __bfloat162float(pa.v[i]);
    }
  }
  const float mean = detail::warp_sum(sum) / C;
  // Each lane re-reads only the elements it wrote itself above: no barrier needed.

  float sq = 0.0f;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    const detail::Pack8 px = detail::load8(x + c);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float d = __bfloat162float(px.v[i]) - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(detail::warp_sum(sq) / C + kLayerNormEps);

  for (int c = lane * 8; c < C; c += 32 * 8) {
    const detail::Pack8 px = detail::load8(x + c);
    const detail::Pack8 pw = detail::load8(weight + c), pbias = detail::load8(bias + c);
    detail::Pack8 o;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float n = (__bfloat162float(px.v[i]) - mean) * rstd;
      o.v[i] = __float2bfloat16_rn(n * __bfloat162float(pw.v[i]) + __bfloat162float(pbias.v[i]));
    }
    detail::store8(out + base + c, o);
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

__global__ void layernorm_backward_dinp_kernel(bf16* __restrict__ dinp,          // (N, C)
                                               const bf16* __restrict__ dout,    // (N, C)
                                               const bf16* __restrict__ inp,     // (N, C)
                                               const bf16* __restrict__ weight,  // (C)
                                               const float* __restrict__ mean,   // (N)
                                               const float* __restrict__ rstd,   // (N)
                                               int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const long long base = static_cast<long long>(row) * C;
  const float mu = mean[row], rs = rstd[row];

  float g_sum = 0.0f, gn_sum = 0.0f;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    const detail::Pack8 pd = detail::load8(dout + base + c), px = detail::load8(inp + base + c);
    const detail::Pack8 pw = detail::load8(weight + c);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float g = __bfloat162float(pd.v[i]) * __bfloat162float(pw.v[i]);
      const float n = (__bfloat162float(px.v[i]) - mu) * rs;
      g_sum += g;
      gn_sum += g * n;
    }
  }
  const float g_mean = detail::warp_sum(g_sum) / C;
  const float gn_mean = detail::warp_sum(gn_sum) / C;

  for (int c = lane * 8; c < C; c += 32 * 8) {
    const detail::Pack8 pd = detail::load8(dout + base + c), px = detail::load8(inp + base + c);
    const detail::Pack8 pw = detail::load8(weight + c);
    detail::Pack8 pi = detail::load8(dinp + base + c);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float g = __bfloat162float(pd.v[i]) * __bfloat162float(pw.v[i]);
      const float n = (__bfloat162float(px.v[i]) - mu) * rs;
      const float d = rs * (g - g_mean - n * gn_mean);
      pi.v[i] = __float2bfloat16_rn(__bfloat162float(pi.v[i]) + d);
    }
    detail::store8(dinp + base + c, pi);
  }
}

// grid (ceil(C / blockDim.x), kReductionChunks). scratch (kReductionChunks, 2, C).
__global__ void layernorm_backward_partial_kernel(float* __restrict__ scratch,
                                                  const bf16* __restrict__ dout,   // (N, C)
                                                  const bf16* __restrict__ inp,    // (N, C)
                                                  const float* __restrict__ mean,  // (N)
                                                  const float* __restrict__ rstd,  // (N)
                                                  int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= C) return;
  const int rows_per_chunk = (N + kReductionChunks - 1) / kReductionChunks;
  const int begin = chunk * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dw = 0.0f, db = 0.0f;
  for (int row = begin; row < end; ++row) {
    const long long i = static_cast<long long>(row) * C + c;
    const float d = __bfloat162float(dout[i]);
    dw += d * (__bfloat162float(inp[i]) - mean[row]) * rstd[row];
    db += d;
  }
  scratch[(2LL * chunk) * C + c] = dw;
  scratch[(2LL * chunk + 1) * C + c] = db;
}

__global__ void layernorm_backward_finish_kernel(float* __restrict__ dweight,        // (C)
                                                 float* __restrict__ dbias,          // (C)
                                                 const float* __restrict__ scratch,  // (chunks,2,C)
                                                 int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int chunk = 0; chunk < kReductionChunks; ++chunk) {
    dw += scratch[(2LL * chunk) * C + c];
    db += scratch[(2LL * chunk + 1) * C + c];
  }
  dweight[c] += dw;
  dbias[c] += db;
}

}  // namespace

void residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                cudaStream_t stream) {
  residual_layernorm_forward_kernel<<<detail::ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                                      stream>>>(residual, out, mean, rstd, a, b, weight, bias, N,
                                                C);
  LH_CUDA_CHECK_LAUNCH();
}

long long layernorm_backward_scratch_floats(int C) { return 2LL * kReductionChunks * C; }

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                        const bf16* inp, const bf16* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t stream) {
  layernorm_backward_dinp_kernel<<<detail::ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                                   stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  LH_CUDA_CHECK_LAUNCH();
  const int threads = 256;
  const dim3 grid(detail::ceil_div(C, threads), kReductionChunks);
  layernorm_backward_partial_kernel<<<grid, threads, 0, stream>>>(scratch, dout, inp, mean, rstd, N,
                                                                  C);
  LH_CUDA_CHECK_LAUNCH();
  layernorm_backward_finish_kernel<<<detail::ceil_div(C, threads), threads, 0, stream>>>(
      dweight, dbias, scratch, C);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
