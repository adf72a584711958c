// Token + position embedding (GPT-2's first operation).
//
// Math: out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].
// Backward: dwte[v,:] += sum over (b,t) with tokens[b,t] == v of dout[b,t,:];
//           dwpe[t,:] += sum over b of dout[b,t,:].
//
// The backward scatter is made deterministic and race-free without atomics by partitioning the
// *channels* among threads: each thread owns a slice of C and walks every (b,t) in order, so
// the summation order is fixed whatever the thread count.
//
// Tokens must lie in [0, V) and T must not exceed wpe's rows; the caller validates (the model
// checks tokens before calling), the kernel does not.
#pragma once

#include <cstdint>

namespace longhaul::kernels::cpu {

void encoder_forward(float* out,             // (B, T, C)
                     const int32_t* tokens,  // (B, T)
                     const float* wte,       // (V, C)
                     const float* wpe,       // (maxT, C), maxT >= T
                     int B, int T, int C);

// Accumulates into dwte and dwpe.
void encoder_backward(float* dwte,            // (V, C)
                      float* dwpe,            // (maxT, C)
                      const float* dout,      // (B, T, C)
                      const int32_t* tokens,  // (B, T)
                      int B, int T, int C);

}  // namespace longhaul::kernels::cpu
