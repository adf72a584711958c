// GPT2Inference against an independent full-context forward pass written here in double
// precision (the KV cache must not change the logits beyond float rounding), against the
// training model's loss, and TokenSampler's greedy / seeded / top-k behaviour.
#include "longhaul/model/gpt2_inference.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/model/cpu/gpt2_cpu.h"

namespace longhaul::model {
namespace {

// Logits differ from the double-precision reference by float rounding only: observed ~1e-6 on
// logits of magnitude ~1; 2e-4 leaves room for other BLAS builds and summation orders.
constexpr double kLogitTolerance = 2e-4;

GPT2Config small_config() {
  return {.vocab_size = 61, .context_length = 24, .n_layer = 2, .n_head = 2, .n_embd = 16};
}

// GPT-2 weights with every tensor (biases and layernorms too) random, so nothing is trivial.
std::vector<float> random_params(const GPT2Config& c, uint64_t seed) {
  ParameterLayout layout(c);
  std::vector<float> p(layout.num_parameters());
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (float& x : p) x = n(rng);
  for (int l = 0; l < c.n_layer; ++l) {
    for (BlockTensor t : {kLn1W, kLn2W}) {
      const auto& tl = layout.block(l, t);
      for (size_t i = 0; i < tl.numel; ++i) p[tl.offset + i] += 1.0f;
    }
  }
  return p;
}

// The reference: GPT-2's forward over the whole context in double, straight from the math.
std::vector<std::vector<double>> reference_logits(const GPT2Config& c, const std::vector<float>& p,
                                                  const std::vector<int32_t>& tokens) {
  ParameterLayout L(c);
  const int T = static_cast<int>(tokens.size()), C = c.n_embd, NH = c.n_head, hs = C / NH;
  auto W = [&](const TensorLayout& t) { return p.data() + t.offset; };
  using Mat = std::vector<std::vector<double>>;
  Mat x(T, std::vector<double>(C));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < C; ++i) x[t][i] = W(L.wte())[tokens[t] * C + i] + W(L.wpe())[t * C + i];
  auto layernorm = [&](const Mat& in, const float* w, const float* b) {
    Mat out = in;
    for (auto& row : out) {
      double mean = 0, var = 0;
      for (double v : row) mean += v;
      mean /= C;
      for (double v : row) var += (v - mean) * (v - mean);
      var /= C;
      for (int i = 0; i < C; ++i) row[i] = (row[i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
    }
    return out;
  };
  auto linear = [&](const Mat& in, const float* w, const float* b, int IC, int OC) {  // Conv1D
    Mat out(in.size(), std::vector<double>(OC));
    for (size_t r = 0; r < in.size(); ++r)
      for (int o = 0; o < OC; ++o) {
        double s = b[o];
        for (int i = 0; i < IC; ++i) s += in[r][i] * w[i * OC + o];
        out[r][o] = s;
      }
    return out;
  };
  for (int l = 0; l < c.n_layer; ++l) {
    Mat h = layernorm(x, W(L.block(l, kLn1W)), W(L.block(l, kLn1B)));
    Mat qkv = linear(h, W(L.block(l, kQkvW)), W(L.block(l, kQkvB)), C, 3 * C);
    Mat att(T, std::vector<double>(C, 0.0));
    for (int head = 0; head < NH; ++head)
      for (int t = 0; t < T; ++t) {
        std::vector<double> a(t + 1);
        double mx = -1e300, sum = 0;
        for (int s = 0; s <= t; ++s) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += qkv[t][head * hs + i] * qkv[s][C + head * hs + i];
          a[s] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, a[s]);
        }
        for (double& v : a) sum += (v = std::exp(v - mx));
        for (int s = 0; s <= t; ++s)
          for (int i = 0; i < hs; ++i)
            att[t][head * hs + i] += a[s] / sum * qkv[s][2 * C + head * hs + i];
      }
    Mat proj = linear(att, W(L.block(l, kAttProjW)), W(L.block(l, kAttProjB)), C, C);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i) x[t][i] += proj[t][i];
    h = layernorm(x, W(L.block(l, kLn2W)), W(L.block(l, kLn2B)));
    Mat fc = linear(h, W(L.block(l, kFcW)), W(L.block(l, kFcB)), C, 4 * C);
    for (auto& row : fc)
      for (double& v : row)
        v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    proj = linear(fc, W(L.block(l, kFcProjW)), W(L.block(l, kFcProjB)), 4 * C, C);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i) x[t][i] += proj[t][i];
  }
  Mat h = layernorm(x, W(L.lnf_weight()), W(L.lnf_bias()));
  Mat logits(T, std::vector<double>(c.vocab_size));
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < c.vocab_size; ++v) {
      double s = 0;
      for (int i = 0; i < C; ++i) s += h[t][i] * W(L.wte())[v * C + i];
      logits[t][v] = s;
    }
  return logits;
}

std::vector<int32_t> random_tokens(const GPT2Config& c, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % c.vocab_size);
  return t;
}

