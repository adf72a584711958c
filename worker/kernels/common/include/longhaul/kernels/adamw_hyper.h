// AdamW's settings, said once for both optimizers (kernels::cpu::adamw_update and
// kernels::cuda::adamw_update / adamw_update_chunks) and for the model API
// (model::AdamWOptions is AdamWOptions).
//
// AdamW (Loshchilov & Hutter) as torch.optim.AdamW computes it: Adam with decoupled weight decay
// applied to the pre-update parameter and bias-corrected moments. With g = grad * grad_scale
// (grad_scale < 1 implements global-norm clipping) and step t >= 1:
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
//   param -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param)
#pragma once

#include <cmath>
#include <cstdint>

namespace longhaul::kernels {

// The run's settings; the defaults are GPT-2 / nanoGPT's. Which tensors get weight decay is the
// model's choice (GPT-2: 2-D tensors only, see model::is_weight_decayed).
struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// One update: the run's settings plus what changes per step.
struct AdamWHyper : AdamWOptions {
  float lr = 0.0f;
  float grad_scale = 1.0f;  // multiplies the gradient (global-norm clipping, accumulation)
  int64_t t = 1;            // the step being taken, 1-based, for bias correction
  // The stochastic-rounding stream of a bf16 working copy (CUDA; vary it per step for unbiased
  // rounding). The fp32 CPU update does not round and ignores it.
  uint32_t seed = 0;
};

// The hyper-parameters of step t (1-based) of a run with `options`.
inline AdamWHyper adamw_step(const AdamWOptions& options, float lr, float grad_scale, int64_t t) {
  AdamWHyper hyper;
  static_cast<AdamWOptions&>(hyper) = options;
  hyper.lr = lr;
  hyper.grad_scale = grad_scale;
  hyper.t = t;
  return hyper;
}

// 1 - beta^t, computed in double once per step and used in fp32 by both updates.
inline float adamw_bias_correction(float beta, int64_t t) {
  return 1.0f - static_cast<float>(std::pow(static_cast<double>(beta), static_cast<double>(t)));
}

}  // namespace longhaul::kernels
