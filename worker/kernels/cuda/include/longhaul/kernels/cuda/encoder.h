// Token + position embedding on the GPU (see encoder.cu for the math and memory choices).
#pragma once

#include <cstdint>
#include <vector>

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. C % 8 == 0.
void encoder_forward(bf16* out,              // (B, T, C)
                     const int32_t* tokens,  // (B, T) device
                     const bf16* wte,        // (Vp, C)
                     const bf16* wpe,        // (maxT, C)
                     int B, int T, int C, cudaStream_t stream);

// The tokens of a micro-batch grouped by value, built on the host before the backward pass so
// the token-embedding gradient is a deterministic gather instead of an atomic scatter:
// positions[offsets[u] .. offsets[u+1]) are the (b*T+t) indices, ascending, holding token
// unique_tokens[u].
struct TokenBuckets {
  std::vector<int32_t> unique_tokens;  // (U)
  std::vector<int32_t> offsets;        // (U + 1)
  std::vector<int32_t> positions;      // (B*T)
};
TokenBuckets bucket_tokens(const int32_t* tokens, int n);  // tokens (n) host

// dwte[v,:] += sum of dout rows holding token v; dwpe[t,:] += sum_b dout[b,t,:]. Fixed summation
// order (ascending positions, ascending b): bit-identical across runs.
void encoder_backward(float* dwte,                    // (Vp, C)
                      float* dwpe,                    // (maxT, C)
                      const bf16* dout,               // (B, T, C)
                      const int32_t* unique_tokens,   // (U) device, from bucket_tokens
                      const int32_t* bucket_offsets,  // (U + 1) device
                      const int32_t* positions,       // (B*T) device
                      int num_unique, int B, int T, int C, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
