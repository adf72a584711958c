// device_info.h in a build without the CUDA toolkit: no CUDA, said plainly.
#include <longhaul/base/error.h>

#include "longhaul/model/cuda/device_info.h"

namespace longhaul::backend_cuda {

CudaBuildInfo cuda_build_info() { return CudaBuildInfo{}; }

CudaSystemInfo cuda_system_info() {
  CudaSystemInfo info;
  info.usable = false;
  info.why = "this longhaul-worker was built without the CUDA backend";
  info.driver_version = "not queried";
  return info;
}

CudaMeasurements cuda_micro_benchmarks(int) {
  throw Unavailable("this longhaul-worker was built without the CUDA backend");
}

}  // namespace longhaul::backend_cuda
