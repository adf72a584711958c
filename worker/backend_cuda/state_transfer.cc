// Backend-independent state transfer (see cuda_backend.h): dispatches to CudaModel's device
// copies, or copies host memory directly for host backends. Built with and without CUDA.
#include <cstring>

#include <longhaul/base/error.h>

#include "longhaul/backend_cuda/cuda_backend.h"

namespace longhaul::backend_cuda {
namespace {

void check_sizes(size_t a, size_t b, const char* what) {
  if (a != b) {
    throw InvalidArgument(std::string(what) + ": the model span has " + std::to_string(a) +
                          " floats but the host buffer " + std::to_string(b));
  }
}

}  // namespace

void copy_to_host(model::LanguageModel& model, std::span<const float> model_span,
                  std::span<float> host) {
  if (auto* cuda = dynamic_cast<CudaModel*>(&model)) {
    cuda->download(model_span, host);
    return;
  }
  check_sizes(model_span.size(), host.size(), "copy_to_host");
  std::memcpy(host.data(), model_span.data(), model_span.size_bytes());
}

void copy_from_host(model::LanguageModel& model, std::span<const float> host,
                    std::span<float> model_span) {
  if (auto* cuda = dynamic_cast<CudaModel*>(&model)) {
    cuda->upload(host, model_span);
    return;
  }
  check_sizes(model_span.size(), host.size(), "copy_from_host");
  std::memcpy(model_span.data(), host.data(), host.size_bytes());
}

void start_snapshot(model::LanguageModel& model, std::span<const HostCopy> copies) {
  if (auto* cuda = dynamic_cast<CudaModel*>(&model)) {
    cuda->snapshot_to_host(copies);
    return;
  }
  for (const HostCopy& c : copies) {
    std::memcpy(c.host_dst.data(), c.device_src, c.host_dst.size());
  }
}

void finish_snapshot(model::LanguageModel& model) {
  if (auto* cuda = dynamic_cast<CudaModel*>(&model)) cuda->wait_snapshot();
}

}  // namespace longhaul::backend_cuda
