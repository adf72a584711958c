// Fused softmax + cross-entropy + its gradient, one block per row of logits.
//
// Math, per row z (the V real vocabulary columns) with target y:
//   m = max z,  s = sum exp(z - m),  lse = m + log s,  loss = lse - z_y
//   dz_j = dloss * (exp(z_j - lse) - [j == y])
// Memory: the (N, Vp) logits are the largest activation of the model (1.6 GB in bf16 for
// GPT-2 124M at B*T = 16384). The kernel reads each row twice — once for (m, s) with an online
// max/sum (a running max; the sum is rescaled when the max grows), once to write dz over the
// logits in place — and never stores probabilities: 2 reads + 1 write of the row, the second
// read usually served from L2 (a row is ~100 KB). The padding columns [V, Vp) take no part in
// the softmax and get gradient 0, so the classifier GEMM's backward sees exact zeros there.
// z_y is read before the first barrier, i.e. before any thread overwrites the row.
#include "device_util.cuh"
#include "longhaul/kernels/cuda/check.h"
#include "longhaul/kernels/cuda/classifier.h"

namespace longhaul::kernels::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads)
    fused_classifier_kernel(bf16* __restrict__ logits,            // (N, Vp)
                            float* __restrict__ losses,           // (N)
                            const int32_t* __restrict__ targets,  // (N)
                            float dloss, int V, int Vp, bool write_dlogits) {
  __shared__ float shared[32];
  const long long row = blockIdx.x;
  bf16* z = logits + row * Vp;
  const int target = targets[row];
  const float z_target = __bfloat162float(z[target]);

  float maxval = -INFINITY, sum = 0.0f;
  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    const detail::Pack8 x = detail::load8(z + c);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (c + i < V) {
        const float v = __bfloat162float(x.v[i]);
        if (v > maxval) {
          sum = sum * __expf(maxval - v) + 1.0f;
          maxval = v;
        } else {
          sum += __expf(v - maxval);
        }
      }
    }
  }
  const float row_max = detail::block_max(maxval, shared);
  sum = maxval == -INFINITY ? 0.0f : sum * __expf(maxval - row_max);
  const float row_sum = detail::block_sum(sum, shared);
  const float lse = row_max + logf(row_sum);
  if (threadIdx.x == 0) losses[row] = lse - z_target;
  if (!write_dlogits) return;

  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    const detail::Pack8 x = detail::load8(z + c);
    detail::Pack8 d;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int col = c + i;
      float g = 0.0f;
      if (col < V) {
        g = __expf(__bfloat162float(x.v[i]) - lse);
        if (col == target) g -= 1.0f;
        g *= dloss;
      }
      d.v[i] = __float2bfloat16_rn(g);
    }
    detail::store8(z + c, d);
  }
}

}  // namespace

void fused_classifier(bf16* logits, float* losses, const int32_t* targets, float dloss, int N,
                      int V, int Vp, bool write_dlogits, cudaStream_t stream) {
  if (N == 0) return;
  fused_classifier_kernel<<<N, kThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp,
                                                      write_dlogits);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
