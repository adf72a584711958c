#include "longhaul/kernels/cpu/gelu.h"

#include "parallel.h"
#include "vec_math.h"

namespace longhaul::kernels::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, size_t N) {
  parallel_for(static_cast<int64_t>(N), N >= kParallelMinWork, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float x = inp[i];
      const float u = kSqrt2OverPi * (x + kCoeff * x * x * x);
      out[i] = 0.5f * x * (1.0f + tanh_approx(u));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
  parallel_for(static_cast<int64_t>(N), N >= kParallelMinWork, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float x = inp[i];
      const float u = kSqrt2OverPi * (x + kCoeff * x * x * x);
      const float th = tanh_approx(u);
      const float sech2 = 1.0f - th * th;
      const float grad =
          0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCoeff * x * x);
      dinp[i] += grad * dout[i];
    }
  });
}

}  // namespace longhaul::kernels::cpu
