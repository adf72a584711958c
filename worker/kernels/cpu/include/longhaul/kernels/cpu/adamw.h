// AdamW in fp32 on the host: the update of longhaul/kernels/adamw_hyper.h, whose AdamWHyper
// both backends share (hyper.seed is not used: nothing is rounded). The caller chooses
// weight_decay per tensor; the GPT-2 model decays only 2-D weights (embeddings and matmul
// weights) and passes 0 for biases and layernorm parameters.
//
// Elementwise; parallel over n. Gradients are read, not modified.
#pragma once

#include <cstddef>

#include <longhaul/kernels/adamw_hyper.h>

namespace longhaul::kernels::cpu {

using kernels::AdamWHyper;

void adamw_update(float* params,       // (n)
                  const float* grads,  // (n)
                  float* m,            // (n) first moment
                  float* v,            // (n) second moment
                  size_t n, const AdamWHyper& hyper);

}  // namespace longhaul::kernels::cpu
