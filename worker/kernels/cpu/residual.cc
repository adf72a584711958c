#include "longhaul/kernels/cpu/residual.h"

#include "parallel.h"

namespace longhaul::kernels::cpu {

void residual_forward(float* out, const float* inp1, const float* inp2, size_t N) {
  const long long n = static_cast<long long>(N);
  const bool parallel = N >= kParallelMinWork;
  parallel_for(n, parallel, [&](int64_t begin, int64_t end) {
    for (long long i = static_cast<long long>(begin); i < end; ++i) out[i] = inp1[i] + inp2[i];
  });
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, size_t N) {
  const long long n = static_cast<long long>(N);
  if (dinp1 != nullptr) {
    const bool parallel = N >= kParallelMinWork;
    parallel_for(n, parallel, [&](int64_t begin, int64_t end) {
      for (long long i = static_cast<long long>(begin); i < end; ++i) dinp1[i] += dout[i];
    });
  }
  if (dinp2 != nullptr) {
    const bool parallel = N >= kParallelMinWork;
    parallel_for(n, parallel, [&](int64_t begin, int64_t end) {
      for (long long i = static_cast<long long>(begin); i < end; ++i) dinp2[i] += dout[i];
    });
  }
}

}  // namespace longhaul::kernels::cpu
