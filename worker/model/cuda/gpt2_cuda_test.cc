// The CUDA GPT-2 against the CPU model on the same weights, its determinism, snapshots and state
// transfer; and the backend's availability contract, which is checked on every machine.
//
// Tolerances: the CUDA model computes in bf16 with fp32 accumulation, the CPU model in fp32. The
// loss agrees to <= 1e-2 relative; gradients pass through every bf16 activation of the network
// (about a dozen roundings of 2^-9 each on the way back), so each tensor's gradient is compared at
// <= 5e-2 relative (||gpu - cpu|| / ||cpu||). After one AdamW step the parameters agree to 1e-2.
// GPU cases report SKIPPED with the reason when no usable GPU is present.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/base/error.h>
#include <longhaul/model/cpu/gpt2_cpu.h>

#include "longhaul/model/cuda/cuda_backend.h"

namespace longhaul::backend_cuda {
namespace {

#define SKIP_WITHOUT_GPU()                                                 \
  do {                                                                     \
    std::string why_no_gpu;                                                \
    if (!cuda_available(&why_no_gpu)) {                                    \
      GTEST_SKIP() << "no usable GPU, CUDA model not run: " << why_no_gpu; \
    }                                                                      \
  } while (0)

// Small but exercising every path: vocab padded 300 -> 384, two layers, head size 64 (so both
// attention kernels apply), T = 96 (not a multiple of the flash kernels' 64-row tiles).
model::GPT2Config test_config() {
  model::GPT2Config c;
  c.vocab_size = 300;
  c.context_length = 128;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 128;
  return c;
}

constexpr int kB = 2, kT = 96;

CudaOptions options_for(AttentionKernel attention) {
  CudaOptions options;
  options.attention = attention;
  return options;
}

std::string attention_name(const ::testing::TestParamInfo<AttentionKernel>& info) {
  return info.param == AttentionKernel::kFlash ? "Flash" : "Cublas";
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch random_batch(std::mt19937& rng, int vocab) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  Batch b;
  for (int i = 0; i < kB * kT; ++i) {
    b.inputs.push_back(token(rng));
    b.targets.push_back(token(rng));
  }
  return b;
}

std::vector<float> host_copy(model::LanguageModel& model, std::span<float> device) {
  std::vector<float> out(device.size());
  model.download(device, out);
  return out;
}

double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

TEST(CudaAvailabilityTest, ExplainsWhyWhenUnavailable) {
  std::string why;
  if (cuda_available(&why)) {
    GTEST_SKIP() << "a GPU is present: the unavailable path is not reachable here";
  }
  EXPECT_FALSE(why.empty());
  try {
    make_cuda_gpt2(test_config(), kB, kT);
    FAIL() << "make_cuda_gpt2 succeeded without a usable GPU";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("device: cpu"), std::string::npos) << e.what();
  }
}

// Host-side sizing: runs on every machine with the CUDA backend built.
TEST(CudaGpt2MemoryTest, FlashAttentionNeedsLessMemoryAndSizesGrowWithBatch) {
#if LONGHAUL_HAVE_CUDA
  const model::GPT2Config gpt2 = model::GPT2Config::preset("gpt2-124m");
  const int64_t flash8 =
      cuda_gpt2_memory_bytes(gpt2, 8, 1024, options_for(AttentionKernel::kFlash));
  const int64_t flash16 =
      cuda_gpt2_memory_bytes(gpt2, 16, 1024, options_for(AttentionKernel::kFlash));
  const int64_t cublas16 =
      cuda_gpt2_memory_bytes(gpt2, 16, 1024, options_for(AttentionKernel::kCublas));
  // Parameters, gradients and two moments in fp32 alone are 16 bytes per parameter.
  EXPECT_GT(flash8, 16 * gpt2.num_parameters());
  EXPECT_GT(flash16, flash8);
  // The cuBLAS path keeps (B, NH, T, T) probabilities per layer: 12 * 16 * 12 * 1024^2 * 2 bytes.
  EXPECT_GT(cublas16 - flash16, int64_t{12} * 16 * 12 * 1024 * 1024 * 2);
  // The largest micro-batches an 80 GB GPU holds have N * Vp > 2^31 logits (B >= 42 at T = 1024):
  // the sizing is 64-bit and covers at least the bf16 logits.
  const int64_t flash128 =
      cuda_gpt2_memory_bytes(gpt2, 128, 1024, options_for(AttentionKernel::kFlash));
  EXPECT_GT(flash128, int64_t{128} * 1024 * 50304 * 2);
  // Activations grow linearly with B: 112 more sequences cost 14 times what 8 more do.
  EXPECT_NEAR(static_cast<double>(flash128 - flash16), 14.0 * static_cast<double>(flash16 - flash8),
              0.01 * static_cast<double>(flash128 - flash16));
  model::GPT2Config four_heads = test_config();
  four_heads.n_head = 4;
  EXPECT_THROW(cuda_gpt2_memory_bytes(four_heads, kB, kT, options_for(AttentionKernel::kFlash)),
               InvalidArgument);
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

TEST(StateTransferTest, MovesCudaModelStateThroughHostBuffers) {
  SKIP_WITHOUT_GPU();
  const auto gpu = make_cuda_gpt2(test_config(), kB, kT);
  std::vector<float> host(gpu->parameters_flat().size(), 0.25f);
  gpu->upload(host, gpu->parameters_flat());
  std::vector<float> back(host.size());
  gpu->download(gpu->parameters_flat(), back);
  EXPECT_EQ(back, host);
  // A host span is not the model's memory: refused, as by the CPU model.
  EXPECT_THROW(gpu->download(host, back), InvalidArgument);
}

TEST(CudaGpt2Test, InitialisesLikeTheCpuModelWithHuggingFaceNames) {
  SKIP_WITHOUT_GPU();
  const auto cpu = model::make_cpu_gpt2(test_config(), kB, kT);
  const auto gpu = make_cuda_gpt2(test_config(), kB, kT);
  cpu->init_weights(42);
  gpu->init_weights(42);
  EXPECT_EQ(gpu->device_name(), "cuda");
  EXPECT_EQ(gpu->memory_space(), model::MemorySpace::kDevice);
  EXPECT_EQ(gpu->numerical_environment().rfind("cuda: ", 0), 0u) << gpu->numerical_environment();
  EXPECT_EQ(gpu->numerical_environment().find("unknown GPU"), std::string::npos)
      << gpu->numerical_environment();
  EXPECT_EQ(gpu->num_parameters(), cpu->num_parameters());
  const std::vector<model::NamedTensor> c = cpu->named_parameters(), g = gpu->named_parameters();
  ASSERT_EQ(g.size(), c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(g[i].name, c[i].name);
    EXPECT_EQ(g[i].shape, c[i].shape);  // real vocab: the padding is internal
  }
  const std::vector<float> gpu_params = host_copy(*gpu, gpu->parameters_flat());
  const std::span<float> cpu_params = cpu->parameters_flat();
  EXPECT_EQ(0, std::memcmp(gpu_params.data(), cpu_params.data(), cpu_params.size_bytes()));
}

// The self-check's epilogue fallback: a model whose dense layers run plain GEMMs plus separate
// bias / GELU / bias-gradient kernels computes the same step as the CPU model.
TEST(CudaGpt2Test, SeparateEpilogueKernelsTrainLikeTheCpuModel) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  const model::GPT2Config config = test_config();
  CudaOptions separate;
  separate.bias_epilogue = separate.gelu_epilogue = separate.bias_grad_epilogue = false;
  const auto cpu = model::make_cpu_gpt2(config, kB, kT);
  const auto gpu = make_cuda_gpt2(config, kB, kT, separate);
  cpu->init_weights(7);
  gpu->init_weights(7);
  const Batch batch = random_batch(rng, config.vocab_size);
  const float cpu_loss =
      cpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 1);
  const float gpu_loss =
      gpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 1);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-2 * cpu_loss);
  EXPECT_NEAR(gpu->gradient_norm(), cpu->gradient_norm(), 2e-2 * cpu->gradient_norm());
  const model::AdamWOptions adamw;
  cpu->optimizer_step(adamw, 1e-3f, 1.0f);
  gpu->optimizer_step(adamw, 1e-3f, 1.0f);
  EXPECT_LT(relative_error(host_copy(*gpu, gpu->parameters_flat()), cpu->parameters_flat()), 1e-2);
}

