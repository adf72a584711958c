// The CUDA backend's entry points in a build without the CUDA toolkit (LONGHAUL_HAVE_CUDA off):
// the backend reports itself unavailable, so `device: auto` falls back to the CPU and
// `device: cuda` fails with a clear error.
#include <longhaul/base/error.h>

#include "longhaul/model/cuda/cuda_backend.h"

namespace longhaul::backend_cuda {
namespace {

constexpr const char* kNotBuilt =
    "this longhaul-worker was built without the CUDA backend (no nvcc at configure time, or "
    "LONGHAUL_CUDA=OFF)";

}  // namespace

bool cuda_available(std::string* why) {
  if (why != nullptr) *why = kNotBuilt;
  return false;
}

std::unique_ptr<model::LanguageModel> make_cuda_gpt2(const model::GPT2Config&, int, int,
                                                     const CudaOptions&) {
  throw Unavailable(std::string("cannot create the CUDA model: ") + kNotBuilt +
                    "; use device: cpu, or rebuild with the CUDA toolkit installed");
}

int64_t cuda_gpt2_memory_bytes(const model::GPT2Config&, int, int, const CudaOptions&) {
  throw Unavailable(std::string("cannot size the CUDA model: ") + kNotBuilt);
}

}  // namespace longhaul::backend_cuda
