// Device and kernel choice with the start-up self-check; see device_plan.h.
#include "longhaul/selfcheck/device_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/selfcheck/cuda_registry.h"

namespace longhaul::selfcheck {
namespace {

using backend_cuda::AttentionKernel;
using backend_cuda::CudaOptions;

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return a.size() != b.size() ? INFINITY : std::sqrt(diff / std::max(norm, 1e-30));
}

std::vector<float> parameters(model::LanguageModel& m) {
  std::vector<float> host(static_cast<size_t>(m.num_parameters()));
  m.download(m.parameters_flat(), host);
  return host;
}

CudaOptions options_from(const Report& report, int ordinal) {
  CudaOptions o;
  o.device = ordinal;
  o.attention = report.chosen(Family::kAttention) == "flash" ? AttentionKernel::kFlash
                                                             : AttentionKernel::kCublas;
  o.bias_epilogue = report.chosen(Family::kMatmulBias) == "cublaslt-epilogue";
  o.gelu_epilogue = report.chosen(Family::kMatmulGelu) == "cublaslt-epilogue";
  o.bias_grad_epilogue = report.chosen(Family::kMatmulBackward) == "cublaslt-epilogue";
  return o;
}

std::string epilogue_name(const CudaOptions& o) {
  const int fused = o.bias_epilogue + o.gelu_epilogue + o.bias_grad_epilogue;
  return fused == 3 ? "fused" : fused == 0 ? "separate" : "mixed";
}

ModelFactory cuda_factory() {
  return [](const model::GPT2Config& c, int B, int T, const CudaOptions& o) {
    return backend_cuda::make_cuda_gpt2(c, B, T, o);
  };
}

ModelFactory cpu_factory() {
  return [](const model::GPT2Config& c, int B, int T, const CudaOptions&) {
    return model::make_cpu_gpt2(c, B, T);
  };
}

}  // namespace

std::vector<Family> cuda_families() { return {std::begin(kAllFamilies), std::end(kAllFamilies)}; }

std::vector<Family> cpu_families() {
  std::vector<Family> f = cuda_families();
  f.erase(std::remove(f.begin(), f.end(), Family::kCast), f.end());
  return f;
}

model::GPT2Config step_check_config(const model::GPT2Config& config) {
  model::GPT2Config c;
  const int hs = config.n_embd / config.n_head;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 2 * hs;
  c.vocab_size = std::min(config.vocab_size, 512);
  c.context_length = std::min(config.context_length, 64);
  return c;
}

ModelStepResult check_model_step(const ModelFactory& candidate, const ModelFactory& reference,
                                 const model::GPT2Config& config, const CudaOptions& options,
                                 uint64_t seed) {
  ModelStepResult r;
  r.ran = true;
  const auto start = std::chrono::steady_clock::now();
  const int B = 2, T = config.context_length;
  const std::string what = "model step (" + std::to_string(config.n_layer) +
                           " layers, C=" + std::to_string(config.n_embd) +
                           ", V=" + std::to_string(config.vocab_size) +
                           ", B=2 T=" + std::to_string(T) + ")";
  try {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
    std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputs[i] = token(rng);
      targets[i] = token(rng);
    }
    auto run = [&](const ModelFactory& make, float* loss, float* norm) {
      auto m = make(config, B, T, options);
      m->init_weights(seed);
      m->zero_grad();
      *loss = m->forward_backward(inputs.data(), targets.data(), B, T, 1.0f);
      *norm = m->gradient_norm();
      model::AdamWOptions adamw;
      m->optimizer_step(adamw, 1e-3f, 1.0f);
      return parameters(*m);
    };
    float loss = 0, norm = 0, ref_loss = 0, ref_norm = 0;
    const std::vector<float> got = run(candidate, &loss, &norm);
    const std::vector<float> want = run(reference, &ref_loss, &ref_norm);
    const double loss_err = std::fabs(static_cast<double>(loss) - ref_loss) / std::fabs(ref_loss);
    const double norm_err = std::fabs(static_cast<double>(norm) - ref_norm) / std::fabs(ref_norm);
    const double param_err = relative_error(got, want);
    r.description = what + ": loss " + sci(loss_err) + " <= 1e-2, gradient norm " + sci(norm_err) +
                    " <= 2e-2, parameters after AdamW " + sci(param_err) +
                    " <= 1e-2 (relative errors)";
    if (!(loss_err <= 1e-2)) {
      r.failure = what + ": loss " + std::to_string(loss) + " vs reference " +
                  std::to_string(ref_loss) + ": relative error " + sci(loss_err) +
                  " > tolerance 1e-2";
    } else if (!(norm_err <= 2e-2)) {
      r.failure = what + ": gradient norm " + std::to_string(norm) + " vs reference " +
                  std::to_string(ref_norm) + ": relative error " + sci(norm_err) +
                  " > tolerance 2e-2";
    } else if (!(param_err <= 1e-2)) {
      r.failure = what + ": parameters after one AdamW step: relative error " + sci(param_err) +
                  " > tolerance 1e-2";
    }
    r.passed = r.failure.empty();
  } catch (const std::exception& e) {
    r.passed = false;
    r.failure = what + ": failed to run: " + e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::map<std::string, std::string> DevicePlan::labels() const {
  if (device != "cuda") {
    return {{"attention", "cpu"}, {"matmul_epilogues", "cpu"}, {"self_check", self_check}};
  }
  std::string attention = "flash";
  if (cuda.attention == AttentionKernel::kCublas) attention = "cublas";
  if (cuda.attention == AttentionKernel::kAuto) attention = "auto";
  return {{"attention", attention},
          {"matmul_epilogues", epilogue_name(cuda)},
          {"self_check", self_check}};
}

std::string DevicePlan::summary() const {
  std::ostringstream s;
  s << "device " << device;
  const auto l = labels();
  if (device == "cuda") {
    s << ", attention " << l.at("attention") << ", matmul epilogues " << l.at("matmul_epilogues");
  }
  s << ", self-check " << self_check;
  if (report) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.2f", report->seconds + report->model_step.seconds);
    s << " (" << report->families.size() << " kernel families"
      << (report->model_step.ran ? " + model step" : "") << " on " << report->backend << ", "
      << seconds << " s)";
  }
  if (!why_cpu.empty()) s << "; on the CPU because: " << why_cpu;
  return s.str();
}

