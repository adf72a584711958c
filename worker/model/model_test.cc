// The CPU GPT-2 model: config and presets, parameter naming and layout, initialisation, a
// whole-model gradient check against finite differences, training behaviour (loss at init,
// overfitting one batch, gradient accumulation, determinism), AdamW's weight-decay rule, the
// learning-rate schedule and pre-trained loading.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/base/error.h>
#include <longhaul/kernels/cpu/threading.h>
#include <longhaul/model/config.h>
#include <longhaul/model/cpu/gpt2_cpu.h>
#include <longhaul/model/language_model.h>
#include <longhaul/model/lr_schedule.h>
#include <longhaul/model/pretrained.h>

namespace longhaul::model {
namespace {

// 2 layers, 16 channels, vocab 32: small enough for finite differences over the whole model.
GPT2Config micro_config() { return GPT2Config{32, 8, 2, 2, 16}; }

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

std::vector<float> copy_of(std::span<float> s) { return std::vector<float>(s.begin(), s.end()); }

TEST(GPT2Config, PresetsHaveTheDocumentedShapes) {
  EXPECT_EQ(GPT2Config::preset("tiny"), (GPT2Config{256, 128, 4, 4, 128}));
  EXPECT_EQ(GPT2Config::preset("small-4x256"), (GPT2Config{256, 256, 4, 4, 256}));
  EXPECT_EQ(GPT2Config::preset("gpt2-124m"), (GPT2Config{50257, 1024, 12, 12, 768}));
  EXPECT_EQ(GPT2Config::preset("gpt2-350m"), (GPT2Config{50257, 1024, 24, 16, 1024}));
  // OpenAI GPT-2 small and medium parameter counts (lm_head tied to wte).
  EXPECT_EQ(GPT2Config::preset("gpt2-124m").num_parameters(), 124439808);
  EXPECT_EQ(GPT2Config::preset("gpt2-350m").num_parameters(), 354823168);
  for (const std::string& name : GPT2Config::preset_names()) {
    EXPECT_NO_THROW(GPT2Config::preset(name).validate()) << name;
  }
}

TEST(GPT2Config, UnknownPresetListsKnownOnes) {
  try {
    GPT2Config::preset("gpt5");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gpt5"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("gpt2-124m"), std::string::npos);
  }
}

TEST(GPT2Config, ValidationNamesTheBadField) {
  struct Case {
    GPT2Config config;
    const char* field;
  };
  for (const Case& c :
       {Case{{0, 8, 2, 2, 16}, "vocab_size"}, Case{{32, -1, 2, 2, 16}, "context_length"},
        Case{{32, 8, 0, 2, 16}, "n_layer"}, Case{{32, 8, 2, 0, 16}, "n_head"},
        Case{{32, 8, 2, 2, 0}, "n_embd"}, Case{{32, 8, 2, 3, 16}, "n_head"}}) {
    try {
      c.config.validate();
      ADD_FAILURE() << "expected InvalidArgument for " << c.field;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
  }
}

TEST(CpuGPT2, NamedParametersFollowHuggingFaceNamesAndTileTheFlatBuffer) {
  auto model = make_cpu_gpt2(micro_config(), 2, 8);
  EXPECT_EQ(model->device_name(), "cpu");
  EXPECT_EQ(model->memory_space(), MemorySpace::kHost);
  EXPECT_EQ(model->numerical_environment().rfind("cpu: ", 0), 0u) << model->numerical_environment();
  EXPECT_NE(model->numerical_environment().find(" threads"), std::string::npos);
  EXPECT_EQ(model->num_parameters(), micro_config().num_parameters());
  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(params[0].name, "transformer.wte.weight");
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(params[1].name, "transformer.wpe.weight");
  EXPECT_EQ(params[1].shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(params[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(params[4].shape, (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(params[12].name, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(params[12].shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(params[25].name, "transformer.h.1.mlp.c_proj.bias");
  EXPECT_EQ(params.back().name, "transformer.ln_f.bias");
  // Contiguous, in order, covering parameters_flat() exactly.
  float* expected = model->parameters_flat().data();
  for (const auto& p : params) {
    EXPECT_EQ(p.data, expected) << p.name;
    expected += p.numel();
  }
  EXPECT_EQ(expected, model->parameters_flat().data() + model->parameters_flat().size());

  const auto state = model->named_optimizer_state();
  ASSERT_EQ(state.size(), 2 * params.size());
  EXPECT_EQ(state[0].name, "optimizer.exp_avg.transformer.wte.weight");
  EXPECT_EQ(state[params.size()].name, "optimizer.exp_avg_sq.transformer.wte.weight");
  EXPECT_EQ(state.back().shape, params.back().shape);
}

TEST(CpuGPT2, InitFollowsGpt2RulesAndIsDeterministicPerSeed) {
  const GPT2Config config{64, 16, 4, 2, 64};
  auto a = make_cpu_gpt2(config, 1, 16), b = make_cpu_gpt2(config, 1, 16);
  a->init_weights(7);
  b->init_weights(7);
  EXPECT_EQ(copy_of(a->parameters_flat()), copy_of(b->parameters_flat()));
  b->init_weights(8);
  EXPECT_NE(copy_of(a->parameters_flat()), copy_of(b->parameters_flat()));

  auto std_of = [](const NamedTensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(t.data[i]) * t.data[i];
    return std::sqrt(s / static_cast<double>(t.numel()));
  };
  for (const auto& p : a->named_parameters()) {
    const std::string& n = p.name;
    if (n.ends_with("c_proj.weight")) {
      EXPECT_NEAR(std_of(p), 0.02 / std::sqrt(8.0), 0.001) << n;
    } else if (n.ends_with("ln_1.weight") || n.ends_with("ln_2.weight") ||
               n.ends_with("ln_f.weight")) {
      for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(p.data[i], 1.0f) << n;
    } else if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(p.data[i], 0.0f) << n;
    } else {
      EXPECT_NEAR(std_of(p), 0.02, 0.002) << n;
    }
  }
}

TEST(CpuGPT2, LossAtInitIsAboutLogVocab) {
  const GPT2Config config{256, 64, 2, 4, 128};
  auto model = make_cpu_gpt2(config, 4, 64);
  model->init_weights(1);
  const auto x = random_tokens(4 * 64, 256, 2), y = random_tokens(4 * 64, 256, 3);
  const float loss = model->forward_loss(x.data(), y.data(), 4, 64);
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

// Whole-model gradients against central differences of forward_loss.
//  - Directional: for a random direction d over all parameters, g . d against
//    (L(p + eps d) - L(p - eps d)) / 2 eps with eps = 1e-3; tolerance 1% relative.
//  - Per tensor: the 3 entries with the largest |gradient| of every tensor, eps = 1e-2;
//    tolerance 1e-4 + 3% relative (the fp32 loss puts ~1e-5 of noise on each difference).
TEST(CpuGPT2, GradientsMatchFiniteDifferences) {
  const int B = 2, T = 6;  // T below max_seq_len exercises the smaller-call path
  auto model = make_cpu_gpt2(micro_config(), B, 8);
  model->init_weights(11);
  // Larger weights than GPT-2's init so every path carries a measurable gradient.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> noise(0.0f, 0.2f);
  for (float& p : model->parameters_flat()) p += noise(rng);
  const auto x = random_tokens(B * T, 32, 12), y = random_tokens(B * T, 32, 13);

  model->zero_grad();
  model->forward_backward(x.data(), y.data(), B, T, 1.0f);
  const auto grads = copy_of(model->gradients_flat());
  std::span<float> params = model->parameters_flat();
  auto loss = [&] { return static_cast<double>(model->forward_loss(x.data(), y.data(), B, T)); };

  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> d(params.size());
  for (float& v : d) v = unit(rng);
  const auto saved = copy_of(params);
  double analytic = 0;
  for (size_t i = 0; i < d.size(); ++i) analytic += static_cast<double>(grads[i]) * d[i];
  const float eps = 1e-3f;
  for (size_t i = 0; i < d.size(); ++i) params[i] = saved[i] + eps * d[i];
  const double plus = loss();
  for (size_t i = 0; i < d.size(); ++i) params[i] = saved[i] - eps * d[i];
  const double minus = loss();
  std::copy(saved.begin(), saved.end(), params.begin());
  const double numeric = (plus - minus) / (2 * eps);
  EXPECT_NEAR(analytic, numeric, 0.01 * std::abs(numeric)) << "directional derivative";

  const float* flat = params.data();
  for (const NamedTensor& t : model->named_parameters()) {
    const size_t offset = static_cast<size_t>(t.data - flat);
    std::vector<size_t> order(static_cast<size_t>(t.numel()));
    std::iota(order.begin(), order.end(), offset);
    std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                      [&](size_t a, size_t b) { return std::abs(grads[a]) > std::abs(grads[b]); });
    for (int k = 0; k < 3; ++k) {
      const size_t i = order[k];
      const float h = 1e-2f;
      params[i] = saved[i] + h;
      const double lp = loss();
      params[i] = saved[i] - h;
      const double lm = loss();
      params[i] = saved[i];
      const double num = (lp - lm) / (2 * h);
      EXPECT_NEAR(grads[i], num, 1e-4 + 0.03 * std::abs(num))
          << t.name << " element " << (i - offset);
    }
  }
}

TEST(CpuGPT2, GradientAccumulationOverMicroBatchesEqualsTheFullBatch) {
  const int T = 8;
  auto model = make_cpu_gpt2(micro_config(), 4, T);
  model->init_weights(3);
  const auto x = random_tokens(4 * T, 32, 4), y = random_tokens(4 * T, 32, 5);
  model->zero_grad();
  const float full_loss = model->forward_backward(x.data(), y.data(), 4, T, 1.0f);
  const auto full = copy_of(model->gradients_flat());
  model->zero_grad();
  const float l1 = model->forward_backward(x.data(), y.data(), 2, T, 0.5f);
  const float l2 = model->forward_backward(x.data() + 2 * T, y.data() + 2 * T, 2, T, 0.5f);
  const auto accumulated = copy_of(model->gradients_flat());
  EXPECT_NEAR((l1 + l2) / 2, full_loss, 1e-5);
  double max_abs = 0;
  for (float g : full) max_abs = std::max(max_abs, static_cast<double>(std::abs(g)));
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_NEAR(accumulated[i], full[i], 1e-5 * max_abs) << "gradient element " << i;
  }
}

// The gradient-ready contract (language_model.h) that overlapped all-reduce relies on: each
// reported range is final when reported (the test overwrites it with a sentinel at once, and
// the backend must neither overwrite it nor read it back), ranges are disjoint, cover the buffer
// once per call, and come ln_f first, then blocks L-1..0, then wte + wpe. With accumulation the
// reported values are the accumulated sums.
TEST(CpuGPT2, GradientReadyRangesAreFinalDisjointAndCoverTheBufferOncePerCall) {
  const int T = 8;
  const GPT2Config config = micro_config();
  auto model = make_cpu_gpt2(config, 2, T);
  auto reference = make_cpu_gpt2(config, 2, T);
  model->init_weights(11);
  reference->init_weights(11);
  ASSERT_TRUE(model->reports_gradients_per_layer());
  const size_t n = model->gradients_flat().size();
  // Expected boundaries: ln_f.weight, then the start of each block from the last to the first,
  // then 0 (wte + wpe).
  std::vector<size_t> starts;
  for (const NamedTensor& t : model->named_parameters()) {
    const size_t offset = static_cast<size_t>(t.data - model->parameters_flat().data());
    if (t.name == "transformer.ln_f.weight" || t.name.ends_with(".ln_1.weight")) {
      starts.push_back(offset);
    }
  }
  std::sort(starts.rbegin(), starts.rend());
  starts.push_back(0);
  ASSERT_EQ(starts.size(), static_cast<size_t>(config.n_layer) + 2);

  constexpr float kSentinel = 12345.0f;
  struct Range {
    size_t begin, end;
    std::vector<float> values;
  };
  std::vector<Range> ranges;
  model->set_gradient_ready_callback([&](size_t begin, size_t end) {
    ASSERT_LT(begin, end);
    ASSERT_LE(end, n);
    auto grads = model->gradients_flat();
    ranges.push_back({begin, end, std::vector<float>(grads.begin() + begin, grads.begin() + end)});
    std::fill(grads.begin() + begin, grads.begin() + end, kSentinel);
  });
  model->zero_grad();
  reference->zero_grad();
  for (int micro = 0; micro < 2; ++micro) {
    const auto x = random_tokens(2 * T, 32, 20 + micro), y = random_tokens(2 * T, 32, 30 + micro);
    ranges.clear();
    const float loss = model->forward_backward(x.data(), y.data(), 2, T, 0.5f);
    EXPECT_EQ(loss, reference->forward_backward(x.data(), y.data(), 2, T, 0.5f));
    ASSERT_EQ(ranges.size(), starts.size()) << "micro-batch " << micro;
    size_t expected_end = n;
    auto grads = model->gradients_flat();
    const auto want = reference->gradients_flat();
    for (size_t i = 0; i < ranges.size(); ++i) {
      const Range& r = ranges[i];
      EXPECT_EQ(r.end, expected_end) << "range " << i << " is not adjacent to the previous one";
      EXPECT_EQ(r.begin, starts[i]) << "range " << i;
      expected_end = r.begin;
      for (size_t j = r.begin; j < r.end; ++j) {
        ASSERT_EQ(grads[j], kSentinel) << "element " << j << " was written after it was reported";
        ASSERT_EQ(r.values[j - r.begin], want[j]) << "element " << j << ", micro-batch " << micro;
        grads[j] = r.values[j - r.begin];  // restore for the next accumulation
      }
    }
    EXPECT_EQ(expected_end, 0u) << "the ranges do not reach offset 0 (wte)";
  }
  // forward_loss reports nothing; an empty callback turns reporting off.
  ranges.clear();
  const auto x = random_tokens(2 * T, 32, 40);
  model->forward_loss(x.data(), x.data(), 2, T);
  EXPECT_TRUE(ranges.empty());
  model->set_gradient_ready_callback({});
  EXPECT_FALSE(model->has_gradient_ready_callback());
  model->forward_backward(x.data(), x.data(), 2, T, 1.0f);
  EXPECT_TRUE(ranges.empty());
}

TEST(CpuGPT2, ForwardLossLeavesGradientsAndMatchesTrainingLoss) {
  auto model = make_cpu_gpt2(micro_config(), 2, 8);
  const auto x = random_tokens(16, 32, 6), y = random_tokens(16, 32, 7);
  model->zero_grad();
  const float train_loss = model->forward_backward(x.data(), y.data(), 2, 8, 1.0f);
  const auto grads = copy_of(model->gradients_flat());
  EXPECT_EQ(model->forward_loss(x.data(), y.data(), 2, 8), train_loss);
  EXPECT_EQ(copy_of(model->gradients_flat()), grads);
  double sq = 0;
  for (float g : grads) sq += static_cast<double>(g) * g;
  EXPECT_NEAR(model->gradient_norm(), std::sqrt(sq), 1e-6 * std::sqrt(sq));
  model->zero_grad();
  EXPECT_EQ(model->gradient_norm(), 0.0f);
}

TEST(CpuGPT2, RejectsBadShapesAndTokens) {
  EXPECT_THROW(make_cpu_gpt2(micro_config(), 2, 9), InvalidArgument);  // beyond context_length
  EXPECT_THROW(make_cpu_gpt2(micro_config(), 0, 8), InvalidArgument);
  EXPECT_THROW(make_cpu_gpt2(GPT2Config{32, 8, 2, 3, 16}, 1, 8), InvalidArgument);
  auto model = make_cpu_gpt2(micro_config(), 2, 8);
  auto x = random_tokens(32, 32, 1), y = random_tokens(32, 32, 2);
  EXPECT_THROW(model->forward_loss(x.data(), y.data(), 3, 8), InvalidArgument);
  EXPECT_THROW(model->forward_loss(x.data(), y.data(), 2, 9), InvalidArgument);
  x[5] = 32;
  try {
    model->forward_backward(x.data(), y.data(), 2, 8, 1.0f);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("input token id 32 at (b=0, t=5)"), std::string::npos)
        << e.what();
  }
  x[5] = 0;
  y[9] = -1;
  EXPECT_THROW(model->forward_loss(x.data(), y.data(), 2, 8), InvalidArgument);
}

// Trains a few steps; returns the final parameters and moments.
std::vector<float> train_steps(const GPT2Config& config, uint64_t seed, int steps) {
  auto model = make_cpu_gpt2(config, 2, 8);
  model->init_weights(seed);
  const auto x = random_tokens(16, config.vocab_size, 21),
             y = random_tokens(16, config.vocab_size, 22);
  for (int s = 0; s < steps; ++s) {
    model->zero_grad();
    model->forward_backward(x.data(), y.data(), 2, 8, 1.0f);
    const float norm = model->gradient_norm();
    model->optimizer_step(AdamWOptions{}, 1e-3f, norm > 1.0f ? 1.0f / norm : 1.0f);
  }
  EXPECT_EQ(model->optimizer_step_count(), steps);
  std::vector<float> state = copy_of(model->parameters_flat());
  for (const NamedTensor& t : model->named_optimizer_state()) {
    state.insert(state.end(), t.data, t.data + t.numel());
  }
  return state;
}

TEST(CpuGPT2, SameSeedGivesBitIdenticalStateAfterTraining) {
  const auto a = train_steps(micro_config(), 99, 3);
  const auto b = train_steps(micro_config(), 99, 3);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_NE(train_steps(micro_config(), 100, 3), a);
}

TEST(CpuGPT2, OverfitsOneBatch) {
  const GPT2Config config{256, 16, 2, 2, 32};
  const int B = 4, T = 16;
  auto model = make_cpu_gpt2(config, B, T);
  model->init_weights(1);
  const auto x = random_tokens(B * T, 256, 8), y = random_tokens(B * T, 256, 9);
  const float initial = model->forward_loss(x.data(), y.data(), B, T);
  float loss = initial;
  for (int step = 0; step < 60; ++step) {
    model->zero_grad();
    loss = model->forward_backward(x.data(), y.data(), B, T, 1.0f);
    model->optimizer_step(AdamWOptions{.weight_decay = 0.0f}, 1e-2f, 1.0f);
  }
  EXPECT_NEAR(initial, std::log(256.0), 0.1);
  EXPECT_LT(loss, 0.25 * std::log(256.0)) << "initial " << initial;
}

TEST(CpuGPT2, WeightDecayAppliesOnlyToMatrices) {
  auto model = make_cpu_gpt2(micro_config(), 1, 8);
  model->init_weights(4);
  // Make every parameter non-zero so decay would be visible everywhere.
  for (float& p : model->parameters_flat()) p += 0.5f;
  const auto before = copy_of(model->parameters_flat());
  model->zero_grad();  // zero gradients: Adam's update is 0, only decay can move a parameter
  model->optimizer_step(AdamWOptions{.weight_decay = 0.5f}, 0.1f, 1.0f);
  EXPECT_EQ(model->optimizer_step_count(), 1);
  const float* flat = model->parameters_flat().data();
  for (const NamedTensor& t : model->named_parameters()) {
    const size_t offset = static_cast<size_t>(t.data - flat);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float old = before[offset + i];
      const float expected = is_weight_decayed(t) ? old - 0.1f * 0.5f * old : old;
      ASSERT_FLOAT_EQ(t.data[i], expected) << t.name;
    }
    EXPECT_EQ(is_weight_decayed(t), t.shape.size() == 2) << t.name;
  }
  model->set_optimizer_step_count(41);
  EXPECT_EQ(model->optimizer_step_count(), 41);
  EXPECT_THROW(model->set_optimizer_step_count(-1), InvalidArgument);
}

// The state transfers of language_model.h with their host defaults (memcpy): what the trainer's
// checkpoint and restore paths and the data-parallel state broadcast use on every backend.
TEST(CpuGPT2, HostTransfersMoveStateAndRefuseSpansOutsideTheModel) {
  auto model = make_cpu_gpt2(micro_config(), 1, 8);
  model->init_weights(5);
  const std::span<float> params = model->parameters_flat();
  std::vector<float> host(params.size());
  model->download(params, host);
  EXPECT_EQ(host, copy_of(params));

  for (float& x : host) x += 1.0f;
  model->upload(host, params);
  EXPECT_EQ(copy_of(params), host);

  // A snapshot of one parameter and one moment into byte buffers, as the supervisor holds them.
  const NamedTensor wpe = model->named_parameters()[1];
  const NamedTensor exp_avg_sq = model->named_optimizer_state().back();
  std::fill_n(exp_avg_sq.data, exp_avg_sq.numel(), 0.25f);
  std::vector<std::byte> wpe_bytes(static_cast<size_t>(wpe.numel()) * sizeof(float));
  std::vector<std::byte> moment_bytes(static_cast<size_t>(exp_avg_sq.numel()) * sizeof(float));
  const std::vector<HostCopy> copies = {{wpe.data, wpe_bytes}, {exp_avg_sq.data, moment_bytes}};
  model->snapshot_to_host(copies);
  EXPECT_EQ(0, std::memcmp(wpe_bytes.data(), wpe.data, wpe_bytes.size()));
  EXPECT_EQ(0, std::memcmp(moment_bytes.data(), exp_avg_sq.data, moment_bytes.size()));

  // Sizes must match, and the model side must be the model's memory (as on a device backend,
  // where a host pointer would be a crash): refused with InvalidArgument, nothing copied.
  std::vector<float> too_small(3);
  EXPECT_THROW(model->download(params, too_small), InvalidArgument);
  std::vector<float> elsewhere(4, 7.0f), out(4, 0.0f);
  EXPECT_THROW(model->download(elsewhere, out), InvalidArgument);
  EXPECT_THROW(model->upload(out, elsewhere), InvalidArgument);
  EXPECT_EQ(elsewhere, std::vector<float>(4, 7.0f));
  const std::span<const float> past_the_end(params.data() + 1, params.size());
  EXPECT_THROW(model->download(past_the_end, host), InvalidArgument);
  const std::vector<HostCopy> stray = {{elsewhere.data(), std::as_writable_bytes(std::span(out))}};
  EXPECT_THROW(model->snapshot_to_host(stray), InvalidArgument);
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
}

TEST(LearningRateSchedule, WarmupThenCosineToMin) {
  const LearningRateSchedule s{
      .max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 4), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 10), 1.0);     // peak, start of the decay
  EXPECT_NEAR(learning_rate_at(s, 60), 0.55, 1e-12);  // half-way: (max + min) / 2
  EXPECT_NEAR(learning_rate_at(s, 109), 0.1, 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 1000), 0.1);
  for (int64_t step = 11; step < 110; ++step) {
    EXPECT_LT(learning_rate_at(s, step), learning_rate_at(s, step - 1)) << step;
  }
  const LearningRateSchedule no_warmup{
      .max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
  EXPECT_DOUBLE_EQ(learning_rate_at(no_warmup, 0), 2.0);
  EXPECT_NEAR(learning_rate_at(no_warmup, 2), 1.0, 1e-12);
}

TEST(LearningRateSchedule, ValidationNamesTheField) {
  auto message = [](LearningRateSchedule s) -> std::string {
    try {
      s.validate();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({.max_lr = 0}).find("max_lr"), std::string::npos);
  EXPECT_NE(message({.max_lr = 1, .min_lr = 2}).find("min_lr"), std::string::npos);
  EXPECT_NE(message({.warmup_steps = 5, .total_steps = 2}).find("warmup_steps"), std::string::npos);
  EXPECT_NE(message({.total_steps = 0}).find("total_steps"), std::string::npos);
  EXPECT_EQ(message({.max_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 100}), "");
}

// A Hugging Face-style tensor set built from a source model's parameters: names optionally
// without "transformer.", plus the attn.bias / attn.masked_bias buffers and lm_head.weight.
InMemoryTensorReader hf_tensors(LanguageModel& source, bool with_prefix) {
  InMemoryTensorReader reader;
  const int T = source.config().context_length;
  for (const NamedTensor& t : source.named_parameters()) {
    std::string name = t.name;
    if (!with_prefix) name = name.substr(std::string("transformer.").size());
    reader.add(name, t.shape, std::vector<float>(t.data, t.data + t.numel()));
    if (t.name == "transformer.wte.weight") {
      reader.add("lm_head.weight", t.shape, std::vector<float>(t.data, t.data + t.numel()));
    }
  }
  for (int l = 0; l < source.config().n_layer; ++l) {
    const std::string p = std::string(with_prefix ? "transformer." : "") + "h." + std::to_string(l);
    reader.add(p + ".attn.bias", {1, 1, T, T},
               std::vector<float>(static_cast<size_t>(T) * T, 1.0f));
    reader.add(p + ".attn.masked_bias", {}, {-1e4f});
  }
  return reader;
}

TEST(LoadPretrained, LoadsHuggingFaceNamesWithAndWithoutPrefix) {
  auto source = make_cpu_gpt2(micro_config(), 2, 8);
  source->init_weights(31);
  const auto x = random_tokens(16, 32, 1), y = random_tokens(16, 32, 2);
  const float source_loss = source->forward_loss(x.data(), y.data(), 2, 8);
  for (bool with_prefix : {false, true}) {
    auto model = make_cpu_gpt2(micro_config(), 2, 8);
    model->init_weights(32);
    const PretrainedLoadReport report = model->load_pretrained(hf_tensors(*source, with_prefix));
    EXPECT_EQ(copy_of(model->parameters_flat()), copy_of(source->parameters_flat()));
    EXPECT_EQ(report.loaded.size(), model->named_parameters().size());
    EXPECT_TRUE(report.missing.empty());
    EXPECT_TRUE(report.unmatched.empty());
    EXPECT_EQ(report.ignored.size(), 1u + 2 * 2);  // lm_head + 2 buffers per layer
    EXPECT_EQ(model->forward_loss(x.data(), y.data(), 2, 8), source_loss);
  }
}

TEST(LoadPretrained, SubsetKeepsInitAndReportsMissing) {
  auto source = make_cpu_gpt2(micro_config(), 1, 8);
  source->init_weights(41);
  auto model = make_cpu_gpt2(micro_config(), 1, 8);
  model->init_weights(42);
  const auto init = copy_of(model->parameters_flat());
  InMemoryTensorReader reader;
  const NamedTensor wte = source->named_parameters()[0];
  reader.add("wte.weight", wte.shape, std::vector<float>(wte.data, wte.data + wte.numel()));
  reader.add("optimizer.exp_avg.transformer.wte.weight", wte.shape,
             std::vector<float>(static_cast<size_t>(wte.numel()), 0.0f));
  const auto report = model->load_pretrained(reader);
  EXPECT_EQ(report.loaded, std::vector<std::string>{"transformer.wte.weight"});
  EXPECT_EQ(report.missing.size(), model->named_parameters().size() - 1);
  EXPECT_EQ(report.unmatched, std::vector<std::string>{"optimizer.exp_avg.transformer.wte.weight"});
  const auto after = copy_of(model->parameters_flat());
  EXPECT_TRUE(std::equal(wte.data, wte.data + wte.numel(), after.begin()));
  EXPECT_TRUE(std::equal(after.begin() + wte.numel(), after.end(), init.begin() + wte.numel()));

  PretrainedLoadOptions strict;
  strict.require_all = true;
  EXPECT_THROW(model->load_pretrained(reader, strict), NotFound);
  PretrainedLoadOptions reject;
  reject.reject_unmatched = true;
  EXPECT_THROW(model->load_pretrained(reader, reject), InvalidArgument);
}

TEST(LoadPretrained, NameMapRenamesSourceTensors) {
  auto model = make_cpu_gpt2(micro_config(), 1, 8);
  InMemoryTensorReader reader;
  reader.add("my_embedding", {32, 16}, std::vector<float>(32 * 16, 0.25f));
  PretrainedLoadOptions options;
  options.name_map["my_embedding"] = "wte.weight";
  const auto report = model->load_pretrained(reader, options);
  EXPECT_EQ(report.loaded, std::vector<std::string>{"transformer.wte.weight"});
  EXPECT_EQ(model->named_parameters()[0].data[17], 0.25f);
}

TEST(LoadPretrained, ShapeMismatchIsRefusedNamingTheTensorAndChangesNothing) {
  auto source = make_cpu_gpt2(GPT2Config{32, 8, 2, 2, 32}, 1, 8);  // wider model
  auto model = make_cpu_gpt2(micro_config(), 1, 8);
  const auto before = copy_of(model->parameters_flat());
  try {
    model->load_pretrained(hf_tensors(*source, false));
    FAIL() << "expected FailedPrecondition";
  } catch (const FailedPrecondition& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'h.0.attn.c_attn.bias' has shape [96] but model parameter "
                           "'transformer.h.0.attn.c_attn.bias' has shape [48]"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(copy_of(model->parameters_flat()), before);
}

TEST(LoadPretrained, TwoSourcesForOneParameterAreRefused) {
  auto model = make_cpu_gpt2(micro_config(), 1, 8);
  InMemoryTensorReader reader;
  reader.add("wte.weight", {32, 16}, std::vector<float>(32 * 16, 1.0f));
  reader.add("transformer.wte.weight", {32, 16}, std::vector<float>(32 * 16, 2.0f));
  EXPECT_THROW(model->load_pretrained(reader), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::model
