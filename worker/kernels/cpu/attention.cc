#include "longhaul/kernels/cpu/attention.h"

#include <cmath>
#include <cstddef>

#include "parallel.h"

namespace longhaul::kernels::cpu {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(3) * C;
  const bool parallel = static_cast<size_t>(B) * T * T * C >= kParallelMinWork;
  parallel_for(B * NH, parallel, [&](int64_t begin, int64_t end) {
    for (int bh = static_cast<int>(begin); bh < end; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const float* base = qkv + static_cast<size_t>(b) * T * C3;
      for (int t = 0; t < T; ++t) {
        const float* q = base + t * C3 + h * hs;
        float* a = att + (static_cast<size_t>(bh) * T + t) * T;
        float maxval = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          const float* k = base + s * C3 + C + h * hs;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          a[s] = dot;
          if (dot > maxval) maxval = dot;
        }
        float sum = 0.0f;
        for (int s = 0; s <= t; ++s) {
          const float e = std::exp(a[s] - maxval);
          a[s] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (int s = 0; s <= t; ++s) a[s] *= inv;
        for (int s = t + 1; s < T; ++s) a[s] = 0.0f;

        float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int s = 0; s <= t; ++s) {
          const float* v = base + s * C3 + 2 * C + h * hs;
          const float w = a[s];
#pragma omp simd
          for (int i = 0; i < hs; ++i) o[i] += w * v[i];
        }
      }
    }
  });
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(3) * C;
  const bool parallel = static_cast<size_t>(B) * T * T * C >= kParallelMinWork;
  parallel_for(B * NH, parallel, [&](int64_t begin, int64_t end) {
    for (int bh = static_cast<int>(begin); bh < end; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const float* base = qkv + static_cast<size_t>(b) * T * C3;
      float* dbase = dqkv + static_cast<size_t>(b) * T * C3;
      for (int t = 0; t < T; ++t) {
        const float* a = att + (static_cast<size_t>(bh) * T + t) * T;
        float* da = datt + (static_cast<size_t>(bh) * T + t) * T;
        const float* d = dout + (static_cast<size_t>(b) * T + t) * C + h * hs;
        // da[s] = dout_t . v_s and dv_s += a[t,s] dout_t
        float adot = 0.0f;
        for (int s = 0; s <= t; ++s) {
          const float* v = base + s * C3 + 2 * C + h * hs;
          float* dv = dbase + s * C3 + 2 * C + h * hs;
          const float w = a[s];
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) {
            dot += d[i] * v[i];
            dv[i] += w * d[i];
          }
          da[s] = dot;
          adot += w * dot;
        }
        // softmax backward and the q.k product backward
        const float* q = base + t * C3 + h * hs;
        float* dq = dbase + t * C3 + h * hs;
        for (int s = 0; s <= t; ++s) {
          const float dz = a[s] * (da[s] - adot) * scale;
          const float* k = base + s * C3 + C + h * hs;
          float* dk = dbase + s * C3 + C + h * hs;
#pragma omp simd
          for (int i = 0; i < hs; ++i) {
            dq[i] += dz * k[i];
            dk[i] += dz * q[i];
          }
        }
      }
    }
  });
}

}  // namespace longhaul::kernels::cpu