std::string DevicePlan::details() const {
  std::string out = summary() + "\n";
  if (report) out += "\n" + report->to_text();
  return out;
}

namespace {

// The device kernels, one family at a time, with fallbacks; failures and fallbacks are logged.
Report check_kernels(const model::GPT2Config& config, const PlanOptions& options) {
  Registry cuda;
  const Registry* registry = options.device_registry;
  if (registry == nullptr) {
    cuda = cuda_kernel_registry(options.device_ordinal);
    registry = &cuda;
  }
  const CheckShape shape =
      check_shape_for(config.n_embd, config.n_head, config.vocab_size, config.context_length);
  Report report = run_self_check(*registry, shape, cuda_families());
  report.backend = options.device_name;
  for (const FamilyResult& f : report.families) {
    for (const Attempt& a : f.attempts) {
      if (!a.passed) {
        LH_LOG(WARNING) << "self-check: kernel failed" << kv("what", a.failure);
      }
    }
    if (f.status == Status::kFallback) {
      LH_LOG(WARNING) << "self-check: falling back" << kv("family", family_name(f.family))
                      << kv("implementation", *f.chosen);
    }
  }
  return report;
}

// The whole model for one step with the kernels the report chose (into plan.cuda), once more
// with the conservative ones if that fails. Returns whether the conservative ones were needed.
bool check_model_with_fallback(const model::GPT2Config& config, const PlanOptions& options,
                               Report& report, DevicePlan& plan) {
  plan.cuda = options_from(report, options.device_ordinal);
  const ModelFactory device_model = options.device_model ? options.device_model : cuda_factory();
  const model::GPT2Config small = step_check_config(config);
  report.model_step = check_model_step(device_model, cpu_factory(), small, plan.cuda);
  if (report.model_step.passed) return false;
  LH_LOG(WARNING) << "self-check: model step failed with the chosen kernels; retrying with "
                     "cuBLAS attention and separate epilogue kernels"
                  << kv("what", report.model_step.failure);
  CudaOptions conservative;
  conservative.device = options.device_ordinal;
  conservative.attention = AttentionKernel::kCublas;
  conservative.bias_epilogue = conservative.gelu_epilogue = conservative.bias_grad_epilogue = false;
  const ModelStepResult first = report.model_step;
  ModelStepResult second = check_model_step(device_model, cpu_factory(), small, conservative);
  if (!second.passed) {
    report.model_step.failure =
        first.failure + "; with cuBLAS attention and separate kernels: " + second.failure;
    return false;
  }
  plan.cuda = conservative;
  report.model_step = second;
  report.model_step.description += " (after falling back: " + first.failure + ")";
  return true;
}

// The plan once the self-check has run: the device when it passed, else the CPU or an error.
DevicePlan conclude(DevicePlan plan, const PlanOptions& options, bool conservative_used) {
  const Report& report = *plan.report;
  const bool required = options.device == "cuda";
  if (report.passed()) {
    plan.device = options.device_name;
    bool fallback = conservative_used;
    for (const FamilyResult& f : report.families)
      fallback = fallback || f.status == Status::kFallback;
    plan.self_check = fallback ? "fallback" : "passed";
    return plan;
  }
  std::string failures;
  for (const std::string& f : report.failures()) failures += (failures.empty() ? "" : "; ") + f;
  if (!required && !options.allow_cpu_fallback) {
    throw FailedPrecondition("the GPU failed the start-up self-check: " + failures +
                             ". This replica cannot train on the CPU instead: a data-parallel "
                             "group cannot mix CPU and GPU replicas. Run `longhaul-worker doctor` "
                             "on this node");
  }
  if (required) {
    throw FailedPrecondition(
        "the GPU failed the start-up self-check, so it would train a wrong "
        "model: " +
        failures +
        ". Run `longhaul-worker doctor` for the full report; use device: "
        "auto to train on the CPU instead");
  }
  plan.device = "cpu";
  plan.self_check = "failed";
  plan.why_cpu = "the GPU failed the start-up self-check: " + failures;
  return plan;
}

}  // namespace