// The step and determinism checks run with each attention implementation.
class CudaGpt2AttentionTest : public ::testing::TestWithParam<AttentionKernel> {};

TEST_P(CudaGpt2AttentionTest, TrainingStepMatchesCpuModel) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  const model::GPT2Config config = test_config();
  const auto cpu = model::make_cpu_gpt2(config, kB, kT);
  const auto gpu = make_cuda_gpt2(config, kB, kT, options_for(GetParam()));
  cpu->init_weights(7);
  gpu->init_weights(7);
  const Batch batch = random_batch(rng, config.vocab_size);

  const float cpu_loss =
      cpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 1);
  const float gpu_loss =
      gpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 1);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-2 * cpu_loss);
  EXPECT_NEAR(gpu->forward_loss(batch.inputs.data(), batch.targets.data(), kB, kT), cpu_loss,
              1e-2 * cpu_loss);

  // Gradients, tensor by tensor (named_parameters' data offsets index the gradient buffer too).
  const std::vector<float> gpu_grads = host_copy(*gpu, gpu->gradients_flat());
  const std::span<float> cpu_grads = cpu->gradients_flat();
  const std::vector<model::NamedTensor> names = cpu->named_parameters();
  for (const model::NamedTensor& t : names) {
    const size_t offset = static_cast<size_t>(t.data - cpu->parameters_flat().data());
    const size_t n = static_cast<size_t>(t.numel());
    EXPECT_LT(relative_error(std::span<const float>(gpu_grads).subspan(offset, n),
                             cpu_grads.subspan(offset, n)),
              5e-2)
        << t.name;
  }
  EXPECT_NEAR(gpu->gradient_norm(), cpu->gradient_norm(), 2e-2 * cpu->gradient_norm());

  const model::AdamWOptions adamw;
  const float norm = cpu->gradient_norm();
  const float scale = norm > 1.0f ? 1.0f / norm : 1.0f;
  cpu->optimizer_step(adamw, 1e-3f, scale);
  gpu->optimizer_step(adamw, 1e-3f, scale);
  EXPECT_EQ(gpu->optimizer_step_count(), 1);
  const std::vector<float> gpu_params = host_copy(*gpu, gpu->parameters_flat());
  EXPECT_LT(relative_error(gpu_params, cpu->parameters_flat()), 1e-2);
  const float cpu_next = cpu->forward_loss(batch.inputs.data(), batch.targets.data(), kB, kT);
  const float gpu_next = gpu->forward_loss(batch.inputs.data(), batch.targets.data(), kB, kT);
  EXPECT_NEAR(gpu_next, cpu_next, 1e-2 * cpu_next);
  EXPECT_LT(gpu_next, gpu_loss) << "one AdamW step on the batch did not lower its loss";
}

