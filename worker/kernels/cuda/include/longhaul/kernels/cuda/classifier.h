// The fused classifier: softmax + cross-entropy + dlogits in one kernel (see classifier.cu).
#pragma once

#include <cstdint>

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

// Per row i: losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]. With
// write_dlogits, logits[i, :] is overwritten by dloss * (softmax - onehot(target)) for the
// first V columns and 0 for the padding columns [V, Vp). Targets must lie in [0, V).
// Vp % 8 == 0.
void fused_classifier(bf16* logits,            // (N, Vp) in: logits; out: dlogits
                      float* losses,           // (N)
                      const int32_t* targets,  // (N) device
                      float dloss, int N, int V, int Vp, bool write_dlogits, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
