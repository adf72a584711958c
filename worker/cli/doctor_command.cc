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
  std::ostringstream text;
  json doc;
  doc["version"] = version_string();
  doc["model"] = {{"preset", config.model.preset}, {"config", shape.to_string()}};
  bool ok = true;

  // 1. Build and GPUs.
  const backend_cuda::CudaBuildInfo build = backend_cuda::cuda_build_info();
  const backend_cuda::CudaSystemInfo gpus = backend_cuda::cuda_system_info();
  doc["build"] = {{"cuda", build.compiled},
                  {"cuda_runtime", build.runtime_version},
                  {"cuda_architectures", build.architectures}};
  text << "longhaul-worker " << version_string() << " doctor (model " << config.model.preset << ": "
       << shape.to_string() << ")\n\n";
  text << "Build\n  CUDA backend       "
       << (build.compiled
               ? "compiled, CUDA runtime " + build.runtime_version + ", sm_" + build.architectures
               : std::string("not compiled (CPU-only build)"))
       << "\n\n";
  json gpu_doc = {{"usable", gpus.usable},
                  {"reason", gpus.usable ? "" : gpus.why},
                  {"driver", gpus.driver_version}};
  json devices = json::array();
  text << "GPU\n  driver             " << gpus.driver_version << "\n";
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
    text << "  device " << d.ordinal << "           " << d.name << ", sm_" << d.cc_major
         << d.cc_minor << ", " << d.sm_count << " SMs, " << fixed(d.memory_gib) << " GiB, "
         << fixed(d.clock_ghz, 2) << " GHz\n";
  }
  gpu_doc["devices"] = devices;
  if (!gpus.usable) {
    text << "  NO USABLE GPU: " << gpus.why << "\n";
    if (args.device != "cpu") text << "  => checking the CPU path instead\n";
  }
  text << "\n";

  if (args.device == "cuda" && !gpus.usable) {
    throw InvalidArgument("doctor --device cuda: no usable GPU: " + gpus.why +
                          "; run `longhaul-worker doctor` (or --device cpu) to check the CPU path");
  }

  // 2. The GPU path: the start-up self-check (kernels + one model step) and the measurements.
  std::optional<selfcheck::DevicePlan> gpu_plan;
  if (args.device != "cpu" && gpus.usable) {
    selfcheck::PlanOptions options;
    options.device = "auto";
    options.self_check = true;
    gpu_plan = selfcheck::plan_device(shape, options);
    if (gpu_plan->report) {
      text << "GPU self-check (" << gpu_plan->report->shape.to_string() << ")\n"
           << gpu_plan->report->to_text() << "\n";
      gpu_doc["self_check"] = report_json(*gpu_plan->report);
    }
    ok = ok && gpu_plan->device == "cuda";
    try {
      const backend_cuda::CudaMeasurements m = backend_cuda::cuda_micro_benchmarks(0);
      const backend_cuda::CudaDeviceInfo& d = gpus.devices.front();
      text << "GPU measurements (device 0)\n"
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
      gpu_doc["measurements"] = {
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
      ok = false;
      text << "GPU measurements: FAILED: " << e.what() << "\n\n";
      gpu_doc["measurements"] = {{"error", e.what()}};
    }
  }
  doc["gpu"] = gpu_doc;

  // 3. The CPU path: the platform, the CPU kernels against the reference, a matmul.
  const bool check_cpu = args.device == "cpu" || !gpus.usable || args.device == "auto";
  if (check_cpu) {
    const kernels::cpu::CpuPlatform p = kernels::cpu::cpu_platform();
    const selfcheck::CheckShape cs = selfcheck::check_shape_for(
        shape.n_embd, shape.n_head, shape.vocab_size, shape.context_length);
    selfcheck::Report cpu_report =
        selfcheck::run_self_check(selfcheck::cpu_registry(), cs, selfcheck::cpu_families());
    cpu_report.backend = "cpu";
    const double gflops = kernels::cpu::measure_matmul_gflops();
    const double peak = p.estimated_peak_gflops();
    text << "CPU\n"
         << "  processor          " << p.model_name << "\n"
         << "  threads            " << p.threads
         << " (LONGHAUL_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this process may use)\n"
         << "  BLAS               " << p.blas << "\n"
         << "  vector ISA         " << p.isa << " (" << p.fp32_flops_per_cycle
         << " fp32 FLOP/cycle/core)\n"
         << "  fp32 matmul 1024^3 " << fixed(gflops) << " GFLOP/s ("
         << (peak > 0 ? percent(gflops, peak) + " of an estimated " + fixed(peak, 0) + " GFLOP/s"
                      : std::string("peak unknown"))
         << ")\n\nCPU self-check (" << cs.to_string() << ")\n"
         << cpu_report.to_text() << "\n";
    doc["cpu"] = {{"processor", p.model_name},
                  {"threads", p.threads},
                  {"blas", p.blas},
                  {"isa", p.isa},
                  {"matmul_fp32_gflops", gflops},
                  {"estimated_peak_gflops", peak},
                  {"matmul_fraction_of_estimated_peak", peak > 0 ? json(gflops / peak) : json()},
                  {"self_check", report_json(cpu_report)}};
    ok = ok && cpu_report.passed();
  }

  // 4. The path `train` would take with these flags.
  std::string chosen_device = "cpu", why = gpus.usable ? "" : gpus.why;
  std::map<std::string, std::string> labels = {
      {"attention", "cpu"}, {"matmul_epilogues", "cpu"}, {"self_check", "n/a"}};
  if (gpu_plan) {
    chosen_device = gpu_plan->device;
    labels = gpu_plan->labels();
    why = gpu_plan->why_cpu;
  }
  if (args.device == "cpu") why = "--device cpu";
  text << "Chosen path: device " << chosen_device;
  if (chosen_device == "cuda") {
    text << ", attention " << labels["attention"] << ", matmul epilogues "
         << labels["matmul_epilogues"] << ", self-check " << labels["self_check"];
  }
  if (!why.empty()) text << " (" << why << ")";
  text << "\n" << (ok ? "All checks passed.\n" : "SOME CHECKS FAILED: see above.\n");
  doc["chosen"] = {{"device", chosen_device}, {"reason", why}};
  for (const auto& [k, v] : labels) doc["chosen"][k] = v;
  doc["passed"] = ok;

  if (args.json) {
    std::cout << doc.dump(2) << "\n";
  } else {
    std::cout << text.str();
  }
  return ok ? kExitFinished : kExitFailure;
}

}  // namespace longhaul::cli
