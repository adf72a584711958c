// What `longhaul-worker doctor` reports about the CUDA side: the build (CUDA runtime version,
// the GPU architectures compiled in), the driver, each visible device, and three
// micro-measurements against the device's nominal peak. Compiles without the CUDA toolkit (the
// stub reports "built without CUDA").
//
// Nominal peaks are computed, not looked up: bf16 dense tensor-core FLOP/s = SMs x max clock x
// per-SM FLOP/clock of the architecture (sm_80: 2048, sm_86/89: 1024, sm_90: 4096, sm_100:
// 8192); memory bandwidth = 2 (DDR) x memory clock x bus width; host<->device: PCIe 4.0 x16
// (32 GB/s per direction) for sm_80-89, PCIe 5.0 x16 (64 GB/s) from sm_90 on (assumed: the link
// is not queried). Each is labelled as such in doctor's output.
//
// Thread-safety: the functions use the CUDA runtime on the calling thread; the measurements
// allocate a few GiB of device memory (do not run them next to a training process).
#pragma once

#include <string>
#include <vector>

namespace longhaul::backend_cuda {

struct CudaBuildInfo {
  bool compiled = false;        // this binary has the CUDA backend
  std::string runtime_version;  // "13.0" (the toolkit it was built with)
  std::string architectures;    // "90" / "80;90;100" (CMAKE_CUDA_ARCHITECTURES)
};
CudaBuildInfo cuda_build_info();

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  double memory_gib = 0;
  double clock_ghz = 0;
  double peak_bf16_tflops = 0;  // 0: unknown architecture
  double peak_memory_gbps = 0;
  double peak_pcie_gbps = 0;
};

struct CudaSystemInfo {
  bool usable = false;         // cuda_available()
  std::string why;             // when not usable
  std::string driver_version;  // "13.0", or "none"
  std::vector<CudaDeviceInfo> devices;
};
// Never throws.
CudaSystemInfo cuda_system_info();

struct CudaMeasurements {
  double matmul_bf16_tflops = 0;  // cuBLASLt bf16 GEMM 4096^3, fp32 accumulation
  double device_memory_gbps = 0;  // device-to-device copy of 1 GiB (read + write bytes)
  double h2d_gbps = 0;            // pinned host -> device, 256 MiB
  double d2h_gbps = 0;            // device -> pinned host, 256 MiB
};
// Runs the three measurements on `device` (best of a few runs after a warm-up). Throws the
// CUDA error (Unavailable, Internal, ...) when they cannot run.
CudaMeasurements cuda_micro_benchmarks(int device = 0);

}  // namespace longhaul::backend_cuda
