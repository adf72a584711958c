#include "longhaul/kernels/cpu/adamw.h"

#include <cmath>

#include "parallel.h"

namespace longhaul::kernels::cpu {

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                  const AdamWHyper& hyper) {
  const float b1 = hyper.beta1, b2 = hyper.beta2;
  const float c1 = adamw_bias_correction(b1, hyper.t);
  const float c2 = adamw_bias_correction(b2, hyper.t);
  const float lr = hyper.lr, eps = hyper.eps, wd = hyper.weight_decay, gs = hyper.grad_scale;
  const long long count = static_cast<long long>(n);
  const bool parallel = n >= kParallelMinWork;
  parallel_for(count, parallel, [&](int64_t begin, int64_t end) {
    for (long long i = static_cast<long long>(begin); i < end; ++i) {
      const float g = grads[i] * gs;
      const float mi = b1 * m[i] + (1.0f - b1) * g;
      const float vi = b2 * v[i] + (1.0f - b2) * g * g;
      m[i] = mi;
      v[i] = vi;
      const float mhat = mi / c1;
      const float vhat = vi / c2;
      params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * params[i]);
    }
  });
}

}  // namespace longhaul::kernels::cpu
