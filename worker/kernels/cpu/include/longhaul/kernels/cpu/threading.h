// Thread control for the CPU kernels. Every kernel parallelises on one thread team of the
// kernels' own (threading.cc: workers spin briefly, then block, so a shared or oversubscribed
// machine is not slowed by busy-waiting). Its size defaults to LONGHAUL_NUM_THREADS, else
// OMP_NUM_THREADS, else the number of CPUs in the process's affinity mask, capped by the CPU
// limit of its cgroup (a container's `resources.limits.cpu`, rounded up: a pod limited to 2
// CPUs on a 64-core node runs 2 threads, not 64 throttled ones). Matmuls split each
// sgemm into per-thread blocks and run OpenBLAS single-threaded inside them (the first kernel
// call sets openblas_set_num_threads(1) for the process), so no second pool competes for cores.
//
// Determinism: every kernel except the OpenBLAS matmuls produces bit-identical results for any
// thread count (reductions use fixed chunking or per-channel ownership, never atomics or
// OpenMP reduction clauses). The matmuls are deterministic for a fixed thread count.
//
// Thread-safety: set_num_threads() changes process-wide settings; call it before training, not
// while a kernel runs. Kernels must not be called concurrently on the same output buffers.
#pragma once

#include <filesystem>
#include <string_view>

namespace longhaul::kernels::cpu {

// Resizes the team to n threads (the caller counts as one); n <= 0 restores the default.
void set_num_threads(int n);

// The number of threads kernels use.
int num_threads();

// The CPU limit of the cgroup whose membership `proc_self_cgroup` lists (the text of
// /proc/self/cgroup), as whole CPUs rounded up, read from the cgroup filesystem mounted at
// `root` (normally /sys/fs/cgroup): cgroup v2's cpu.max, or v1's cpu.cfs_quota_us and
// cpu.cfs_period_us, the smallest along the path up to the root (a parent's limit binds its
// children). 0 when no limit applies or nothing can be read.
int cgroup_cpu_limit(std::string_view proc_self_cgroup, const std::filesystem::path& root);

}  // namespace longhaul::kernels::cpu
