// What the CPU backend runs on, for `longhaul-worker doctor`: the kernels' thread count, the
// BLAS library and the kernel it picked for this CPU, the widest vector instruction set, and a
// measured fp32 matrix product against an estimated peak.
//
// Thread-safety: cpu_platform() is reentrant; measure_matmul_gflops() uses the kernels' thread
// team (do not call it while training).
#pragma once

#include <string>

namespace longhaul::kernels::cpu {

struct CpuPlatform {
  std::string model_name;  // /proc/cpuinfo "model name", or "unknown"
  int threads = 1;         // the kernels' thread team (threading.h)
  std::string blas;        // "OpenBLAS 0.3.21 (core Haswell, MAX_THREADS=64)" as it reports itself
  std::string isa;         // "AVX-512", "AVX2+FMA", "AVX", "SSE4.2" or "baseline x86-64"
  int fp32_flops_per_cycle = 8;  // per core, of that ISA (two FMA pipes assumed)
  double ghz = 0;                // nominal clock from /proc/cpuinfo, 0 when unknown
  // threads * ghz * flops per cycle, in GFLOP/s; 0 when the clock is unknown. An estimate: turbo
  // and AVX clock offsets move the real peak by tens of percent.
  double estimated_peak_gflops() const;
};

CpuPlatform cpu_platform();

// fp32 GFLOP/s of the CPU kernels' (n x n) @ (n x n) product (matmul_forward: the kernels' team
// of threads, each running a single-threaded OpenBLAS sgemm), best of `repeats` after a warm-up.
double measure_matmul_gflops(int n = 1024, int repeats = 3);

}  // namespace longhaul::kernels::cpu
