#include "longhaul/kernels/cpu/global_norm.h"

#include <algorithm>
#include <vector>

#include "parallel.h"

namespace longhaul::kernels::cpu {

double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kChunk = 16384;
  const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  const bool parallel = n >= kParallelMinWork;
  parallel_for(chunks, parallel, [&](int64_t begin, int64_t end) {
    for (long long k = static_cast<long long>(begin); k < end; ++k) {
      const size_t i0 = static_cast<size_t>(k) * kChunk, i1 = std::min(n, i0 + kChunk);
      double acc = 0.0;
      for (size_t i = i0; i < i1; ++i) acc += static_cast<double>(x[i]) * x[i];
      partial[static_cast<size_t>(k)] = acc;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace longhaul::kernels::cpu
