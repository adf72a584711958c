#include "longhaul/kernels/cpu/attention.h"

#include <cmath>
#include <cstddef>

#include <cblas.h>

#include "parallel.h"
#include "vec_math.h"

namespace longhaul::kernels::cpu {

// Per (b, h) the products are single-threaded sgemms on strided views of qkv (row stride 3C),
// run in parallel over the B*NH pairs. The score product computes the full T x T square
// (the masked upper triangle is overwritten with zeros), which costs 2x the causal flops but
// runs at BLAS speed.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int C3 = 3 * C;
  const bool parallel = static_cast<size_t>(B) * T * T * C >= kParallelMinWork;
  parallel_for(B * NH, parallel, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int b = static_cast<int>(bh) / NH, h = static_cast<int>(bh) % NH;
      const float* q = qkv + static_cast<size_t>(b) * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + static_cast<size_t>(bh) * T * T;
      // scores = scale * q k^T   (T, T)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a,
                  T);
      for (int t = 0; t < T; ++t) {
        float* row = a + static_cast<size_t>(t) * T;
        float maxval = row[0];
        for (int s = 1; s <= t; ++s) maxval = row[s] > maxval ? row[s] : maxval;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int s = 0; s <= t; ++s) {
          const float e = exp_approx(row[s] - maxval);
          row[s] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int s = 0; s <= t; ++s) row[s] *= inv;
        for (int s = t + 1; s < T; ++s) row[s] = 0.0f;
      }
      // out_h = att v   (T, hs), row stride C
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f,
                  out + static_cast<size_t>(b) * T * C + h * hs, C);
    }
  });
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int C3 = 3 * C;
  const bool parallel = static_cast<size_t>(B) * T * T * C >= kParallelMinWork;
  parallel_for(B * NH, parallel, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int b = static_cast<int>(bh) / NH, h = static_cast<int>(bh) % NH;
      const size_t offset = static_cast<size_t>(b) * T * C3 + h * hs;
      const float *q = qkv + offset, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + offset, *dk = dq + C, *dv = dq + 2 * C;
      const float* a = att + static_cast<size_t>(bh) * T * T;
      float* da = datt + static_cast<size_t>(bh) * T * T;
      const float* d = dout + static_cast<size_t>(b) * T * C + h * hs;
      // da = dout_h v^T   (T, T);   dv += att^T dout_h   (T, hs)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f, da,
                  T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 1.0f, dv,
                  C3);
      // softmax backward in place: dz = scale * a * (da - sum_j a_j da_j); zero above the
      // diagonal because a is.
      for (int t = 0; t < T; ++t) {
        const float* arow = a + static_cast<size_t>(t) * T;
        float* drow = da + static_cast<size_t>(t) * T;
        float adot = 0.0f;
#pragma omp simd reduction(+ : adot)
        for (int s = 0; s <= t; ++s) adot += arow[s] * drow[s];
#pragma omp simd
        for (int s = 0; s <= t; ++s) drow[s] = scale * arow[s] * (drow[s] - adot);
        for (int s = t + 1; s < T; ++s) drow[s] = 0.0f;
      }
      // dq += dz k   (T, hs);   dk += dz^T q   (T, hs)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, k, C3, 1.0f, dq,
                  C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, C3, 1.0f, dk,
                  C3);
    }
  });
}

}  // namespace longhaul::kernels::cpu
