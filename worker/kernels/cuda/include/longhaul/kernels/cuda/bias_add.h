// The bias add as its own kernel (see bias_add.cu): the fallback for cuBLASLt's BIAS epilogue.
#pragma once

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// out[i, j] = bf16(out[i, j] + bias[j]) (the sum in fp32). OC % 8 == 0.
void add_bias_rows(bf16* out,         // (N, OC)
                   const bf16* bias,  // (OC)
                   int N, int OC, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
