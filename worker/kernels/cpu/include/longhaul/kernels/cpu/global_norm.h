// Sum of squares of a vector, for the global L2 gradient norm: norm = sqrt(sum over all
// gradient tensors of sum_i g_i^2).
//
// Accumulates in double over fixed 16384-element chunks whose partial sums are then added in
// chunk order, so the result is bit-identical for any thread count.
#pragma once

#include <cstddef>

namespace longhaul::kernels::cpu {

double sum_of_squares(const float* x,  // (n)
                      size_t n);

}  // namespace longhaul::kernels::cpu
