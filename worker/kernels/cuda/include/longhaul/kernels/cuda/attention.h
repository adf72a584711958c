// Causal multi-head self-attention on the GPU, two implementations with the qkv layout and math
// of kernels::cpu::attention:
//   - attention_forward/backward: cuBLASLt strided-batched products and a fused causal softmax
//     (attention.cu); any head size that is a multiple of 8; keeps the (B, NH, T, T)
//     probabilities for the backward pass.
//   - flash_attention_forward/backward: one fused flash-style kernel per direction on the tensor
//     cores (flash_attention.cu); head size 64 (every GPT-2 size); keeps only a (B, NH, T)
//     log-sum-exp, reads q/k/v from the (B, T, 3C) projection output directly.
#pragma once

#include "longhaul/kernels/cuda/matmul.h"
#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// out = attention(qkv). Saves for the backward pass: qkvr = q, k, v split into heads
// (3, B, NH, T, HS) and att = the probabilities (B, NH, T, T), zero above the diagonal.
void attention_forward(Matmul& mm, bf16* out,  // (B, T, C)
                       bf16* qkvr,             // (3, B, NH, T, HS)
                       bf16* att,              // (B, NH, T, T)
                       bf16* scratch_y,        // (B, NH, T, HS)
                       const bf16* qkv,        // (B, T, 3*C)
                       int B, int T, int C, int NH, cudaStream_t stream);

// dqkv = d(attention)/d(qkv) applied to dout (overwritten, bf16). scratch_heads holds
// 3*B*T*C bf16 (the per-head dq, dk, dv, then dout split into heads), scratch_att B*NH*T*T bf16.
void attention_backward(Matmul& mm, bf16* dqkv,  // (B, T, 3*C)
                        bf16* scratch_heads,     // (3, B, NH, T, HS) + (B, NH, T, HS)
                        bf16* scratch_att,       // (B, NH, T, T)
                        const bf16* dout,        // (B, T, C)
                        const bf16* qkvr,        // (3, B, NH, T, HS)
                        const bf16* att,         // (B, NH, T, T)
                        int B, int T, int C, int NH, cudaStream_t stream);

// bf16 elements of scratch_heads attention_backward needs.
inline long long attention_backward_scratch_heads(int B, int T, int C) { return 4LL * B * T * C; }

// Whether the flash kernels handle this shape (head size C / NH == 64).
bool flash_attention_supported(int C, int NH);

// out = attention(qkv); lse = per-row base-2 log-sum-exp of the scaled scores, for the backward.
// Both flash calls throw InvalidArgument, before launching anything, unless the head size is 64,
// B, T >= 1 and B * NH <= 65535 (the grid's y limit).
void flash_attention_forward(bf16* out,        // (B, T, C)
                             float* lse,       // (B, NH, T)
                             const bf16* qkv,  // (B, T, 3*C)
                             int B, int T, int C, int NH, cudaStream_t stream);

// dqkv = d(attention)/d(qkv) applied to dout (overwritten). out and lse are the forward's.
// Deterministic (no atomics).
void flash_attention_backward(bf16* dqkv,          // (B, T, 3*C)
                              float* scratch_dot,  // (B, NH, T)
                              const bf16* dout,    // (B, T, C)
                              const bf16* out,     // (B, T, C)
                              const bf16* qkv,     // (B, T, 3*C)
                              const float* lse,    // (B, NH, T)
                              int B, int T, int C, int NH, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
