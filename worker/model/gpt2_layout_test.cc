// The shared GPT-2 parameter layout: order, names, shapes and contiguous offsets for every
// preset, and initial weights pinned to the values the CPU model produced before the layout was
// shared with the CUDA backend (so checkpoints and "same seed, same weights" keep holding).
#include "longhaul/model/gpt2_layout.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/base/error.h>
#include <longhaul/model/config.h>
#include <longhaul/model/cpu/gpt2_cpu.h>
#include <longhaul/model/language_model.h>

namespace longhaul::model {
namespace {

uint64_t fnv1a(std::span<const float> values) {
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size_bytes(); ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

class EveryPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryPreset, TensorsTileTheFlatBufferInHuggingFaceOrder) {
  const GPT2Config config = GPT2Config::preset(GetParam());
  const ParameterLayout layout(config);
  const int64_t V = config.vocab_size, C = config.n_embd;
  ASSERT_EQ(layout.size(), 2 + static_cast<size_t>(config.n_layer) * kBlockTensors + 2);
  EXPECT_EQ(static_cast<int64_t>(layout.num_parameters()), config.num_parameters());

  size_t expected_offset = 0;
  for (const TensorLayout& t : layout) {
    EXPECT_EQ(t.offset, expected_offset) << t.name;
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    EXPECT_EQ(t.numel, numel) << t.name;
    expected_offset += t.numel;
  }
  EXPECT_EQ(expected_offset, layout.num_parameters());

