// Precision conversion of whole buffers (see cast.cu).
#pragma once

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// out[i] = round_to_nearest_even_bf16(inp[i]): the bf16 working copy of fp32 master weights
// after initialisation or a checkpoint restore.
void cast_to_bf16(bf16* out,         // (n)
                  const float* inp,  // (n)
                  long long n, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
