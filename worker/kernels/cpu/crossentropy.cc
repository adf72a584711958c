#include "longhaul/kernels/cpu/crossentropy.h"

#include <cmath>
#include <cstddef>

#include "parallel.h"

namespace longhaul::kernels::cpu {
namespace {

// log(sum(exp(z))) = max + log_sum, returned in two parts so that callers can form
// z_j - lse as (z_j - max) - log_sum without cancelling two large numbers.
struct LogSumExp {
  float max;
  float log_sum;
};
LogSumExp log_sum_exp(const float* z, int V) {
  float maxval = -INFINITY;
  for (int j = 0; j < V; ++j) maxval = z[j] > maxval ? z[j] : maxval;
  float sum = 0.0f;
  for (int j = 0; j < V; ++j) sum += std::exp(z[j] - maxval);
  return {maxval, std::log(sum)};
}

}  // namespace

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                          int V) {
  const bool parallel = static_cast<size_t>(N) * V >= kParallelMinWork;
  parallel_for(N, parallel, [&](int64_t begin, int64_t end) {
    for (int i = static_cast<int>(begin); i < end; ++i) {
      const float* z = logits + static_cast<size_t>(i) * V;
      const LogSumExp lse = log_sum_exp(z, V);
      losses[i] = (lse.max - z[targets[i]]) + lse.log_sum;
    }
  });
}

void crossentropy_forward_backward(float* losses, float* logits, const int32_t* targets,
                                   float dloss, int N, int V) {
  const bool parallel = static_cast<size_t>(N) * V >= kParallelMinWork;
  parallel_for(N, parallel, [&](int64_t begin, int64_t end) {
    for (int i = static_cast<int>(begin); i < end; ++i) {
      float* z = logits + static_cast<size_t>(i) * V;
      const int y = targets[i];
      const LogSumExp lse = log_sum_exp(z, V);
      losses[i] = (lse.max - z[y]) + lse.log_sum;
      for (int j = 0; j < V; ++j) z[j] = std::exp((z[j] - lse.max) - lse.log_sum) * dloss;
      z[y] -= dloss;
    }
  });
}

}  // namespace longhaul::kernels::cpu
