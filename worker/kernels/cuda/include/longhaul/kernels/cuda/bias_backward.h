// Deterministic column sums for bias gradients (see bias_backward.cu).
#pragma once

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

long long bias_backward_scratch_floats(int OC);

// dbias += sum over the N rows of dout, in a fixed order (bit-identical across runs).
void bias_backward(float* dbias,      // (OC)
                   float* scratch,    // bias_backward_scratch_floats(OC)
                   const bf16* dout,  // (N, OC)
                   int N, int OC, cudaStream_t stream);

// dst += src, elementwise.
void add_inplace(float* dst,        // (n)
                 const float* src,  // (n)
                 long long n, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
