// GELU (tanh approximation, GPT-2's gelu_new) on the GPU (see gelu.cu).
#pragma once

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// out = gelu(inp). N % 8 == 0. Also used to recompute the activation in the backward pass.
void gelu_forward(bf16* out,        // (N)
                  const bf16* inp,  // (N)
                  long long N, cudaStream_t stream);

// dinout = dinout * gelu'(inp), in place over the incoming gradient. N % 8 == 0.
void gelu_backward_inplace(bf16* dinout,     // (N)
                           const bf16* inp,  // (N) the pre-activation
                           long long N, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