  EXPECT_EQ(layout.wte().name, "transformer.wte.weight");
  EXPECT_EQ(layout.wte().shape, (std::vector<int64_t>{V, C}));
  EXPECT_EQ(layout.wpe().name, "transformer.wpe.weight");
  EXPECT_EQ(layout.wpe().shape, (std::vector<int64_t>{config.context_length, C}));
  for (int l = 0; l < config.n_layer; ++l) {
    for (int i = 0; i < kBlockTensors; ++i) {
      const TensorLayout& t = layout.block(l, static_cast<BlockTensor>(i));
      EXPECT_EQ(t.name, "transformer.h." + std::to_string(l) + "." + kBlockTensorNames[i]);
    }
    EXPECT_EQ(layout.block(l, kQkvW).shape, (std::vector<int64_t>{C, 3 * C}));
    EXPECT_EQ(layout.block(l, kFcProjW).shape, (std::vector<int64_t>{4 * C, C}));
    EXPECT_EQ(layout.block(l, kAttProjW).init, ParameterInit::kResidualNormal);
    EXPECT_EQ(layout.block(l, kFcProjW).init, ParameterInit::kResidualNormal);
    EXPECT_EQ(layout.block(l, kLn2W).init, ParameterInit::kOne);
    EXPECT_EQ(layout.block(l, kFcB).init, ParameterInit::kZero);
  }
  EXPECT_EQ(layout.lnf_weight().name, "transformer.ln_f.weight");
  EXPECT_EQ(layout.lnf_bias().name, "transformer.ln_f.bias");
  EXPECT_EQ(layout.lnf_bias().offset + layout.lnf_bias().numel, layout.num_parameters());
}

INSTANTIATE_TEST_SUITE_P(Presets, EveryPreset, ::testing::ValuesIn(GPT2Config::preset_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(ParameterLayout, Gpt2SmallOffsetsAreTheCheckpointFormatOnes) {
  const ParameterLayout layout(GPT2Config::preset("gpt2-124m"));
  EXPECT_EQ(layout.wpe().offset, size_t{50257} * 768);
  EXPECT_EQ(layout.block(0, kLn1W).offset, size_t{50257} * 768 + 1024 * 768);
  EXPECT_EQ(layout.block(11, kFcProjB).offset, layout.lnf_weight().offset - 768);
  EXPECT_EQ(layout.num_parameters(), size_t{124439808});
}

TEST(ParameterLayout, RejectsAnInvalidConfigNamingTheField) {
  GPT2Config config = GPT2Config::preset("tiny");
  config.n_head = 3;  // 128 channels do not split into 3 heads
  try {
    ParameterLayout layout(config);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("n_head"), std::string::npos) << e.what();
  }
}

// Values captured from the CPU model's init_weights before the layout and initialiser moved
// here (hex floats, exact). A change here changes every run's initial weights: checkpoints from
// before would still load, but runs from the same seed would no longer reproduce.
struct InitGolden {
  uint64_t seed;
  uint64_t whole_buffer_fnv1a;
  float wte[5];
  float wpe[5];
  float h0_attn_c_proj[5];
  float h3_mlp_c_proj[5];
};
constexpr InitGolden kTinyGoldens[] = {
    {0,
     0x57d6098a45c00cc0ull,
     {0x1.3964d6p-5f, -0x1.ef5852p-10f, -0x1.54b0bp-5f, -0x1.ded916p-6f, 0x1.536312p-6f},
     {-0x1.a662p-5f, 0x1.ae12e8p-6f, 0x1.d7df7cp-7f, -0x1.4fd748p-10f, -0x1.8eccbp-7f},
     {-0x1.d75dd8p-7f, 0x1.be3832p-8f, -0x1.3e8dc6p-9f, -0x1.a04088p-9f, 0x1.dde276p-11f},
     {0x1.63f5cep-8f, 0x1.7c26d6p-9f, 0x1.12a3e8p-9f, 0x1.edf486p-8f, 0x1.6663dp-7f}},
    {1234,
     0xa5da706eb3b04a2bull,
     {0x1.98902ap-8f, 0x1.162ddap-9f, 0x1.19c952p-8f, -0x1.8fd20ep-10f, 0x1.1d353ep-5f},
     {0x1.d73564p-7f, -0x1.199d24p-6f, 0x1.0c7594p-5f, -0x1.e747ep-9f, -0x1.35016ep-6f},
     {-0x1.ab38b6p-6f, 0x1.fe25bep-9f, 0x1.188668p-8f, -0x1.761de2p-13f, 0x1.140e2ap-9f},
     {0x1.deb524p-14f, 0x1.f1a5ecp-10f, 0x1.f4ab6ep-9f, -0x1.53439ap-9f, -0x1.3df04ap-8f}},
};

TEST(ParameterLayout, InitWeightsReproducesThePinnedTinyWeightsBitForBit) {
  const ParameterLayout layout(GPT2Config::preset("tiny"));
  std::vector<float> params(layout.num_parameters(), -1.0f);
  for (const InitGolden& golden : kTinyGoldens) {
    SCOPED_TRACE("seed " + std::to_string(golden.seed));
    layout.init_weights(golden.seed, params);
    auto expect_prefix = [&](const TensorLayout& t, const float(&expected)[5]) {
      for (int i = 0; i < 5; ++i) {
        // Bitwise: EXPECT_FLOAT_EQ would accept a 4-ulp drift.
        uint32_t got_bits, want_bits;
        std::memcpy(&got_bits, &params[t.offset + i], 4);
        std::memcpy(&want_bits, &expected[i], 4);
        EXPECT_EQ(got_bits, want_bits)
            << t.name << "[" << i << "] = " << params[t.offset + i] << ", pinned " << expected[i];
      }
    };
    expect_prefix(layout.wte(), golden.wte);
    expect_prefix(layout.wpe(), golden.wpe);
    expect_prefix(layout.block(0, kAttProjW), golden.h0_attn_c_proj);
    expect_prefix(layout.block(3, kFcProjW), golden.h3_mlp_c_proj);
    EXPECT_EQ(fnv1a(params), golden.whole_buffer_fnv1a);
  }
}

TEST(ParameterLayout, NamesBuffersWithTheCheckpointKeys) {
  const ParameterLayout layout(GPT2Config{32, 8, 2, 2, 16});
  std::vector<float> params(layout.num_parameters()), m(layout.num_parameters()),
      v(layout.num_parameters());
  const std::vector<NamedTensor> named = layout.named(params.data());
  ASSERT_EQ(named.size(), layout.size());
  EXPECT_EQ(named[3].name, "transformer.h.0.ln_1.bias");
  EXPECT_EQ(named[3].data, params.data() + layout[3].offset);
  const std::vector<NamedTensor> state = layout.named_optimizer_state(m.data(), v.data());
  ASSERT_EQ(state.size(), 2 * layout.size());
  EXPECT_EQ(state.front().name, "optimizer.exp_avg.transformer.wte.weight");
  EXPECT_EQ(state.front().data, m.data());
  EXPECT_EQ(state[layout.size()].name, "optimizer.exp_avg_sq.transformer.wte.weight");
  EXPECT_EQ(state[layout.size()].data, v.data());
  EXPECT_EQ(state.back().name, "optimizer.exp_avg_sq.transformer.ln_f.bias");
  EXPECT_EQ(state.back().data, v.data() + layout.lnf_bias().offset);
  EXPECT_EQ(state.back().shape, (std::vector<int64_t>{16}));
}

TEST(ParameterLayout, InitWeightsRefusesABufferOfTheWrongSize) {
  const ParameterLayout layout(GPT2Config::preset("tiny"));
  std::vector<float> params(layout.num_parameters() - 1);
  EXPECT_THROW(layout.init_weights(1, params), InvalidArgument);
}

TEST(ParameterLayout, CpuModelUsesTheSharedLayoutAndInitialiser) {
  const GPT2Config config{32, 8, 2, 2, 16};
  const ParameterLayout layout(config);
  std::unique_ptr<LanguageModel> model = make_cpu_gpt2(config, 1, 8);
  model->init_weights(77);
  const std::span<float> flat = model->parameters_flat();
  const std::vector<NamedTensor> named = model->named_parameters();
  ASSERT_EQ(named.size(), layout.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named[i].name, layout[i].name);
    EXPECT_EQ(named[i].shape, layout[i].shape) << layout[i].name;
    EXPECT_EQ(named[i].data, flat.data() + layout[i].offset) << layout[i].name;
  }
  std::vector<float> expected(layout.num_parameters());
  layout.init_weights(77, expected);
  ASSERT_EQ(flat.size(), expected.size());
  EXPECT_EQ(std::memcmp(flat.data(), expected.data(), expected.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace longhaul::model
