// Private to the CPU kernels: the one thread team every kernel runs on.
//
// Why not OpenMP: libgomp's workers busy-wait between parallel regions, and on a machine whose
// cores are shared (CI, a laptop, seven builds at once) a spinning worker steals the time slice
// of the thread that holds the work; a training step then takes 20x longer. This team spins for
// a few microseconds, then blocks on a condition variable.
//
// parallel_for(n, parallel, fn) splits [0, n) into one contiguous block per thread (a fixed
// partition for a given thread count) and calls fn(begin, end) for each, the calling thread
// taking block 0; it returns when all blocks are done. Nested calls (from inside fn) and calls
// with parallel == false run on the calling thread. Calls from different threads are serialised.
// An exception thrown by fn terminates the program (kernels do not throw).
#pragma once

#include <cstddef>
#include <cstdint>

namespace longhaul::kernels::cpu {

// Below this many float operations a kernel runs on the calling thread: waking the team costs
// more than the work.
inline constexpr size_t kParallelMinWork = 32768;

namespace detail {
using BlockFn = void (*)(void* context, int64_t begin, int64_t end);
void parallel_for_impl(int64_t n, bool parallel, BlockFn fn, void* context);
}  // namespace detail

template <typename Fn>
void parallel_for(int64_t n, bool parallel, Fn&& fn) {
  detail::parallel_for_impl(
      n, parallel,
      [](void* context, int64_t begin, int64_t end) { (*static_cast<Fn*>(context))(begin, end); },
      &fn);
}

}  // namespace longhaul::kernels::cpu
