// Bias gradients: dbias[c] += sum over rows of dout[row, c].
//
// A column reduction of an (N, OC) bf16 matrix. Atomic adds would sum in a different order
// every run; instead two fixed-order stages: kReductionChunks row chunks, each thread owning
// one column of one chunk and walking its rows in order (reads coalesced along OC), write
// partial sums to scratch (chunks, OC); then one thread per column adds the chunks in order.
// Extra traffic: chunks * OC floats, negligible next to N * OC bf16 reads.
//
// The dense layers use cuBLASLt's BGRADA epilogue when it has an algorithm for the shape (the
// reduction then happens inside the weight-gradient GEMM, which already streams dout); this
// kernel is the fallback, and the reference the epilogue path is tested against.
#include "device_util.cuh"
#include "longhaul/kernels/cuda/bias_backward.h"
#include "longhaul/kernels/cuda/check.h"

namespace longhaul::kernels::cuda {
namespace {

// grid (ceil(OC / blockDim.x), kReductionChunks).
__global__ void bias_partial_kernel(float* __restrict__ scratch,    // (chunks, OC)
                                    const bf16* __restrict__ dout,  // (N, OC)
                                    int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= OC) return;
  const int rows_per_chunk = (N + kReductionChunks - 1) / kReductionChunks;
  const int begin = chunk * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float sum = 0.0f;
  for (int row = begin; row < end; ++row) {
    sum += __bfloat162float(dout[static_cast<long long>(row) * OC + c]);
  }
  scratch[static_cast<long long>(chunk) * OC + c] = sum;
}

__global__ void bias_finish_kernel(float* __restrict__ dbias,          // (OC)
                                   const float* __restrict__ scratch,  // (chunks, OC)
                                   int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float sum = 0.0f;
  for (int chunk = 0; chunk < kReductionChunks; ++chunk) {
    sum += scratch[static_cast<long long>(chunk) * OC + c];
  }
  dbias[c] += sum;
}

__global__ void add_inplace_kernel(float* __restrict__ dst,        // (n)
                                   const float* __restrict__ src,  // (n)
                                   long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

}  // namespace

long long bias_backward_scratch_floats(int OC) {
  return static_cast<long long>(kReductionChunks) * OC;
}

void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                   cudaStream_t stream) {
  const int threads = 256;
  const dim3 grid(detail::ceil_div(OC, threads), kReductionChunks);
  bias_partial_kernel<<<grid, threads, 0, stream>>>(scratch, dout, N, OC);
  LH_CUDA_CHECK_LAUNCH();
  bias_finish_kernel<<<detail::ceil_div(OC, threads), threads, 0, stream>>>(dbias, scratch, OC);
  LH_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* dst, const float* src, long long n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  add_inplace_kernel<<<detail::ceil_div(n, threads), threads, 0, stream>>>(dst, src, n);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
