#include "longhaul/kernels/cpu/matmul.h"

#include <algorithm>
#include <cstddef>

#include <cblas.h>

#include "parallel_config.h"

namespace longhaul::kernels::cpu {
namespace {

// db[oc] += sum_rows dout[:, oc]; output-channel blocks are owned by one thread each.
void bias_backward(float* dbias, const float* dout, int N, int OC) {
  constexpr int kBlock = 64;
  const int blocks = (OC + kBlock - 1) / kBlock;
  const bool parallel = static_cast<size_t>(N) * OC >= kParallelMinWork;
#pragma omp parallel for schedule(static) if (parallel)
  for (int blk = 0; blk < blocks; ++blk) {
    const int o0 = blk * kBlock, o1 = std::min(OC, o0 + kBlock);
    float acc[kBlock] = {};
    for (int i = 0; i < N; ++i) {
      const float* d = dout + static_cast<size_t>(i) * OC;
      for (int o = o0; o < o1; ++o) acc[o - o0] += d[o];
    }
    for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    const bool parallel = static_cast<size_t>(N) * OC >= kParallelMinWork;
#pragma omp parallel for schedule(static) if (parallel)
    for (int i = 0; i < N; ++i) std::copy(bias, bias + OC, out + static_cast<size_t>(i) * OC);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, beta,
              out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC, 1.0f,
                dinp, C);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f,
              dweight, OC);
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

void matmul_nt_forward(float* out, const float* inp, const float* weight, int N, int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out,
              OC);
}

void matmul_nt_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, int N, int C, int OC) {
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
}

}  // namespace longhaul::kernels::cpu
