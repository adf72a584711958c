// Choosing the device and the kernels a run trains with, from `device: auto|cpu|cuda` and the
// start-up self-check (selfcheck.h). This is the one place the device is decided:
// make_model_on_device applies every rule below and everything else takes its result.
//
//   1. cpu: the CPU (the reference backend; nothing to check).
//   2. No usable GPU: auto -> the CPU with a reason; cuda -> Unavailable.
//   3. A model the device's kernels cannot take at the run's micro-batch (a host-only check,
//      before any GPU work: n_embd or head size not a multiple of 8, ...): auto -> the CPU with
//      that reason (every replica of a group decides the same); cuda -> that error.
//   4. cuda.self_check off: the GPU with the preferred kernels, unchecked.
//   5. Otherwise every kernel family the CUDA model uses runs on the GPU against the reference;
//      a failing flash attention falls back to the cuBLAS path, a failing cuBLASLt epilogue to
//      the separate kernel. Then one training step of a small model with the chosen kernels is
//      compared with the CPU model (loss <= 1e-2, gradient norm <= 2e-2, parameters after the
//      AdamW step <= 1e-2 relative, the CUDA model's test tolerances); if it fails, once more with
//      the most conservative choices (cuBLAS attention, no fused epilogues).
//   6. Still wrong: auto -> the CPU, with the failures as the reason;
//      cuda -> FailedPrecondition naming the kernel, shape, error and tolerance (exit 2).
//   7. The model is created on the planned GPU. If it fails to start there (out of memory, a
//      broken context): auto -> the CPU with that error as the reason; cuda -> that error.
// A replica of a data-parallel group (allow_cpu_fallback false) cannot train on the CPU alone
// while its peers train on their GPUs (Gloo vs NCCL): under auto, 6 and 7 are FailedPrecondition
// for it too. 1-6 are plan_device (what `doctor` shows); make_model_on_device adds 7, and logs
// the plan, or a WARNING saying why the CPU when auto fell back.
//
// The plan is what the run reports: logged, exported as build_info labels, written as a text
// summary into the events file and into every checkpoint's metadata (`device`, `kernels`).
//
// Thread-safety: plan_device and make_model_on_device run on the calling thread and use the GPU
// they check.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "longhaul/model/cuda/cuda_backend.h"
#include "longhaul/model/language_model.h"
#include "longhaul/selfcheck/selfcheck.h"

namespace longhaul::selfcheck {

// Every family the CUDA model runs (all of them); the CPU model's (all but kCast).
std::vector<Family> cuda_families();
std::vector<Family> cpu_families();

using ModelFactory = std::function<std::unique_ptr<model::LanguageModel>(
    const model::GPT2Config& config, int B, int T, const backend_cuda::CudaOptions& options)>;

// One forward/backward + gradient norm + AdamW step of `config` (small) on `candidate` and on
// `reference` from the same seed and batch; compared at the tolerances above.
ModelStepResult check_model_step(const ModelFactory& candidate, const ModelFactory& reference,
                                 const model::GPT2Config& config,
                                 const backend_cuda::CudaOptions& options, uint64_t seed = 7);

// The small model the step check trains: 2 layers of the real head size (2 heads), the real
// vocabulary capped at 512, context 64.
model::GPT2Config step_check_config(const model::GPT2Config& config);

struct DevicePlan {
  std::string device;              // "cuda" or "cpu": where the model trains
  backend_cuda::CudaOptions cuda;  // the kernels, when device == "cuda"
  std::string self_check = "off";  // "passed", "fallback" (passed with fallbacks), "failed",
                                   // "off" (cuda.self_check: off), "n/a" (cpu)
  std::optional<Report> report;    // when the self-check ran
  std::string why_cpu;             // device auto trains on the CPU: why (empty otherwise)

  // build_info labels: attention (flash | cublas | cpu), matmul_epilogues (fused | separate |
  // mixed | cpu), self_check.
  std::map<std::string, std::string> labels() const;
  // One line: "device cuda, attention flash, matmul epilogues fused, self-check passed (12
  // kernel families, model step) in 0.41 s".
  std::string summary() const;
  // The text summary for the events file: the summary line and the self-check table.
  std::string details() const;
};

struct PlanOptions {
  std::string device = "auto";  // auto | cpu | cuda
  bool self_check = true;
  int device_ordinal = 0;
  // The largest micro-batch (batch_size x seq_len) the model is built for: rule 3 checks the
  // model at it. Required by make_model_on_device; 0 skips rule 3 (plan_device alone, doctor).
  int batch_size = 0;
  int seq_len = 0;
  // False for a replica of a data-parallel group: a GPU that is present but fails the
  // self-check is then FailedPrecondition under `auto` too, since one CPU replica cannot join GPU
  // replicas (Gloo vs NCCL). A machine without any usable GPU still plans the CPU.
  bool allow_cpu_fallback = true;
  // Test hooks (empty: the real CUDA backend). A test stands the CPU in for the device with
  // cpu_registry() (a family swapped for a wrong implementation) and make_cpu_gpt2.
  const Registry* device_registry = nullptr;
  ModelFactory device_model;
  std::function<bool(std::string* why)> device_available;
  // Rule 3: throws when the device cannot take the model at (B, T) (empty: the CUDA backend's
  // cuda_gpt2_memory_bytes, which validates the shape).
  std::function<void(const model::GPT2Config& config, int B, int T)> device_fits;
  std::string device_name = "cuda";
};

// Decides where and with which kernels to train (rules 1-6). Throws Unavailable for
// `device: cuda` without a usable GPU, the device's error for a model it cannot take under
// `device: cuda`, and FailedPrecondition when the GPU fails the self-check (see above).
DevicePlan plan_device(const model::GPT2Config& config, const PlanOptions& options);

struct ModelOnDevice {
  std::unique_ptr<model::LanguageModel> model;  // on plan.device
  DevicePlan plan;
};
// The model, created on the device the rules above choose, for micro-batches up to
// options.batch_size x options.seq_len (InvalidArgument when they are not set). Throws what
// plan_device throws, and for rule 7 the device's error (cuda) or FailedPrecondition (a replica
// of a group under auto).
ModelOnDevice make_model_on_device(const model::GPT2Config& config, const PlanOptions& options);

}  // namespace longhaul::selfcheck
