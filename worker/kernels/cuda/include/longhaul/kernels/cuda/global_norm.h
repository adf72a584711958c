// Deterministic device reductions: the squared global gradient norm and plain sums (losses),
// see global_norm.cu.
#pragma once

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// Floats of scratch the reductions need.
long long reduction_scratch_floats();

// *out = sum_i x[i]^2, in a fixed order (bit-identical across runs and GPUs). `out` is device
// memory; the host reads it after synchronising.
void sum_of_squares(float* out,      // (1)
                    float* scratch,  // reduction_scratch_floats()
                    const float* x,  // (n)
                    long long n, cudaStream_t stream);

// *out = sum_i x[i], same order guarantees.
void sum(float* out,      // (1)
         float* scratch,  // reduction_scratch_floats()
         const float* x,  // (n)
         long long n, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
