// Layer normalisation over the last dimension, eps = 1e-5 (GPT-2 / torch default).
//
// Forward, per row x (C values):
//   mean = sum(x)/C,  var = sum((x-mean)^2)/C (biased),  rstd = 1/sqrt(var + eps)
//   n = (x - mean) * rstd,  out = n * weight + bias
// mean and rstd are saved for the backward pass.
//
// Backward, with g = dout * weight:
//   dbias   += sum_rows dout
//   dweight += sum_rows dout * n
//   dinp    += rstd * (g - mean(g) - n * mean(g * n))
// (the last line is the derivative of the normalisation through mean and var; see e.g. llm.c's
// layernorm derivation). dweight/dbias are reduced with channels partitioned among threads, so
// the summation order is fixed and the result bit-identical for any thread count.
#pragma once

namespace longhaul::kernels::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

void layernorm_forward(float* out,           // (N, C)
                       float* mean,          // (N)
                       float* rstd,          // (N)
                       const float* inp,     // (N, C)
                       const float* weight,  // (C)
                       const float* bias,    // (C)
                       int N, int C);

// Accumulates into dinp, dweight and dbias.
void layernorm_backward(float* dinp,          // (N, C)
                        float* dweight,       // (C)
                        float* dbias,         // (C)
                        const float* dout,    // (N, C)
                        const float* inp,     // (N, C)
                        const float* weight,  // (C)
                        const float* mean,    // (N)
                        const float* rstd,    // (N)
                        int N, int C);

}  // namespace longhaul::kernels::cpu
