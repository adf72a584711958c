// `longhaul-worker doctor`: what a bug report needs, in one command. The build (CUDA runtime,
// architectures), the driver and each GPU; the start-up self-check of the chosen device's
// kernels (every family with its error vs tolerance and PASS/FAIL/FALLBACK, then one training
// step against the CPU model); the path a `train` with the same config would take; and
// micro-measurements against nominal peaks (GPU: bf16 matmul, memory bandwidth, pinned
// host<->device copies; CPU: fp32 matmul). Without a GPU it says so and checks the CPU path.
//
// Exit codes: 0 when the device the flags ask for is usable and every check passed; 1 when a
// check failed (the report names it); 2 for bad usage, including --device cuda without a usable
// GPU.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/kernels/cpu/platform.h"
#include "longhaul/model/cuda/device_info.h"
#include "longhaul/selfcheck/device_plan.h"
#include "longhaul/trainer/config.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::cli {
namespace {

using nlohmann::json;

std::string fixed(double x, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}
std::string percent(double value, double peak) {
  return peak > 0 ? fixed(100.0 * value / peak) + "%" : "peak unknown";
}

json report_json(const selfcheck::Report& r) {
  json families = json::array();
  for (const selfcheck::FamilyResult& f : r.families) {
    json attempts = json::array();
    for (const selfcheck::Attempt& a : f.attempts) {
      json outputs = json::array();
      for (const selfcheck::OutputCheck& c : a.outputs) {
        outputs.push_back({{"output", c.output},
                           {"error", std::isfinite(c.error) ? json(c.error) : json("inf")},
                           {"max_abs_error",
                            std::isfinite(c.max_abs_error) ? json(c.max_abs_error) : json("inf")},
                           {"tolerance", c.tolerance},
                           {"passed", c.passed}});
      }
      attempts.push_back({{"implementation", a.implementation},
                          {"passed", a.passed},
                          {"failure", a.failure},
                          {"seconds", a.seconds},
                          {"outputs", outputs}});
    }
    families.push_back({{"family", std::string(selfcheck::family_name(f.family))},
                        {"status", std::string(selfcheck::status_name(f.status))},
                        {"chosen", f.chosen ? json(*f.chosen) : json(nullptr)},
                        {"attempts", attempts}});
  }
  json out = {{"backend", r.backend},
              {"shape", r.shape.to_string()},
              {"passed", r.passed()},
              {"seconds", r.seconds},
              {"families", families}};
  if (r.model_step.ran) {
    out["model_step"] = {{"passed", r.model_step.passed},
                         {"description", r.model_step.description},
                         {"failure", r.model_step.failure},
                         {"seconds", r.model_step.seconds}};
  }
  return out;
}

// What doctor has found so far: the human report, the --json document, and whether every
// check passed.
struct Findings {
  std::ostringstream text;
  json doc;
  bool ok = true;
};

// 1. The build and the GPUs the driver shows; doc["gpu"] holds the driver and the devices.
void report_build_and_gpus(Findings& f, const backend_cuda::CudaBuildInfo& build,
                           const backend_cuda::CudaSystemInfo& gpus, const DoctorArgs& args) {
  f.doc["build"] = {{"cuda", build.compiled},
                    {"cuda_runtime", build.runtime_version},
                    {"cuda_architectures", build.architectures}};
  f.text << "Build\n  CUDA backend       "
         << (build.compiled
                 ? "compiled, CUDA runtime " + build.runtime_version + ", sm_" + build.architectures
                 : std::string("not compiled (CPU-only build)"))
         << "\n\n";
  json gpu_doc = {{"usable", gpus.usable},
                  {"reason", gpus.usable ? "" : gpus.why},
                  {"driver", gpus.driver_version}};
  json devices = json::array();
  f.text << "GPU\n  driver             " << gpus.driver_version << "\n";
  for (const backend_cuda::CudaDeviceInfo& d : gpus.devices) {
    devices.push_back(
        {{"ordinal", d.ordinal},
         {"name", d.name},
         {"sm_count", d.sm_count},
         {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
         {"memory_gib", d.memory_gib},
         {"clock_ghz", d.clock_ghz},
         {"peak_bf16_tflops", d.peak_bf16_tflops},
         {"peak_memory_gbps", d.peak_memory_gbps},
         {"peak_pcie_gbps_assumed", d.peak_pcie_gbps}});
    f.text << "  device " << d.ordinal << "           " << d.name << ", sm_" << d.cc_major
           << d.cc_minor << ", " << d.sm_count << " SMs, " << fixed(d.memory_gib) << " GiB, "
           << fixed(d.clock_ghz, 2) << " GHz\n";
  }
  gpu_doc["devices"] = devices;
  if (!gpus.usable) {
    f.text << "  NO USABLE GPU: " << gpus.why << "\n";
    if (args.device != "cpu") f.text << "  => checking the CPU path instead\n";
  }
  f.text << "\n";
  f.doc["gpu"] = gpu_doc;
}

// The bf16 matmul, device memory and pinned-copy measurements of GPU 0 against its peaks; a
// failure to measure fails the check.
void measure_gpu(Findings& f, const backend_cuda::CudaDeviceInfo& d) {
  try {
    const backend_cuda::CudaMeasurements m = backend_cuda::cuda_micro_benchmarks(0);
    f.text << "GPU measurements (device 0)\n"
           << "  bf16 matmul 4096^3   " << fixed(m.matmul_bf16_tflops) << " TFLOP/s ("
           << percent(m.matmul_bf16_tflops, d.peak_bf16_tflops) << " of "
           << fixed(d.peak_bf16_tflops) << " dense peak)\n"
           << "  device memory        " << fixed(m.device_memory_gbps) << " GB/s ("
           << percent(m.device_memory_gbps, d.peak_memory_gbps) << " of "
           << fixed(d.peak_memory_gbps) << ")\n"
           << "  pinned H2D / D2H     " << fixed(m.h2d_gbps) << " / " << fixed(m.d2h_gbps)
           << " GB/s (" << percent(m.h2d_gbps, d.peak_pcie_gbps) << " / "
           << percent(m.d2h_gbps, d.peak_pcie_gbps) << " of an assumed "
           << fixed(d.peak_pcie_gbps, 0) << " GB/s PCIe link)\n\n";
    f.doc["gpu"]["measurements"] = {
        {"matmul_bf16_tflops", m.matmul_bf16_tflops},
        {"matmul_fraction_of_peak",
         d.peak_bf16_tflops > 0 ? json(m.matmul_bf16_tflops / d.peak_bf16_tflops) : json()},
        {"device_memory_gbps", m.device_memory_gbps},
        {"device_memory_fraction_of_peak",
         d.peak_memory_gbps > 0 ? json(m.device_memory_gbps / d.peak_memory_gbps) : json()},
        {"h2d_gbps", m.h2d_gbps},
        {"d2h_gbps", m.d2h_gbps},
        {"pcie_fraction_of_assumed_peak",
         {m.h2d_gbps / d.peak_pcie_gbps, m.d2h_gbps / d.peak_pcie_gbps}}};
  } catch (const Error& e) {
    f.ok = false;
    f.text << "GPU measurements: FAILED: " << e.what() << "\n\n";
    f.doc["gpu"]["measurements"] = {{"error", e.what()}};
  }
}

// 2. The GPU path: the start-up self-check (kernels + one model step), then the measurements.
// Returns the plan `train` would make.
selfcheck::DevicePlan check_gpu_path(Findings& f, const model::GPT2Config& shape,
                                     const backend_cuda::CudaSystemInfo& gpus) {
  selfcheck::PlanOptions options;
  options.device = "auto";
  options.self_check = true;
  selfcheck::DevicePlan plan = selfcheck::plan_device(shape, options);
  if (plan.report) {
    f.text << "GPU self-check (" << plan.report->shape.to_string() << ")\n"
           << plan.report->to_text() << "\n";
    f.doc["gpu"]["self_check"] = report_json(*plan.report);
  }
  f.ok = f.ok && plan.device == "cuda";
  measure_gpu(f, gpus.devices.front());
  return plan;
}

// 3. The CPU path: the platform, the CPU kernels against the reference, a matmul.
void check_cpu_path(Findings& f, const model::GPT2Config& shape) {
  const kernels::cpu::CpuPlatform p = kernels::cpu::cpu_platform();
  const selfcheck::CheckShape cs = selfcheck::check_shape_for(
      shape.n_embd, shape.n_head, shape.vocab_size, shape.context_length);
  selfcheck::Report cpu_report =
      selfcheck::run_self_check(selfcheck::cpu_registry(), cs, selfcheck::cpu_families());
  cpu_report.backend = "cpu";
  const double gflops = kernels::cpu::measure_matmul_gflops();
  const double peak = p.estimated_peak_gflops();
  f.text << "CPU\n"
         << "  processor          " << p.model_name << "\n"
         << "  threads            " << p.threads
         << " (LONGHAUL_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this process may use, "
            "capped by its cgroup CPU limit)\n"
         << "  BLAS               " << p.blas << "\n"
         << "  vector ISA         " << p.isa << " (" << p.fp32_flops_per_cycle
         << " fp32 FLOP/cycle/core)\n"
         << "  fp32 matmul 1024^3 " << fixed(gflops) << " GFLOP/s ("
         << (peak > 0 ? percent(gflops, peak) + " of an estimated " + fixed(peak, 0) + " GFLOP/s"
                      : std::string("peak unknown"))
         << ")\n\nCPU self-check (" << cs.to_string() << ")\n"
         << cpu_report.to_text() << "\n";
  f.doc["cpu"] = {{"processor", p.model_name},
                  {"threads", p.threads},
                  {"blas", p.blas},
                  {"isa", p.isa},
                  {"matmul_fp32_gflops", gflops},
                  {"estimated_peak_gflops", peak},
                  {"matmul_fraction_of_estimated_peak", peak > 0 ? json(gflops / peak) : json()},
                  {"self_check", report_json(cpu_report)}};
  f.ok = f.ok && cpu_report.passed();
}

// 4. The path `train` would take with these flags, and the verdict.
void report_chosen_path(Findings& f, const std::optional<selfcheck::DevicePlan>& gpu_plan,
                        const backend_cuda::CudaSystemInfo& gpus, const DoctorArgs& args) {
  std::string chosen_device = "cpu", why = gpus.usable ? "" : gpus.why;
  std::map<std::string, std::string> labels = {
      {"attention", "cpu"}, {"matmul_epilogues", "cpu"}, {"self_check", "n/a"}};
  if (gpu_plan) {
    chosen_device = gpu_plan->device;
    labels = gpu_plan->labels();
    why = gpu_plan->why_cpu;
  }
  if (args.device == "cpu") why = "--device cpu";
  f.text << "Chosen path: device " << chosen_device;
  if (chosen_device == "cuda") {
    f.text << ", attention " << labels["attention"] << ", matmul epilogues "
           << labels["matmul_epilogues"] << ", self-check " << labels["self_check"];
  }
  if (!why.empty()) f.text << " (" << why << ")";
  f.text << "\n" << (f.ok ? "All checks passed.\n" : "SOME CHECKS FAILED: see above.\n");
  f.doc["chosen"] = {{"device", chosen_device}, {"reason", why}};
  for (const auto& [k, v] : labels) f.doc["chosen"][k] = v;
  f.doc["passed"] = f.ok;
}

}  // namespace

int run_doctor(const DoctorArgs& args) {
  trainer::WorkerConfig config;
  model::GPT2Config shape;
  try {
    config = trainer::load_config(args.config, args.sets);
    shape = trainer::model_config_for(config);
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
  Findings f;
  f.doc["version"] = version_string();
  f.doc["model"] = {{"preset", config.model.preset}, {"config", shape.to_string()}};
  f.text << "longhaul-worker " << version_string() << " doctor (model " << config.model.preset
         << ": " << shape.to_string() << ")\n\n";

  const backend_cuda::CudaBuildInfo build = backend_cuda::cuda_build_info();
  const backend_cuda::CudaSystemInfo gpus = backend_cuda::cuda_system_info();
  report_build_and_gpus(f, build, gpus, args);
  if (args.device == "cuda" && !gpus.usable) {
    throw InvalidArgument("doctor --device cuda: no usable GPU: " + gpus.why +
                          "; run `longhaul-worker doctor` (or --device cpu) to check the CPU path");
  }
  std::optional<selfcheck::DevicePlan> gpu_plan;
  if (args.device != "cpu" && gpus.usable) gpu_plan = check_gpu_path(f, shape, gpus);
  if (args.device == "cpu" || !gpus.usable || args.device == "auto") check_cpu_path(f, shape);
  report_chosen_path(f, gpu_plan, gpus, args);

  if (args.json) {
    std::cout << f.doc.dump(2) << "\n";
  } else {
    std::cout << f.text.str();
  }
  return f.ok ? kExitFinished : kExitFailure;
}

}  // namespace longhaul::cli
