// cuda_kernel_registry() in a build without the CUDA toolkit: no implementations (the device
// plan never asks for them, since cuda_available() is false there).
#include "longhaul/selfcheck/cuda_registry.h"

namespace longhaul::selfcheck {

Registry cuda_kernel_registry(int) { return Registry(); }

}  // namespace longhaul::selfcheck
