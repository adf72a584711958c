// The CPU platform report and the matmul measurement of `doctor`; see platform.h.
#include "longhaul/kernels/cpu/platform.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "longhaul/kernels/cpu/matmul.h"
#include "longhaul/kernels/cpu/threading.h"

// OpenBLAS's self-description (cblas.h of OpenBLAS declares them; the kernels link OpenBLAS).
extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace longhaul::kernels::cpu {
namespace {

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(" \t"));
        return value;
      }
    }
  }
  return "";
}

}  // namespace

double CpuPlatform::estimated_peak_gflops() const {
  return static_cast<double>(threads) * ghz * fp32_flops_per_cycle;
}

CpuPlatform cpu_platform() {
  CpuPlatform p;
  p.model_name = cpuinfo_field("model name");
  if (p.model_name.empty()) p.model_name = "unknown";
  p.threads = num_threads();
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  p.blas = std::string(config ? config : "OpenBLAS") + " (core " + (core ? core : "unknown") + ")";
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    p.isa = "AVX-512";
    p.fp32_flops_per_cycle = 64;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.isa = "AVX2+FMA";
    p.fp32_flops_per_cycle = 32;
  } else if (__builtin_cpu_supports("avx")) {
    p.isa = "AVX";
    p.fp32_flops_per_cycle = 16;
  } else if (__builtin_cpu_supports("sse4.2")) {
    p.isa = "SSE4.2";
    p.fp32_flops_per_cycle = 8;
  } else {
    p.isa = "baseline x86-64";
    p.fp32_flops_per_cycle = 8;
  }
#else
  p.isa = "non-x86";
  p.fp32_flops_per_cycle = 8;
#endif
  // The nominal clock: "@ 2.20GHz" in the model name, else the current "cpu MHz".
  if (const auto at = p.model_name.find("@ "); at != std::string::npos) {
    try {
      p.ghz = std::stod(p.model_name.substr(at + 2));
    } catch (const std::exception&) {
    }
  }
  if (p.ghz <= 0) {
    try {
      p.ghz = std::stod(cpuinfo_field("cpu MHz")) / 1000.0;
    } catch (const std::exception&) {
      p.ghz = 0;
    }
  }
  return p;
}

double measure_matmul_gflops(int n, int repeats) {
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<float> a(nn), b(nn), c(nn);
  for (size_t i = 0; i < nn; ++i) {
    a[i] = static_cast<float>(i % 13) * 0.01f;
    b[i] = static_cast<float>(i % 7) * 0.02f;
  }
  matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);  // warm-up
  double best = 1e30;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / best / 1e9;
}

}  // namespace longhaul::kernels::cpu
