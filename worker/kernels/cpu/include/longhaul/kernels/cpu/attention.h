// Causal multi-head self-attention on a fused qkv tensor, as in GPT-2.
//
// Layout: qkv[b,t,:] = [q (C) | k (C) | v (C)], head h uses channels [h*hs, (h+1)*hs) of each
// part, hs = C / NH (Hugging Face's c_attn split). out[b,t,h*hs:(h+1)*hs] is head h's output.
//
// Forward, per (b,h), query t, keys s <= t, scale = 1/sqrt(hs):
//   a[t,s] = softmax_s(scale * q_t . k_s)        (max-subtracted; a[t,s] = 0 for s > t)
//   out_t  = sum_s a[t,s] v_s
// att keeps the probabilities (B,NH,T,T) for the backward pass.
//
// Backward, per (b,h,t):
//   da[t,s]  = dout_t . v_s                     dv_s += a[t,s] dout_t
//   dz[t,s]  = a[t,s] (da[t,s] - sum_j a[t,j] da[t,j])          (softmax backward)
//   dq_t    += scale sum_s dz[t,s] k_s          dk_s += scale dz[t,s] q_t
//
// Computation: per (b,h), the four products (q k^T, a v, and in backward dout v^T, a^T dout,
// dz k, dz^T q) are single-threaded OpenBLAS sgemms on strided views of qkv; softmax and its
// backward are row loops in between. Parallelism: over the B*NH (b,h) pairs, each writing a
// disjoint slice of out/dqkv, so the result is deterministic for any thread count. datt is
// scratch (on return it holds dz, the gradient of the pre-softmax scores); it is sized like att
// so a GPU backend can use the same contract. exp is vec_math.h's exp_approx (~2e-7 relative).
#pragma once

namespace longhaul::kernels::cpu {

void attention_forward(float* out,        // (B, T, C)
                       float* att,        // (B, NH, T, T)
                       const float* qkv,  // (B, T, 3*C)
                       int B, int T, int C, int NH);

// Accumulates into dqkv.
void attention_backward(float* dqkv,        // (B, T, 3*C)
                        float* datt,        // (B, NH, T, T) scratch
                        const float* dout,  // (B, T, C)
                        const float* qkv,   // (B, T, 3*C)
                        const float* att,   // (B, NH, T, T)
                        int B, int T, int C, int NH);

}  // namespace longhaul::kernels::cpu
