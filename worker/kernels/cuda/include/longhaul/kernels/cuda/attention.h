// Causal multi-head self-attention on the GPU: cuBLASLt strided-batched products and a fused
// causal softmax (see attention.cu). Same qkv layout and math as kernels::cpu::attention.
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

}  // namespace longhaul::kernels::cuda
