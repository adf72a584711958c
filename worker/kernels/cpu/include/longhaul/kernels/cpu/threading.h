// Thread control for the CPU kernels. Kernels parallelise with OpenMP; matmuls go to OpenBLAS,
// which keeps its own thread pool. Both default to every core of the machine.
//
// Determinism: every kernel except the OpenBLAS matmuls produces bit-identical results for any
// thread count (reductions use fixed chunking or per-channel ownership, never atomics or
// OpenMP reduction clauses). OpenBLAS sgemm is deterministic for a fixed thread count.
//
// Thread-safety: set_num_threads() changes process-wide settings; call it before training, not
// while a kernel runs. Kernels must not be called concurrently on the same output buffers.
#pragma once

namespace longhaul::kernels::cpu {

// Sets the OpenMP and OpenBLAS thread counts. n <= 0 restores "all cores".
void set_num_threads(int n);

// The number of threads kernels use (OpenMP's max threads).
int num_threads();

}  // namespace longhaul::kernels::cpu
