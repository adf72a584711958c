// Private to the CPU kernels: below this many float operations a kernel runs on the calling
// thread, because waking the OpenMP team costs more than the work (and on a loaded machine the
// wake-up can take milliseconds).
#pragma once

#include <cstddef>

namespace longhaul::kernels::cpu {

inline constexpr size_t kParallelMinWork = 32768;

}  // namespace longhaul::kernels::cpu
