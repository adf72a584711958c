#include "longhaul/kernels/cpu/threading.h"

#include <thread>

#include <omp.h>

extern "C" void openblas_set_num_threads(int num_threads);

namespace longhaul::kernels::cpu {

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace longhaul::kernels::cpu
