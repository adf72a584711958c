// Thread control for the CPU kernels. Everything parallelises on one OpenMP thread team
// (default: every core, or OMP_NUM_THREADS); matmuls split each sgemm into per-thread blocks
// and run OpenBLAS single-threaded inside them, so no second thread pool competes for cores.
//
// Determinism: every kernel except the OpenBLAS matmuls produces bit-identical results for any
// thread count (reductions use fixed chunking or per-channel ownership, never atomics or
// OpenMP reduction clauses). The matmuls are deterministic for a fixed thread count.
//
// Thread-safety: set_num_threads() changes process-wide settings; call it before training, not
// while a kernel runs. Kernels must not be called concurrently on the same output buffers.
#pragma once

namespace longhaul::kernels::cpu {

// Sets the OpenMP thread count (OpenBLAS is kept at 1). n <= 0 restores "all cores".
void set_num_threads(int n);

// The number of threads kernels use (OpenMP's max threads).
int num_threads();

}  // namespace longhaul::kernels::cpu
