// GELU, tanh approximation (GPT-2's "gelu_new", torch's approximate="tanh"):
//   u = sqrt(2/pi) (x + 0.044715 x^3),  y = 0.5 x (1 + tanh(u))
// Derivative:
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
// Elementwise; parallel over N.
#pragma once

#include <cstddef>

namespace longhaul::kernels::cpu {

void gelu_forward(float* out,        // (N)
                  const float* inp,  // (N)
                  size_t N);

// Accumulates into dinp.
void gelu_backward(float* dinp,        // (N)
                   const float* inp,   // (N)
                   const float* dout,  // (N)
                   size_t N);

}  // namespace longhaul::kernels::cpu