TEST_P(CudaGpt2AttentionTest, TwoRunsGiveIdenticalLosses) {
  SKIP_WITHOUT_GPU();
  const model::GPT2Config config = test_config();
  std::vector<std::vector<float>> losses(2);
  std::vector<std::vector<float>> params(2);
  for (int run = 0; run < 2; ++run) {
    std::mt19937 rng(123);
    const auto gpu = make_cuda_gpt2(config, kB, kT, options_for(GetParam()));
    gpu->init_weights(3);
    for (int step = 0; step < 4; ++step) {
      gpu->zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        const Batch batch = random_batch(rng, config.vocab_size);
        losses[run].push_back(
            gpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 0.5f));
      }
      losses[run].push_back(gpu->gradient_norm());
      gpu->optimizer_step(model::AdamWOptions{}, 3e-4f, 1.0f);
    }
    params[run] = host_copy(*gpu, gpu->parameters_flat());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)))
      << "the master weights differ after identical runs";
}

INSTANTIATE_TEST_SUITE_P(Attention, CudaGpt2AttentionTest,
                         ::testing::Values(AttentionKernel::kFlash, AttentionKernel::kCublas),
                         attention_name);

TEST(CudaGpt2Test, SnapshotIsTheStateAtTheStepBoundary) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const model::GPT2Config config = test_config();
  const auto gpu = make_cuda_gpt2(config, kB, kT);
  const Batch batch = random_batch(rng, config.vocab_size);
  gpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 1.0f);
  gpu->optimizer_step(model::AdamWOptions{}, 1e-3f, 1.0f);

  // One host buffer per tensor, as the supervisor's Snapshot holds them.
  std::vector<model::NamedTensor> tensors = gpu->named_parameters();
  for (const model::NamedTensor& t : gpu->named_optimizer_state()) tensors.push_back(t);
  std::vector<std::vector<std::byte>> buffers;
  std::vector<model::HostCopy> copies;
  for (const model::NamedTensor& t : tensors) {
    buffers.emplace_back(static_cast<size_t>(t.numel()) * sizeof(float), std::byte{0xff});
  }
  for (size_t i = 0; i < tensors.size(); ++i) copies.push_back({tensors[i].data, buffers[i]});
  const std::vector<float> expected_params = host_copy(*gpu, gpu->parameters_flat());

  gpu->snapshot_to_host(copies);
  // Training continues: nothing writes the caller's buffers once the snapshot has returned.
  gpu->zero_grad();
  gpu->forward_backward(batch.inputs.data(), batch.targets.data(), kB, kT, 1.0f);
  gpu->optimizer_step(model::AdamWOptions{}, 1e-3f, 1.0f);

  std::vector<float> snapshot_params;
  for (size_t i = 0; i < gpu->named_parameters().size(); ++i) {
    const float* p = reinterpret_cast<const float*>(buffers[i].data());
    snapshot_params.insert(snapshot_params.end(), p, p + tensors[i].numel());
  }
  EXPECT_EQ(snapshot_params, expected_params) << "the snapshot is not the step-1 parameters";
  // A second snapshot into the same buffers (staging reused) sees step 2.
  gpu->snapshot_to_host(copies);
  const std::vector<float> now = host_copy(*gpu, gpu->parameters_flat());
  EXPECT_EQ(0, std::memcmp(buffers[0].data(), now.data(), buffers[0].size()));
}

