#include "longhaul/kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "parallel.h"

namespace longhaul::kernels::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  const bool parallel = static_cast<size_t>(N) * C >= kParallelMinWork;
  parallel_for(N, parallel, [&](int64_t begin, int64_t end) {
    for (int i = static_cast<int>(begin); i < end; ++i) {
      const float* x = inp + static_cast<size_t>(i) * C;
      float* o = out + static_cast<size_t>(i) * C;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int c = 0; c < C; ++c) sum += x[c];
      const float m = sum / C;
      float var = 0.0f;
#pragma omp simd reduction(+ : var)
      for (int c = 0; c < C; ++c) {
        const float d = x[c] - m;
        var += d * d;
      }
      const float s = 1.0f / std::sqrt(var / C + kLayerNormEps);
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[i] = m;
      rstd[i] = s;
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  constexpr int kBlock = 16;
  const int blocks = (C + kBlock - 1) / kBlock;
  const bool parallel = static_cast<size_t>(N) * C >= kParallelMinWork;
  // dinp: rows are independent.
  parallel_for(N, parallel, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* x = inp + static_cast<size_t>(i) * C;
      const float* d = dout + static_cast<size_t>(i) * C;
      float* dx = dinp + static_cast<size_t>(i) * C;
      const float m = mean[i], s = rstd[i];
      float gmean = 0.0f, gnmean = 0.0f;
#pragma omp simd reduction(+ : gmean, gnmean)
      for (int c = 0; c < C; ++c) {
        const float n = (x[c] - m) * s;
        const float g = d[c] * weight[c];
        gmean += g;
        gnmean += g * n;
      }
      gmean /= C;
      gnmean /= C;
      for (int c = 0; c < C; ++c) {
        const float n = (x[c] - m) * s;
        const float g = d[c] * weight[c];
        dx[c] += s * (g - gmean - n * gnmean);
      }
    }
  });
  // dweight, dbias: each channel block is reduced over all rows by one thread, in row order.
  parallel_for(blocks, parallel, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int c0 = static_cast<int>(blk) * kBlock, c1 = std::min(C, c0 + kBlock);
      float dw[kBlock] = {}, db[kBlock] = {};
      for (int i = 0; i < N; ++i) {
        const float* x = inp + static_cast<size_t>(i) * C;
        const float* d = dout + static_cast<size_t>(i) * C;
        const float m = mean[i], s = rstd[i];
        for (int c = c0; c < c1; ++c) {
          dw[c - c0] += d[c] * (x[c] - m) * s;
          db[c - c0] += d[c];
        }
      }
      for (int c = c0; c < c1; ++c) {
        dweight[c] += dw[c - c0];
        dbias[c] += db[c - c0];
      }
    }
  });
}

}  // namespace longhaul::kernels::cpu
