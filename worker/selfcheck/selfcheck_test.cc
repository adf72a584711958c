// The self-check harness and the device plan on the CPU: the CPU kernels pass the
// double-precision reference at real model shapes; a deliberately wrong implementation of any
// family is caught and named with its output, shape, error and tolerance; and with the CPU
// standing in for the device (a test registry of CPU kernels under the CUDA implementations'
// names, the CPU model as the "device" model) the plan takes the right fallback, trains on the
// CPU with the reason under `device: auto`, and refuses under `device: cuda`.
#include "longhaul/selfcheck/selfcheck.h"

#include <algorithm>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/selfcheck/cuda_registry.h"
#include "longhaul/selfcheck/device_plan.h"
#include "selfcheck_internal.h"

namespace longhaul::selfcheck {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Makes one output of an implementation wrong by 10% (a plausible-looking but wrong kernel).
Implementation sabotaged(Implementation impl, const std::string& output) {
  auto run = impl.run;
  impl.run = [run, output](const Case& k) {
    Tensors t = run(k);
    for (float& x : t.at(output)) x *= 1.1f;
    return t;
  };
  return impl;
}

// The CPU kernels under the CUDA implementations' names and at bf16 precision: a stand-in
// "device" for the plan. `sabotage(impl)` may break any of them.
Registry fake_device(const std::function<void(Implementation&)>& sabotage = {}) {
  const Registry cpu = cpu_registry();
  Registry device;
  auto add = [&](Implementation impl) {
    impl.precision = Precision::kBf16;
    if (sabotage) sabotage(impl);
    device.add(std::move(impl));
  };
  for (Family f : cpu_families()) {
    const Implementation& base = cpu.implementations(f).front();
    std::vector<std::string> names = {"cuda"};
    if (f == Family::kAttention) names = {"flash", "cublas"};
    if (f == Family::kMatmulBias || f == Family::kMatmulGelu || f == Family::kMatmulBackward) {
      names = {"cublaslt-epilogue", "separate-kernel"};
    }
    for (const std::string& name : names) {
      Implementation impl = base;
      impl.name = name;
      if (name == "flash") impl.supports = [](const CheckShape& s) { return s.HS == 64; };
      add(std::move(impl));
    }
  }
  Implementation cast;
  cast.family = Family::kCast;
  cast.name = "cuda";
  cast.run = [](const Case& k) { return Tensors{{"out", round_bf16(k.inputs.at("x"))}}; };
  add(std::move(cast));
  return device;
}

PlanOptions fake_plan(const std::string& device, const Registry* registry) {
  PlanOptions o;
  o.device = device;
  o.device_registry = registry;
  o.device_available = [](std::string*) { return true; };
  o.device_model = [](const model::GPT2Config& c, int B, int T, const backend_cuda::CudaOptions&) {
    return model::make_cpu_gpt2(c, B, T);
  };
  o.device_name = "cuda";
  return o;
}

model::GPT2Config gpt2_like() {
  model::GPT2Config c;  // head size 64 as in every GPT-2 size
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.vocab_size = 50257;
  c.context_length = 1024;
  return c;
}

TEST(SelfCheckTest, CpuKernelsPassTheReferenceAtRealHeadSizes) {
  for (const CheckShape& shape :
       {check_shape_for(128, 4, 256, 128), check_shape_for(768, 12, 50257, 1024)}) {
    const Report r = run_self_check(cpu_registry(), shape, cpu_families());
    EXPECT_TRUE(r.passed()) << r.to_text();
    ASSERT_EQ(r.families.size(), cpu_families().size());
    for (const FamilyResult& f : r.families) {
      EXPECT_EQ(f.status, Status::kPass) << family_name(f.family);
      ASSERT_EQ(f.attempts.size(), 1u);
      for (const OutputCheck& c : f.attempts[0].outputs) {
        EXPECT_LE(c.error, c.tolerance) << family_name(f.family) << " " << c.output;
      }
    }
  }
  EXPECT_EQ(check_shape_for(128, 4, 256, 128).HS, 32);
  EXPECT_EQ(check_shape_for(768, 12, 50257, 1024).to_string(), "B=2 T=80 C=128 NH=2 HS=64 V=300");
}

// On a GPU: the real CUDA kernels pass at both head sizes (64 takes the flash kernels, 32 the
// cuBLAS attention path), and the real plan trains on the GPU with the preferred kernels.
TEST(SelfCheckTest, CudaKernelsPassTheReferenceOnThisGpu) {
  std::string why;
  if (!backend_cuda::cuda_available(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  for (const CheckShape& shape :
       {check_shape_for(768, 12, 50257, 1024), check_shape_for(128, 4, 256, 128)}) {
    Report r = run_self_check(cuda_kernel_registry(0), shape, cuda_families());
    r.backend = "cuda";
    EXPECT_TRUE(r.passed()) << r.to_text();
    for (const FamilyResult& f : r.families) {
      EXPECT_EQ(f.status, Status::kPass) << family_name(f.family) << "\n" << r.to_text();
    }
    std::cout << r.to_text();
  }
  PlanOptions options;
  options.device = "cuda";
  const DevicePlan plan = plan_device(gpt2_like(), options);
  EXPECT_EQ(plan.device, "cuda");
  EXPECT_EQ(plan.self_check, "passed") << plan.details();
  EXPECT_TRUE(plan.report->model_step.passed) << plan.report->model_step.failure;
  std::cout << plan.details();
}

// Every family's check catches a wrong kernel in each of its outputs.
class WrongKernelTest : public ::testing::TestWithParam<Family> {};

TEST_P(WrongKernelTest, IsNamedWithItsOutputShapeErrorAndTolerance) {
  const Family family = GetParam();
  const CheckShape shape = check_shape_for(128, 2, 256, 128);
  const Case k = make_case(family, shape, Precision::kFp32, 1);
  for (const auto& [output, expected] : k.expected) {
    if (output == "params_bf16") continue;  // produced only by the GPU
    Registry r = cpu_registry();
    r.replace(sabotaged(r.implementations(family).front(), output));
    const Report report = run_self_check(r, shape, {family});
    ASSERT_EQ(report.families.size(), 1u);
    EXPECT_EQ(report.families[0].status, Status::kFail) << family_name(family) << " " << output;
    EXPECT_FALSE(report.passed());
    const std::vector<std::string> failures = report.failures();
    ASSERT_EQ(failures.size(), 1u);
    const std::string prefix = std::string(family_name(family)) + "/cpu: output ";
    EXPECT_TRUE(contains(failures[0], prefix)) << failures[0];
    EXPECT_TRUE(contains(failures[0], "(" + shape.to_string() + "): relative error "))
        << failures[0];
    EXPECT_TRUE(contains(failures[0], "> tolerance 1.0e-05 (max abs error ")) << failures[0];
    EXPECT_TRUE(contains(report.to_text(), "FAIL")) << report.to_text();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, WrongKernelTest,
                         ::testing::ValuesIn(std::vector<Family>(
                             std::begin(kAllFamilies), std::end(kAllFamilies) - 1)),  // no kCast
                         [](const ::testing::TestParamInfo<Family>& info) {
                           std::string name(family_name(info.param));
                           std::replace_if(
                               name.begin(), name.end(), [](char c) { return !std::isalnum(c); },
                               '_');
                           return name;
                         });

TEST(SelfCheckTest, AnImplementationThatThrowsIsAFailureNotACrash) {
  Registry r = cpu_registry();
  Implementation broken = r.implementations(Family::kGelu).front();
  broken.run = [](const Case&) -> Tensors { throw Internal("launch failed: no kernel image"); };
  r.replace(broken);
  const Report report = run_self_check(r, check_shape_for(128, 2, 256, 128), {Family::kGelu});
  EXPECT_EQ(report.families[0].status, Status::kFail);
  EXPECT_TRUE(contains(report.failures()[0],
                       "gelu/cpu (B=2 T=80 C=128 NH=2 HS=64 V=256): failed "
                       "to run: launch failed: no kernel image"))
      << report.failures()[0];
  EXPECT_THROW(r.replace(Implementation{Family::kGelu, "nope", Precision::kFp32, {}, {}}),
               InvalidArgument);
}

TEST(SelfCheckTest, AllreduceCheckAcceptsTheMeanAndNamesAWrongCollective) {
  // Two ranks simulated in one process: the "collective" replaces the values by the true mean
  // (rank 0's and rank 1's values are regenerated from the same seeds the check uses).
  const int world = 2;
  std::vector<std::vector<float>> all(world);
  auto record = [&](int rank) { return [&all, rank](std::vector<float>& v) { all[rank] = v; }; };
  for (int r = 0; r < world; ++r) check_allreduce_mean(record(r), "test", r, world, 1000);
  auto mean = [&](std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * (all[0][i] + all[1][i]);
  };
  const CollectiveCheck good = check_allreduce_mean(mean, "nccl", 1, world, 1000);
  EXPECT_TRUE(good.passed) << good.failure;
  EXPECT_LE(good.error, good.tolerance);
  // A sum where a mean is promised (a wrong reduction op), and a collective that does nothing.
  auto sum = [&](std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = all[0][i] + all[1][i];
  };
  const CollectiveCheck wrong = check_allreduce_mean(sum, "nccl", 1, world, 1000);
  EXPECT_FALSE(wrong.passed);
  EXPECT_TRUE(contains(wrong.failure, "allreduce/nccl (rank 1 of 2, 1000 floats): relative error "))
      << wrong.failure;
  EXPECT_FALSE(check_allreduce_mean([](std::vector<float>&) {}, "nccl", 0, world, 1000).passed);
  const CollectiveCheck thrown = check_allreduce_mean(
      [](std::vector<float>&) { throw Aborted("peer lost"); }, "nccl", 0, world, 1000);
  EXPECT_TRUE(contains(thrown.failure, "failed to run: peer lost")) << thrown.failure;
}

TEST(DevicePlanTest, AHealthyDeviceGetsThePreferredKernels) {
  const Registry device = fake_device();
  const DevicePlan plan = plan_device(gpt2_like(), fake_plan("auto", &device));
  EXPECT_EQ(plan.device, "cuda");
  EXPECT_EQ(plan.self_check, "passed");
  EXPECT_EQ(plan.cuda.attention, backend_cuda::AttentionKernel::kFlash);
  EXPECT_TRUE(plan.cuda.bias_epilogue && plan.cuda.gelu_epilogue && plan.cuda.bias_grad_epilogue);
  ASSERT_TRUE(plan.report.has_value());
  EXPECT_TRUE(plan.report->model_step.ran);
  EXPECT_TRUE(plan.report->model_step.passed) << plan.report->model_step.failure;
  EXPECT_EQ(plan.labels(),
            (std::map<std::string, std::string>{
                {"attention", "flash"}, {"matmul_epilogues", "fused"}, {"self_check", "passed"}}));
  EXPECT_TRUE(contains(plan.summary(),
                       "device cuda, attention flash, matmul epilogues fused, "
                       "self-check passed (12 kernel families + model step"))
      << plan.summary();
  // A head size the flash kernels do not take: cuBLAS attention, and that is not a fallback.
  model::GPT2Config hs32 = gpt2_like();
  hs32.n_embd = 384;
  const DevicePlan small = plan_device(hs32, fake_plan("auto", &device));
  EXPECT_EQ(small.cuda.attention, backend_cuda::AttentionKernel::kCublas);
  EXPECT_EQ(small.self_check, "passed");
}

TEST(DevicePlanTest, WrongFlashAttentionFallsBackToCublasAndSaysSo) {
  const Registry device = fake_device([](Implementation& impl) {
    if (impl.name == "flash") impl = sabotaged(impl, "dqkv");
  });
  const DevicePlan plan = plan_device(gpt2_like(), fake_plan("cuda", &device));
  EXPECT_EQ(plan.device, "cuda");
  EXPECT_EQ(plan.self_check, "fallback");
  EXPECT_EQ(plan.cuda.attention, backend_cuda::AttentionKernel::kCublas);
  EXPECT_TRUE(plan.cuda.gelu_epilogue);
  const FamilyResult* attention = plan.report->family(Family::kAttention);
  ASSERT_NE(attention, nullptr);
  EXPECT_EQ(attention->status, Status::kFallback);
  EXPECT_EQ(plan.labels().at("attention"), "cublas");
  const std::string table = plan.details();
  EXPECT_TRUE(contains(table, "attention            flash              FAIL      dqkv")) << table;
  EXPECT_TRUE(contains(table, "attention            cublas             FALLBACK")) << table;
}

TEST(DevicePlanTest, WrongCublasLtEpilogueFallsBackToTheSeparateKernel) {
  const Registry device = fake_device([](Implementation& impl) {
    if (impl.family == Family::kMatmulGelu && impl.name == "cublaslt-epilogue") {
      impl = sabotaged(impl, "out");
    }
  });
  const DevicePlan plan = plan_device(gpt2_like(), fake_plan("auto", &device));
  EXPECT_EQ(plan.device, "cuda");
  EXPECT_FALSE(plan.cuda.gelu_epilogue);
  EXPECT_TRUE(plan.cuda.bias_epilogue);
  EXPECT_TRUE(plan.cuda.bias_grad_epilogue);
  EXPECT_EQ(plan.labels().at("matmul_epilogues"), "mixed");
  EXPECT_EQ(plan.self_check, "fallback");
}

TEST(DevicePlanTest, AFamilyWithNoCorrectKernelMeansCpuUnderAutoAndExitTwoUnderCuda) {
  const Registry device = fake_device([](Implementation& impl) {
    if (impl.family == Family::kLayerNorm) impl = sabotaged(impl, "dinp");
  });
  const DevicePlan plan = plan_device(gpt2_like(), fake_plan("auto", &device));
  EXPECT_EQ(plan.device, "cpu");
  EXPECT_EQ(plan.self_check, "failed");
  EXPECT_TRUE(contains(plan.why_cpu,
                       "the GPU failed the start-up self-check: "
                       "layernorm+residual/cuda: output dinp (B=2 T=80 C=128 NH=2 "
                       "HS=64 V=300): relative error 1.0e-01 > tolerance 1.0e-02"))
      << plan.why_cpu;
  EXPECT_EQ(plan.labels().at("attention"), "cpu");

  // A replica of a data-parallel group cannot fall back alone.
  PlanOptions replica = fake_plan("auto", &device);
  replica.allow_cpu_fallback = false;
  try {
    plan_device(gpt2_like(), replica);
    FAIL() << "a replica fell back to the CPU alone";
  } catch (const FailedPrecondition& e) {
    EXPECT_TRUE(contains(e.what(), "cannot mix CPU and GPU replicas")) << e.what();
  }

  try {
    plan_device(gpt2_like(), fake_plan("cuda", &device));
    FAIL() << "device: cuda trained on a GPU that failed the self-check";
  } catch (const FailedPrecondition& e) {
    EXPECT_TRUE(contains(e.what(), "layernorm+residual/cuda: output dinp")) << e.what();
    EXPECT_TRUE(contains(e.what(), "longhaul-worker doctor")) << e.what();
  }
}

TEST(DevicePlanTest, NoDeviceAndSelfCheckOffAndCpu) {
  PlanOptions none = fake_plan("auto", nullptr);
  none.device_available = [](std::string* why) {
    *why = "no CUDA device";
    return false;
  };
  const DevicePlan cpu = plan_device(gpt2_like(), none);
  EXPECT_EQ(cpu.device, "cpu");
  EXPECT_EQ(cpu.why_cpu, "no usable GPU: no CUDA device");
  none.device = "cuda";
  EXPECT_THROW(plan_device(gpt2_like(), none), Unavailable);

  const Registry device = fake_device([](Implementation& impl) { impl = sabotaged(impl, "out"); });
  PlanOptions off = fake_plan("cuda", &device);
  off.self_check = false;
  const DevicePlan unchecked = plan_device(gpt2_like(), off);
  EXPECT_EQ(unchecked.device, "cuda");
  EXPECT_EQ(unchecked.self_check, "off");
  EXPECT_FALSE(unchecked.report.has_value());
  EXPECT_EQ(unchecked.labels().at("attention"), "flash");
  EXPECT_EQ(unchecked.labels().at("self_check"), "off");

  EXPECT_EQ(plan_device(gpt2_like(), fake_plan("cpu", &device)).self_check, "n/a");
}

TEST(DevicePlanTest, AWrongModelStepIsCaughtAfterEveryKernelPassed) {
  const Registry device = fake_device();
  PlanOptions o = fake_plan("auto", &device);
  // A "device" model of another initialisation: every kernel passes, the whole step does not.
  o.device_model = [](const model::GPT2Config& c, int B, int T, const backend_cuda::CudaOptions&) {
    model::GPT2Config wider = c;
    wider.n_layer = c.n_layer + 1;
    return model::make_cpu_gpt2(wider, B, T);
  };
  const DevicePlan plan = plan_device(gpt2_like(), o);
  EXPECT_EQ(plan.device, "cpu");
  ASSERT_TRUE(plan.report.has_value());
  EXPECT_FALSE(plan.report->model_step.passed);
  EXPECT_TRUE(contains(plan.why_cpu, "model step (2 layers, C=128, V=512, B=2 T=64)"))
      << plan.why_cpu;
  EXPECT_TRUE(contains(plan.why_cpu, "with cuBLAS attention and separate kernels")) << plan.why_cpu;
}

// make_model_on_device: the device decided once, with the model created on it. A small model at
// a small micro-batch; the "device" model is the CPU model, counted.
model::GPT2Config small_model() {
  model::GPT2Config c = model::GPT2Config::preset("tiny");
  c.n_layer = 1;
  return c;
}

struct FakeDevice {
  Registry registry = fake_device();
  int models_started = 0;  // device models of the run's micro-batch (the step check's are B=2)
  std::function<void()> fail_at_start;  // throws: the device model fails to start

  PlanOptions options(const std::string& device) {
    PlanOptions o = fake_plan(device, &registry);
    o.batch_size = 4;
    o.seq_len = 16;
    o.device_fits = [](const model::GPT2Config&, int, int) {};
    o.device_model = [this](const model::GPT2Config& c, int B, int T,
                            const backend_cuda::CudaOptions&) {
      if (B == 4 && T == 16) {
        ++models_started;
        if (fail_at_start) fail_at_start();
      }
      return model::make_cpu_gpt2(c, B, T);
    };
    return o;
  }
};

TEST(MakeModelOnDeviceTest, AHealthyDeviceGetsTheModelWithThePlan) {
  FakeDevice device;
  const ModelOnDevice made = make_model_on_device(small_model(), device.options("auto"));
  EXPECT_EQ(made.plan.device, "cuda");
  EXPECT_EQ(made.plan.self_check, "passed");
  EXPECT_EQ(device.models_started, 1);
  ASSERT_NE(made.model, nullptr);
  EXPECT_EQ(made.model->max_batch_size(), 4);
  EXPECT_EQ(made.model->max_seq_len(), 16);
}

TEST(MakeModelOnDeviceTest, DeviceCpuAndNoDeviceTrainOnTheCpu) {
  FakeDevice device;
  const ModelOnDevice cpu = make_model_on_device(small_model(), device.options("cpu"));
  EXPECT_EQ(cpu.plan.device, "cpu");
  EXPECT_EQ(cpu.plan.why_cpu, "");
  EXPECT_EQ(cpu.model->device_name(), "cpu");
  EXPECT_EQ(cpu.model->memory_space(), model::MemorySpace::kHost);

  PlanOptions none = device.options("auto");
  none.device_available = [](std::string* why) {
    *why = "no CUDA device";
    return false;
  };
  const ModelOnDevice fallback = make_model_on_device(small_model(), none);
  EXPECT_EQ(fallback.plan.device, "cpu");
  EXPECT_EQ(fallback.plan.why_cpu, "no usable GPU: no CUDA device");
  EXPECT_EQ(device.models_started, 0);
  none.device = "cuda";
  EXPECT_THROW(make_model_on_device(small_model(), none), Unavailable);
}

// Rule 3: decided on the host before any GPU work, the same on every replica, so a replica of a
// group falls back too; device: cuda gets the device's error.
TEST(MakeModelOnDeviceTest, AModelTheDeviceCannotTakeIsTheCpuUnderAutoEvenInAGroup) {
  FakeDevice device;
  PlanOptions o = device.options("auto");
  o.allow_cpu_fallback = false;
  o.device_fits = [](const model::GPT2Config& c, int, int) {
    throw InvalidArgument("n_embd " + std::to_string(c.n_embd) + " is not a multiple of 8");
  };
  const ModelOnDevice made = make_model_on_device(small_model(), o);
  EXPECT_EQ(made.plan.device, "cpu");
  EXPECT_EQ(made.plan.self_check, "n/a");
  EXPECT_EQ(made.plan.why_cpu, "n_embd 128 is not a multiple of 8");
  EXPECT_FALSE(made.plan.report.has_value()) << "the self-check ran for a model it cannot take";
  EXPECT_EQ(device.models_started, 0);
  o.device = "cuda";
  EXPECT_THROW(make_model_on_device(small_model(), o), InvalidArgument);
}

// Rule 7: out of memory, a broken context, ... after the plan chose the device.
TEST(MakeModelOnDeviceTest, ADeviceModelThatFailsAtStartIsTheCpuAloneAndAnErrorInAGroup) {
  FakeDevice device;
  device.fail_at_start = [] { throw Internal("out of memory (test)"); };
  const ModelOnDevice alone = make_model_on_device(small_model(), device.options("auto"));
  EXPECT_EQ(alone.plan.device, "cpu");
  EXPECT_EQ(alone.plan.why_cpu, "out of memory (test)");
  EXPECT_EQ(alone.plan.self_check, "passed") << "what the self-check found is kept";
  EXPECT_EQ(alone.plan.labels().at("attention"), "cpu");
  EXPECT_TRUE(contains(alone.plan.summary(), "on the CPU because: out of memory (test)"))
      << alone.plan.summary();
  EXPECT_EQ(alone.model->device_name(), "cpu");

  PlanOptions replica = device.options("auto");
  replica.allow_cpu_fallback = false;
  try {
    make_model_on_device(small_model(), replica);
    FAIL() << "a replica fell back to the CPU alone";
  } catch (const FailedPrecondition& e) {
    EXPECT_TRUE(contains(e.what(), "this replica's GPU failed at start (out of memory (test))"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "cannot mix CPU and GPU replicas")) << e.what();
  }
  EXPECT_THROW(make_model_on_device(small_model(), device.options("cuda")), Internal);
}

TEST(MakeModelOnDeviceTest, AGpuThatFailsTheSelfCheckTrainsOnTheCpuUnderAuto) {
  FakeDevice device;
  device.registry = fake_device([](Implementation& impl) {
    if (impl.family == Family::kGelu) impl = sabotaged(impl, "out");
  });
  const ModelOnDevice made = make_model_on_device(small_model(), device.options("auto"));
  EXPECT_EQ(made.plan.device, "cpu");
  EXPECT_EQ(made.plan.self_check, "failed");
  EXPECT_TRUE(contains(made.plan.why_cpu, "the GPU failed the start-up self-check: gelu"))
      << made.plan.why_cpu;
  EXPECT_EQ(device.models_started, 0);
  EXPECT_THROW(make_model_on_device(small_model(), device.options("cuda")), FailedPrecondition);
}

TEST(MakeModelOnDeviceTest, NeedsTheMicroBatch) {
  FakeDevice device;
  PlanOptions o = device.options("cpu");
  o.batch_size = 0;
  EXPECT_THROW(make_model_on_device(small_model(), o), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::selfcheck
