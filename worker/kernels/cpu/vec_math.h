// Private to the CPU kernels: exp and tanh written so that `#pragma omp simd` loops vectorise
// (std::exp / std::tanh are scalar library calls without -ffast-math, and were a quarter of a
// training step in GELU alone).
//
// exp_approx: Cephes' expf scheme. x = n ln2 + r with n = round(x / ln2) (ln2 split in two
// parts so r is exact), e^r by a degree-6 polynomial on |r| <= ln2/2, then 2^n by writing the
// exponent bits. Relative error about 2e-7 (1-2 ulp); inputs are clamped to [-87.3, 88.3], so
// results are finite and positive (e^-87.3 is the smallest normal float, about 1.2e-38).
// tanh_approx: tanh(|u|) = (1 - e^{-2|u|}) / (1 + e^{-2|u|}), sign restored; absolute error
// about 1e-7.
#pragma once

#include <bit>
#include <cstdint>

namespace longhaul::kernels::cpu {

inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // Round x / ln2 to nearest with the 1.5 * 2^23 trick (exact for |value| < 2^22).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t exponent = static_cast<int32_t>(n) + 127;
  return p * std::bit_cast<float>(exponent << 23);
}

inline float tanh_approx(float u) {
  const float a = u < 0.0f ? -u : u;
  const float t = exp_approx(-2.0f * a);
  const float th = (1.0f - t) / (1.0f + t);
  return u < 0.0f ? -th : th;
}

}  // namespace longhaul::kernels::cpu
