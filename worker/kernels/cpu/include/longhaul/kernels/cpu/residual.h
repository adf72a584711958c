// Residual connection: out = a + b. The gradient passes unchanged to both inputs:
// da += dout, db += dout. Elementwise; parallel over N. dinp1 and dinp2 may alias each other
// (then dout is added twice) but not dout.
#pragma once

#include <cstddef>

namespace longhaul::kernels::cpu {

void residual_forward(float* out,         // (N)
                      const float* inp1,  // (N)
                      const float* inp2,  // (N)
                      size_t N);

// Accumulates. Either gradient pointer may be nullptr.
void residual_backward(float* dinp1,       // (N) or nullptr
                       float* dinp2,       // (N) or nullptr
                       const float* dout,  // (N)
                       size_t N);

}  // namespace longhaul::kernels::cpu
