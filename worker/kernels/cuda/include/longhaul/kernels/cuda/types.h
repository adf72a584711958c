// Element types and shared constants of the CUDA backend.
//
// Parameters and activations are bf16 (`bf16`); master weights, optimizer moments, parameter
// gradients, layernorm statistics and losses are fp32. Every kernel accumulates in fp32.
//
// Host-compilable: included by plain C++ (g++) translation units of the model and tests.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace longhaul::kernels::cuda {

using bf16 = __nv_bfloat16;

// Rows of scratch partial sums used by the deterministic column reductions (layernorm weight
// gradients, bias gradients): each of these row-chunks sums a fixed slice of the rows, then the
// chunks are added in chunk order. Fixed (not derived from the GPU) so results are the same on
// every GPU model.
inline constexpr int kReductionChunks = 64;

// Converts on the host (round to nearest even), for tests and initialisation.
inline float bf16_to_float(bf16 x) { return __bfloat162float(x); }
inline bf16 float_to_bf16(float x) { return __float2bfloat16_rn(x); }

}  // namespace longhaul::kernels::cuda
