// Fused softmax + cross-entropy over the vocabulary, for the classifier.
//
// Per row i with logits z (V values) and target y:
//   m = max z,  lse = m + log(sum exp(z - m))       (numerically stable)
//   p = exp(z - lse),  loss_i = lse - z_y
//   dz = dloss * (p - onehot(y))
// The backward result is written IN PLACE over the logits (dlogits overwrite logits; the
// probabilities are never stored separately), so the classifier needs one (N, V) buffer.
// dloss is the gradient of the total objective w.r.t. each loss_i (for a mean over N positions
// with gradient accumulation over k micro-batches: 1 / (N * k)).
//
// Targets must lie in [0, V); the caller validates. Parallel over rows.
#pragma once

#include <cstdint>

namespace longhaul::kernels::cpu {

// Loss only; logits are left unchanged.
void crossentropy_forward(float* losses,           // (N)
                          const float* logits,     // (N, V)
                          const int32_t* targets,  // (N)
                          int N, int V);

// Loss and gradient: logits (N, V) are replaced by dlogits = dloss * (softmax - onehot).
void crossentropy_forward_backward(float* losses,           // (N)
                                   float* logits,           // (N, V) in: logits, out: dlogits
                                   const int32_t* targets,  // (N)
                                   float dloss, int N, int V);

}  // namespace longhaul::kernels::cpu
