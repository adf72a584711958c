// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, bias-corrected moments.
//
// With g = grad * grad_scale (grad_scale < 1 implements global-norm clipping) and step t >= 1:
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
//   param -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param)
// This is torch.optim.AdamW's update (decay applied to the pre-update parameter). The caller
// chooses weight_decay per tensor; the GPT-2 model decays only 2-D weights (embeddings and
// matmul weights) and passes 0 for biases and layernorm parameters.
//
// Elementwise; parallel over n. Gradients are read, not modified.
#pragma once

#include <cstddef>
#include <cstdint>

namespace longhaul::kernels::cpu {

struct AdamWHyper {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int64_t t = 1;  // the step being taken, 1-based, for bias correction
};

void adamw_update(float* params,       // (n)
                  const float* grads,  // (n)
                  float* m,            // (n) first moment
                  float* v,            // (n) second moment
                  size_t n, const AdamWHyper& hyper);

}  // namespace longhaul::kernels::cpu
