// The CUDA kernels as self-check implementations (worker/selfcheck/cuda_registry.cc): each
// uploads the case's inputs as the model would hold them (bf16 activations and parameters,
// fp32 master weights, moments and gradients), runs the kernel on `device`, and downloads the
// outputs. Preference order: attention flash (head size 64 only) then cublas; each dense-layer
// family cublaslt-epilogue then separate-kernel. In a build without CUDA the registry is empty.
#pragma once

#include "longhaul/selfcheck/selfcheck.h"

namespace longhaul::selfcheck {

Registry cuda_kernel_registry(int device = 0);

}  // namespace longhaul::selfcheck
