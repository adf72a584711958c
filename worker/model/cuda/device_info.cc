// Device report and micro-measurements for `doctor`; see device_info.h.
#include "longhaul/model/cuda/device_info.h"

#include <algorithm>
#include <string>

#include <cuda_runtime.h>

#include <longhaul/kernels/cuda/check.h>
#include <longhaul/kernels/cuda/matmul.h>

#include "longhaul/model/cuda/cuda_backend.h"

#ifndef LONGHAUL_CUDA_ARCHITECTURES
#define LONGHAUL_CUDA_ARCHITECTURES "unknown"
#endif

namespace longhaul::backend_cuda {
namespace {

namespace k = longhaul::kernels::cuda;

std::string version_string(int v) {
  return v <= 0 ? "none" : std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// Dense bf16 tensor-core FLOP per SM per clock.
double bf16_flops_per_sm_clock(int major, int minor) {
  if (major == 8) return minor == 0 ? 2048 : 1024;
  if (major == 9) return 4096;
  if (major == 10) return 8192;
  return 0;
}

// Seconds of the fastest of `runs` timed calls of fn (after one warm-up), CUDA events on `s`.
template <typename Fn>
double best_seconds(cudaStream_t s, int runs, Fn&& fn) {
  cudaEvent_t start = nullptr, stop = nullptr;
  LH_CUDA_CHECK(cudaEventCreate(&start));
  LH_CUDA_CHECK(cudaEventCreate(&stop));
  double best = 1e30;
  try {
    fn();
    for (int r = 0; r < runs; ++r) {
      LH_CUDA_CHECK(cudaEventRecord(start, s));
      fn();
      LH_CUDA_CHECK(cudaEventRecord(stop, s));
      LH_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      LH_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      best = std::min(best, static_cast<double>(ms) / 1e3);
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// Frees on every path.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { LH_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
};
struct HostBuffer {
  void* p = nullptr;
  explicit HostBuffer(size_t bytes) { LH_CUDA_CHECK(cudaMallocHost(&p, bytes)); }
  ~HostBuffer() { cudaFreeHost(p); }
};
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { LH_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};

}  // namespace

CudaBuildInfo cuda_build_info() {
  CudaBuildInfo b;
  b.compiled = true;
  b.runtime_version = version_string(CUDART_VERSION);
  b.architectures = LONGHAUL_CUDA_ARCHITECTURES;
  return b;
}

CudaSystemInfo cuda_system_info() {
  CudaSystemInfo info;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  info.driver_version = version_string(driver);
  info.usable = cuda_available(&info.why);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  (void)cudaGetLastError();
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    CudaDeviceInfo dev;
    dev.ordinal = d;
    dev.name = prop.name;
    dev.sm_count = prop.multiProcessorCount;
    dev.cc_major = prop.major;
    dev.cc_minor = prop.minor;
    dev.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    int clock_khz = 0, mem_khz = 0, bus_bits = prop.memoryBusWidth;
    (void)cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, d);
    (void)cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, d);
    (void)cudaGetLastError();
    dev.clock_ghz = clock_khz / 1e6;
    dev.peak_bf16_tflops =
        dev.sm_count * (clock_khz * 1e3) * bf16_flops_per_sm_clock(prop.major, prop.minor) / 1e12;
    dev.peak_memory_gbps = 2.0 * (mem_khz * 1e3) * (bus_bits / 8.0) / 1e9;
    dev.peak_pcie_gbps = prop.major >= 9 ? 64 : 32;
    info.devices.push_back(dev);
  }
  return info;
}

CudaMeasurements cuda_micro_benchmarks(int device) {
  LH_CUDA_CHECK(cudaSetDevice(device));
  CudaMeasurements m;
  Stream stream;
  {
    // bf16 GEMM 4096^3 through the same cuBLASLt wrapper the model uses.
    const int n = 4096;
    const size_t bytes = static_cast<size_t>(n) * n * sizeof(k::bf16);
    DeviceBuffer a(bytes), b(bytes), d(bytes);
    LH_CUDA_CHECK(cudaMemsetAsync(a.p, 0, bytes, stream.s));
    LH_CUDA_CHECK(cudaMemsetAsync(b.p, 0, bytes, stream.s));
    k::Matmul mm;
    k::GemmDesc g;
    g.m = g.n = g.k = n;
    const double s = best_seconds(stream.s, 10, [&] {
      mm.run(g, d.p, static_cast<const k::bf16*>(a.p), static_cast<const k::bf16*>(b.p), stream.s);
    });
    m.matmul_bf16_tflops = 2.0 * n * static_cast<double>(n) * n / s / 1e12;
  }
  {
    const size_t bytes = size_t{1} << 30;
    DeviceBuffer src(bytes), dst(bytes);
    LH_CUDA_CHECK(cudaMemsetAsync(src.p, 1, bytes, stream.s));
    const double s = best_seconds(stream.s, 5, [&] {
      LH_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, stream.s));
    });
    m.device_memory_gbps = 2.0 * static_cast<double>(bytes) / s / 1e9;  // read + write
  }
  {
    const size_t bytes = size_t{256} << 20;
    DeviceBuffer dev(bytes);
    HostBuffer host(bytes);
    const double h2d = best_seconds(stream.s, 5, [&] {
      LH_CUDA_CHECK(cudaMemcpyAsync(dev.p, host.p, bytes, cudaMemcpyHostToDevice, stream.s));
    });
    const double d2h = best_seconds(stream.s, 5, [&] {
      LH_CUDA_CHECK(cudaMemcpyAsync(host.p, dev.p, bytes, cudaMemcpyDeviceToHost, stream.s));
    });
    m.h2d_gbps = static_cast<double>(bytes) / h2d / 1e9;
    m.d2h_gbps = static_cast<double>(bytes) / d2h / 1e9;
  }
  return m;
}

}  // namespace longhaul::backend_cuda
