// Layer normalisation fused with the residual add, on the GPU (see layernorm.cu).
#pragma once

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

inline constexpr float kLayerNormEps = 1e-5f;

// residual = a + b (rounded to bf16), out = layernorm(residual) * weight + bias. With
// b == nullptr: a plain layernorm of a, and residual is not written (may be nullptr).
// mean/rstd are saved for the backward pass. C % 8 == 0.
void residual_layernorm_forward(bf16* residual,      // (N, C) or nullptr when b == nullptr
                                bf16* out,           // (N, C)
                                float* mean,         // (N)
                                float* rstd,         // (N)
                                const bf16* a,       // (N, C)
                                const bf16* b,       // (N, C) or nullptr
                                const bf16* weight,  // (C)
                                const bf16* bias,    // (C)
                                int N, int C, cudaStream_t stream);

// Floats of scratch layernorm_backward needs.
long long layernorm_backward_scratch_floats(int C);

// dinp += d(layernorm)/d(inp) applied to dout (in bf16, the sum taken in fp32); dweight and
// dbias (fp32) += their row sums, reduced deterministically through `scratch`.
// dinp may alias nothing else.
void layernorm_backward(bf16* dinp,          // (N, C)
                        float* dweight,      // (C)
                        float* dbias,        // (C)
                        float* scratch,      // layernorm_backward_scratch_floats(C)
                        const bf16* dout,    // (N, C)
                        const bf16* inp,     // (N, C)
                        const bf16* weight,  // (C)
                        const float* mean,   // (N)
                        const float* rstd,   // (N)
                        int N, int C, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