DevicePlan plan_device(const model::GPT2Config& config, const PlanOptions& options) {
  DevicePlan plan;
  if (options.device == "cpu") {
    plan.device = "cpu";
    plan.self_check = "n/a";
    return plan;
  }
  const bool required = options.device == "cuda";
  std::string why;
  const bool available = options.device_available ? options.device_available(&why)
                                                  : backend_cuda::cuda_available(&why);
  if (!available) {
    if (required) {
      throw Unavailable("no usable GPU: " + why + "; use device: cpu (or auto to fall back)");
    }
    plan.device = "cpu";
    plan.self_check = "n/a";
    plan.why_cpu = "no usable GPU: " + why;
    return plan;
  }
  if (options.batch_size > 0 && options.seq_len > 0) {
    try {
      if (options.device_fits) {
        options.device_fits(config, options.batch_size, options.seq_len);
      } else {
        backend_cuda::cuda_gpt2_memory_bytes(config, options.batch_size, options.seq_len);
      }
    } catch (const Error& e) {
      if (required) throw;
      plan.device = "cpu";
      plan.self_check = "n/a";
      plan.why_cpu = e.what();
      return plan;
    }
  }
  plan.cuda.device = options.device_ordinal;
  if (!options.self_check) {
    // The preferred kernels, as kAuto would pick them, so the labels say which.
    plan.cuda.attention =
        config.n_embd / config.n_head == 64 ? AttentionKernel::kFlash : AttentionKernel::kCublas;
    plan.device = options.device_name;
    plan.self_check = "off";
    return plan;
  }
  Report report = check_kernels(config, options);
  bool kernels_ok = true;
  for (const FamilyResult& f : report.families)
    kernels_ok = kernels_ok && f.status != Status::kFail;
  const bool conservative_used =
      kernels_ok && check_model_with_fallback(config, options, report, plan);
  plan.report = std::move(report);
  return conclude(std::move(plan), options, conservative_used);
}

namespace {

constexpr const char* kNoGpu =
    "device auto: no usable GPU, training on CPU (device: cpu silences this, device: cuda makes "
    "it an error)";
constexpr const char* kFailedSelfCheck =
    "device auto: the GPU failed the start-up self-check, training on CPU (device: cpu silences "
    "this, device: cuda makes it an error; `longhaul-worker doctor` shows the full report)";

}  // namespace

ModelOnDevice make_model_on_device(const model::GPT2Config& config, const PlanOptions& options) {
  const int B = options.batch_size, T = options.seq_len;
  if (B < 1 || T < 1) {
    throw InvalidArgument(
        "make_model_on_device needs the micro-batch the model is built for "
        "(PlanOptions batch_size and seq_len), got " +
        std::to_string(B) + " x " + std::to_string(T));
  }
  ModelOnDevice out;
  out.plan = plan_device(config, options);
  if (out.plan.device != "cpu") {
    const ModelFactory make = options.device_model ? options.device_model : cuda_factory();
    try {
      out.model = make(config, B, T, out.plan.cuda);
      LH_LOG(INFO) << "training on the GPU" << kv("plan", out.plan.summary());
      return out;
    } catch (const Error& e) {
      // Rule 7: out of memory, a broken context, ...
      if (options.device == "cuda") throw;
      if (!options.allow_cpu_fallback) {
        throw FailedPrecondition(std::string("this replica's GPU failed at start (") + e.what() +
                                 "); the other replicas train on theirs, and a data-parallel "
                                 "group cannot mix CPU and GPU replicas");
      }
      // The self-check's verdict and report stay: they are what the GPU did before it failed.
      out.plan.device = "cpu";
      out.plan.cuda = CudaOptions{};
      out.plan.why_cpu = e.what();
    }
  }
  if (!out.plan.why_cpu.empty()) {
    LH_LOG(WARNING) << (out.plan.self_check == "failed" ? kFailedSelfCheck : kNoGpu)
                    << kv("why", out.plan.why_cpu);
  }
  out.model = model::make_cpu_gpt2(config, B, T);
  return out;
}

}  // namespace longhaul::selfcheck