TEST(GPT2Inference, KvCacheLogitsEqualTheFullContextForward) {
  const GPT2Config c = small_config();
  const auto params = random_params(c, 1);
  const auto tokens = random_tokens(c, c.context_length, 2);
  const auto expected = reference_logits(c, params, tokens);
  // One token at a time, and a prefill of 7 then chunks of 5: every step's logits.
  for (int chunk : {1, 7}) {
    GPT2Inference inf(c, params, c.context_length);
    int pos = 0;
    while (pos < c.context_length) {
      const int n = std::min(pos == 0 ? chunk : (chunk == 1 ? 1 : 5), c.context_length - pos);
      auto logits = inf.append(std::span<const int32_t>(tokens).subspan(pos, n));
      pos += n;
      double worst = 0;
      for (int v = 0; v < c.vocab_size; ++v) {
        worst = std::max(worst, std::abs(logits[v] - expected[pos - 1][v]));
      }
      ASSERT_LT(worst, kLogitTolerance) << "position " << pos - 1 << ", chunk " << chunk;
      EXPECT_EQ(inf.position(), pos);
    }
  }
}

TEST(GPT2Inference, LossMatchesTheTrainingModel) {
  const GPT2Config c = small_config();
  const auto params = random_params(c, 3);
  const int T = c.context_length;
  const auto seq = random_tokens(c, T + 1, 4);
  std::vector<int32_t> inputs(seq.begin(), seq.end() - 1), targets(seq.begin() + 1, seq.end());
  auto model = make_cpu_gpt2(c, 1, T);
  std::copy(params.begin(), params.end(), model->parameters_flat().begin());
  const double trained = model->forward_loss(inputs.data(), targets.data(), 1, T);
  GPT2Inference inf(c, params, T);
  double loss = 0;
  for (int t = 0; t < T; ++t) {
    auto logits = inf.append(std::span<const int32_t>(inputs).subspan(t, 1));
    double mx = -1e300, sum = 0;
    for (float v : logits) mx = std::max(mx, static_cast<double>(v));
    for (float v : logits) sum += std::exp(v - mx);
    loss += mx + std::log(sum) - logits[targets[t]];
  }
  EXPECT_NEAR(loss / T, trained, 1e-4);
}

TEST(GPT2Inference, GreedyDecodingEqualsFullRecomputeArgmax) {
  const GPT2Config c = small_config();
  const auto params = random_params(c, 5);
  std::vector<int32_t> context = {3, 1, 4};
  GPT2Inference inf(c, params, c.context_length);
  TokenSampler greedy({.temperature = 0.0});
  auto logits = inf.append(context);
  std::vector<int32_t> generated;
  while (inf.position() < c.context_length) {
    const int32_t next = greedy.next(logits);
    generated.push_back(next);
    logits = inf.append(std::span<const int32_t>(&generated.back(), 1));
  }
  // Independently: argmax of the full-context reference at each step.
  std::vector<int32_t> full = context;
  for (size_t i = 0; i < generated.size(); ++i) {
    const auto ref = reference_logits(c, params, full).back();
    const int32_t best =
        static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
    ASSERT_EQ(generated[i], best) << "token " << i;
    full.push_back(best);
  }
}

TEST(GPT2Inference, RejectsBadInputWithoutChangingTheCache) {
  const GPT2Config c = small_config();
  const auto params = random_params(c, 6);
  GPT2Inference inf(c, params, 4);
  inf.append(std::vector<int32_t>{1, 2});
  EXPECT_THROW(inf.append(std::vector<int32_t>{1, 2, 3}), InvalidArgument);  // overflow
  EXPECT_THROW(inf.append(std::vector<int32_t>{c.vocab_size}), InvalidArgument);
  EXPECT_EQ(inf.position(), 2);
  EXPECT_THROW(GPT2Inference(c, params, c.context_length + 1), InvalidArgument);
  EXPECT_THROW(GPT2Inference(c, std::span<const float>(params).first(10), 4), InvalidArgument);
}

TEST(TokenSampler, SeededTopKAndTemperature) {
  std::vector<float> logits = {0.0f, std::log(3.0f), -1.0f, -0.5f};
  TokenSampler greedy({.temperature = 0.0});
  EXPECT_EQ(greedy.next(logits), 1);
  TokenSampler top1({.temperature = 1.0, .top_k = 1, .seed = 9});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(top1.next(logits), 1);
  // Same seed, same tokens; another seed, another sequence.
  auto draw = [&](uint64_t seed) {
    TokenSampler s({.temperature = 1.0, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.next(logits));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
  // top_k = 2 over {0, log 3}: P(1) = 3/4.
  TokenSampler top2({.temperature = 1.0, .top_k = 2, .seed = 11});
  int ones = 0, n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = top2.next(logits);
    ASSERT_TRUE(t == 0 || t == 1);
    ones += t == 1;
  }
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
  EXPECT_THROW(TokenSampler({.temperature = -1.0}), InvalidArgument);
  EXPECT_THROW(TokenSampler({.top_k = -1}), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::model