TEST(CudaGpt2Test, UploadRestoresStateAndWorkingCopy) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const model::GPT2Config config = test_config();
  const auto cpu = model::make_cpu_gpt2(config, kB, kT);
  const auto gpu = make_cuda_gpt2(config, kB, kT);
  cpu->init_weights(99);  // the GPU model keeps init_weights(0): different weights
  gpu->upload(cpu->parameters_flat(), gpu->parameters_flat());
  EXPECT_EQ(host_copy(*gpu, gpu->parameters_flat()),
            std::vector<float>(cpu->parameters_flat().begin(), cpu->parameters_flat().end()));
  // The bf16 working copy followed: the losses agree.
  const Batch batch = random_batch(rng, config.vocab_size);
  const float cpu_loss = cpu->forward_loss(batch.inputs.data(), batch.targets.data(), kB, kT);
  EXPECT_NEAR(gpu->forward_loss(batch.inputs.data(), batch.targets.data(), kB, kT), cpu_loss,
              1e-2 * cpu_loss);

  std::vector<float> wrong_size(10);
  EXPECT_THROW(gpu->upload(wrong_size, gpu->parameters_flat()), InvalidArgument);
}

TEST(CudaGpt2Test, RejectsBadInputs) {
  SKIP_WITHOUT_GPU();
  model::GPT2Config four_heads = test_config();
  four_heads.n_head = 4;  // head size 32: no flash kernel for it
  EXPECT_THROW(make_cuda_gpt2(four_heads, kB, kT, options_for(AttentionKernel::kFlash)),
               InvalidArgument);
  EXPECT_NO_THROW(make_cuda_gpt2(four_heads, kB, kT));  // kAuto falls back to the cuBLAS path
  const auto gpu = make_cuda_gpt2(test_config(), kB, kT);
  std::vector<int32_t> tokens(kB * kT, 1);
  tokens[5] = test_config().vocab_size;  // out of range
  EXPECT_THROW(gpu->forward_loss(tokens.data(), tokens.data(), kB, kT), InvalidArgument);
  EXPECT_THROW(gpu->forward_loss(tokens.data(), tokens.data(), kB + 1, kT), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::backend_cuda
