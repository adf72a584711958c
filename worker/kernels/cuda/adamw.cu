// AdamW (torch.optim.AdamW's update: decoupled decay on the pre-update parameter), with
// g = grad * grad_scale and step t >= 1:
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   master -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * master)
//   param   = stochastic_round_bf16(master)
// The master weights stay fp32 so updates far below bf16's resolution still accumulate; the bf16
// copy the matmuls read is rounded stochastically (unbiased, see device_util.cuh) with a random
// stream derived from (seed, element index), so a step is reproducible given its seed.
//
// Elementwise over the flat parameter range; memory-bound: per element 4 fp32 reads (master,
// grad, m, v), 3 fp32 writes and 1 bf16 write = 30 bytes. The bias corrections are computed once
// on the host in double. The model updates all ~150 tensors in one launch through a table of
// fixed-size chunks (block = chunk), each naming its offsets and whether it is weight-decayed;
// the random stream is keyed by the fp32 index, so the result does not depend on the chunking.
#include <cmath>

#include "device_util.cuh"
#include "longhaul/kernels/cuda/adamw.h"
#include "longhaul/kernels/cuda/check.h"

namespace longhaul::kernels::cuda {
namespace {

struct Constants {
  float lr, beta1, beta2, eps, wd, grad_scale, correction1, correction2;
  uint32_t seed;
};

Constants constants(const AdamWHyper& hyper) {
  Constants k;
  k.lr = hyper.lr;
  k.beta1 = hyper.beta1;
  k.beta2 = hyper.beta2;
  k.eps = hyper.eps;
  k.wd = hyper.weight_decay;
  k.grad_scale = hyper.grad_scale;
  k.correction1 = adamw_bias_correction(hyper.beta1, hyper.t);
  k.correction2 = adamw_bias_correction(hyper.beta2, hyper.t);
  k.seed = detail::hash32(hyper.seed);
  return k;
}

// Element i of the fp32 buffers, written to params[p].
__device__ __forceinline__ void adamw_element(bf16* params, float* master, const float* grads,
                                              float* m, float* v, long long i, long long p,
                                              float wd, const Constants& k) {
  const float g = grads[i] * k.grad_scale;
  const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
  const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float mhat = mi / k.correction1;
  const float vhat = vi / k.correction2;
  float value = master[i];
  value -= k.lr * (mhat / (sqrtf(vhat) + k.eps) + wd * value);
  master[i] = value;
  const uint32_t random = detail::hash32(static_cast<uint32_t>(i) ^ k.seed);
  params[p] = detail::round_stochastic(value, random);
}

__global__ void adamw_kernel(bf16* __restrict__ params,        // (n)
                             float* __restrict__ master,       // (n)
                             const float* __restrict__ grads,  // (n)
                             float* __restrict__ m,            // (n)
                             float* __restrict__ v,            // (n)
                             long long n, Constants k) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  adamw_element(params, master, grads, m, v, i, i, k.wd, k);
}

// One block per chunk.
__global__ void adamw_chunks_kernel(bf16* __restrict__ params,              // (P + padding)
                                    float* __restrict__ master,             // (P)
                                    const float* __restrict__ grads,        // (P)
                                    float* __restrict__ m,                  // (P)
                                    float* __restrict__ v,                  // (P)
                                    const AdamWChunk* __restrict__ chunks,  // (gridDim.x)
                                    Constants k) {
  const AdamWChunk chunk = chunks[blockIdx.x];
  const float wd = chunk.decay != 0 ? k.wd : 0.0f;
  for (int j = threadIdx.x; j < chunk.n; j += blockDim.x) {
    adamw_element(params, master, grads, m, v, chunk.offset + j, chunk.param_offset + j, wd, k);
  }
}

}  // namespace

void adamw_update(bf16* params, float* master, const float* grads, float* m, float* v, long long n,
                  const AdamWHyper& hyper, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  adamw_kernel<<<detail::ceil_div(n, threads), threads, 0, stream>>>(params, master, grads, m, v, n,
                                                                     constants(hyper));
  LH_CUDA_CHECK_LAUNCH();
}

void adamw_update_chunks(bf16* params, float* master, const float* grads, float* m, float* v,
                         const AdamWChunk* chunks, int num_chunks, const AdamWHyper& hyper,
                         cudaStream_t stream) {
  if (num_chunks == 0) return;
  adamw_chunks_kernel<<<num_chunks, 512, 0, stream>>>(params, master, grads, m, v, chunks,
                                                      constants(hyper));
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
