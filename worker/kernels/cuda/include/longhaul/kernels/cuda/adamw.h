// AdamW on fp32 master weights, writing the bf16 working copy with stochastic rounding
// (see adamw.cu). Same update and the same AdamWHyper as kernels::cpu::adamw_update
// (longhaul/kernels/adamw_hyper.h); hyper.seed keys the rounding.
#pragma once

#include <longhaul/kernels/adamw_hyper.h>

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

using kernels::AdamWHyper;

// master/m/v updated in place; params = stochastic_round_bf16(master). Gradients are read only.
void adamw_update(bf16* params,        // (n) bf16 working copy
                  float* master,       // (n)
                  const float* grads,  // (n)
                  float* m,            // (n)
                  float* v,            // (n)
                  long long n, const AdamWHyper& hyper, cudaStream_t stream);

// A slice of at most kAdamWChunk elements of one tensor, for the multi-tensor update: the fp32
// buffers (master, grads, m, v) and the bf16 working copy may lay tensors out at different
// offsets (the model pads the bf16 embedding), and tensors differ in weight decay.
inline constexpr int kAdamWChunk = 65536;
struct AdamWChunk {
  long long offset = 0;        // into master/grads/m/v
  long long param_offset = 0;  // into params (bf16)
  int n = 0;                   // elements, <= kAdamWChunk
  int decay = 0;               // 1: apply hyper.weight_decay; 0: no decay
};

// One launch over every chunk (device table, one block per chunk).
void adamw_update_chunks(bf16* params,              // bf16 working copy
                         float* master,             // fp32 master weights
                         const float* grads,        // fp32, master's layout
                         float* m,                  // fp32, master's layout
                         float* v,                  // fp32, master's layout
                         const AdamWChunk* chunks,  // (num_chunks) device
                         int num_chunks, const AdamWHyper& hyper, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
