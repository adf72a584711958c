// Bias add over the rows of a GEMM output, the separate-kernel fallback for cuBLASLt's BIAS
// epilogue (matmul.cc, used when the start-up self-check finds the epilogue wrong on this GPU).
//
// Math: out[i, j] += bias[j], computed in fp32 and rounded once to bf16. Against the fused
// epilogue (which rounds the GEMM's fp32 accumulator + bias once) this rounds twice, an extra
// error of at most half a bf16 ulp, inside the bf16 tolerance of the kernel tests.
//
// Memory: one read and one write of the (N, OC) output, 16-byte vectors (8 bf16): OC % 8 == 0
// and 16-byte aligned rows (the model's buffers are 256-byte aligned and OC is a multiple of C).
// A grid-stride loop over N * OC / 8 vectors; the bias vector stays in L1/L2.
#include <algorithm>

#include "device_util.cuh"
#include "longhaul/kernels/cuda/bias_add.h"
#include "longhaul/kernels/cuda/check.h"

namespace longhaul::kernels::cuda {
namespace {

__global__ void add_bias_rows_kernel(bf16* out,         // (N, OC)
                                     const bf16* bias,  // (OC)
                                     long long vectors, int OC) {
  const int per_row = OC / 8;
  for (long long v = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int column = static_cast<int>(v % per_row) * 8;
    const detail::Pack8 o = detail::load8(out + v * 8);
    const detail::Pack8 b = detail::load8(bias + column);
    detail::Pack8 r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      r.v[k] = __float2bfloat16_rn(__bfloat162float(o.v[k]) + __bfloat162float(b.v[k]));
    }
    detail::store8(out + v * 8, r);
  }
}

}  // namespace

void add_bias_rows(bf16* out, const bf16* bias, int N, int OC, cudaStream_t stream) {
  const long long vectors = static_cast<long long>(N) * OC / 8;
  if (vectors == 0) return;
  const int threads = 256;
  const long long blocks = std::min<long long>((vectors + threads - 1) / threads, 65536);
  add_bias_rows_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(out, bias, vectors,
                                                                              OC);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
