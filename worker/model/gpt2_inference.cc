// GPT2Inference (KV-cache forward) and TokenSampler. See gpt2_inference.h.
#include "longhaul/model/gpt2_inference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <longhaul/base/error.h>
#include <longhaul/kernels/cpu/gelu.h>
#include <longhaul/kernels/cpu/layernorm.h>
#include <longhaul/kernels/cpu/matmul.h>

namespace longhaul::model {
namespace {

namespace k = longhaul::kernels::cpu;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::vector<float> read_parameters(const ParameterLayout& layout,
                                   const PretrainedTensorReader& reader) {
  const auto names = reader.tensor_names();
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  std::vector<float> params(layout.num_parameters());
  for (const TensorLayout& t : layout) {
    std::string name = t.name;
    if (!has(name)) {
      const std::string bare = name.substr(std::string_view("transformer.").size());
      if (!has(bare))
        throw NotFound("no tensor " + t.name + " (shape " + shape_string(t.shape) + ")");
      name = bare;
    }
    const auto shape = reader.shape(name);
    if (shape != t.shape) {
      throw FailedPrecondition("tensor " + name + " is " + shape_string(shape) +
                               " but the model needs " + shape_string(t.shape));
    }
    reader.read(name, {params.data() + t.offset, t.numel});
  }
  return params;
}

GPT2Inference::GPT2Inference(const GPT2Config& config, std::span<const float> params,
                             int max_tokens)
    : config_(config), layout_(config), params_(params), max_tokens_(max_tokens) {
  if (params.size() != layout_.num_parameters()) {
    throw InvalidArgument("GPT2Inference: " + std::to_string(params.size()) +
                          " parameters given, the model has " +
                          std::to_string(layout_.num_parameters()));
  }
  if (max_tokens < 1 || max_tokens > config.context_length) {
    throw InvalidArgument("GPT2Inference: max_tokens " + std::to_string(max_tokens) +
                          " must be in [1, " + std::to_string(config.context_length) + "]");
  }
  const size_t cache = static_cast<size_t>(config.n_layer) * max_tokens * config.n_embd;
  keys_.assign(cache, 0.0f);
  values_.assign(cache, 0.0f);
  logits_.resize(static_cast<size_t>(config.vocab_size));
}

void GPT2Inference::ensure_rows(int rows) {
  if (rows <= rows_) return;
  rows_ = rows;
  const size_t C = static_cast<size_t>(config_.n_embd), N = static_cast<size_t>(rows);
  x_.resize(N * C);
  ln_.resize(N * C);
  qkv_.resize(N * 3 * C);
  atty_.resize(N * C);
  proj_.resize(N * C);
  fch_.resize(N * 4 * C);
  fch_gelu_.resize(N * 4 * C);
  mean_.resize(N);
  rstd_.resize(N);
  scores_.resize(static_cast<size_t>(max_tokens_));
}

void GPT2Inference::check_append(std::span<const int32_t> tokens) const {
  const int N = static_cast<int>(tokens.size());
  const int V = config_.vocab_size;
  if (N < 1) throw InvalidArgument("GPT2Inference::append: no tokens");
  if (position_ + N > max_tokens_) {
    throw InvalidArgument("GPT2Inference: " + std::to_string(position_) + " + " +
                          std::to_string(N) + " tokens exceed the cache of " +
                          std::to_string(max_tokens_) + " positions");
  }
  for (int32_t id : tokens) {
    if (id < 0 || id >= V) {
      throw InvalidArgument("token id " + std::to_string(id) + " is outside [0, " +
                            std::to_string(V) + ") (model.vocab_size)");
    }
  }
}

const float* GPT2Inference::tensor(const TensorLayout& t) const {
  return params_.data() + t.offset;
}

void GPT2Inference::embed(std::span<const int32_t> tokens) {
  const int C = config_.n_embd;
  const float* wte = tensor(layout_.wte());
  const float* wpe = tensor(layout_.wpe());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* e = wte + static_cast<size_t>(tokens[i]) * C;
    const float* q = wpe + (static_cast<size_t>(position_) + i) * C;
    float* x = x_.data() + i * C;
    for (int c = 0; c < C; ++c) x[c] = e[c] + q[c];
  }
}

void GPT2Inference::attend(int layer, int N) {
  const int C = config_.n_embd, NH = config_.n_head;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // New keys and values into the cache, then causal attention over the cache.
  float* keys = keys_.data() + static_cast<size_t>(layer) * max_tokens_ * C;
  float* values = values_.data() + static_cast<size_t>(layer) * max_tokens_ * C;
  for (int i = 0; i < N; ++i) {
    const float* row = qkv_.data() + static_cast<size_t>(i) * 3 * C;
    std::copy(row + C, row + 2 * C, keys + static_cast<size_t>(position_ + i) * C);
    std::copy(row + 2 * C, row + 3 * C, values + static_cast<size_t>(position_ + i) * C);
  }
  for (int i = 0; i < N; ++i) {
    const int seen = position_ + i + 1;  // attends to positions [0, seen)
    const float* q_row = qkv_.data() + static_cast<size_t>(i) * 3 * C;
    float* out = atty_.data() + static_cast<size_t>(i) * C;
    for (int h = 0; h < NH; ++h) {
      const float* q = q_row + h * hs;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int s = 0; s < seen; ++s) {
        const float* kv = keys + static_cast<size_t>(s) * C + h * hs;
        float dot = 0.0f;
        for (int d = 0; d < hs; ++d) dot += q[d] * kv[d];
        scores_[s] = dot * scale;
        max_score = std::max(max_score, scores_[s]);
      }
      float sum = 0.0f;
      for (int s = 0; s < seen; ++s) {
        scores_[s] = std::exp(scores_[s] - max_score);
        sum += scores_[s];
      }
      float* o = out + h * hs;
      std::fill(o, o + hs, 0.0f);
      for (int s = 0; s < seen; ++s) {
        const float a = scores_[s] / sum;
        const float* vv = values + static_cast<size_t>(s) * C + h * hs;
        for (int d = 0; d < hs; ++d) o[d] += a * vv[d];
      }
    }
  }
}

void GPT2Inference::block(int l, int N) {
  const int C = config_.n_embd;
  const size_t NC = static_cast<size_t>(N) * C;
  auto blk = [&](BlockTensor i) { return tensor(layout_.block(l, i)); };
  k::layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), blk(kLn1W), blk(kLn1B), N,
                       C);
  k::matmul_forward(qkv_.data(), ln_.data(), blk(kQkvW), blk(kQkvB), N, C, 3 * C);
  attend(l, N);
  k::matmul_forward(proj_.data(), atty_.data(), blk(kAttProjW), blk(kAttProjB), N, C, C);
  for (size_t j = 0; j < NC; ++j) x_[j] += proj_[j];
  k::layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), blk(kLn2W), blk(kLn2B), N,
                       C);
  k::matmul_forward(fch_.data(), ln_.data(), blk(kFcW), blk(kFcB), N, C, 4 * C);
  k::gelu_forward(fch_gelu_.data(), fch_.data(), NC * 4);
  k::matmul_forward(proj_.data(), fch_gelu_.data(), blk(kFcProjW), blk(kFcProjB), N, 4 * C, C);
  for (size_t j = 0; j < NC; ++j) x_[j] += proj_[j];
}

std::span<const float> GPT2Inference::append(std::span<const int32_t> tokens) {
  check_append(tokens);
  const int N = static_cast<int>(tokens.size());
  const int C = config_.n_embd;
  ensure_rows(N);
  embed(tokens);
  for (int l = 0; l < config_.n_layer; ++l) block(l, N);
  // Final layernorm and the tied classifier, for the last new token only.
  const float* last = x_.data() + static_cast<size_t>(N - 1) * C;
  k::layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), last, tensor(layout_.lnf_weight()),
                       tensor(layout_.lnf_bias()), 1, C);
  k::matmul_nt_forward(logits_.data(), ln_.data(), tensor(layout_.wte()), 1, C, config_.vocab_size);
  position_ += N;
  return logits_;
}

TokenSampler::TokenSampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature)) {
    throw InvalidArgument("temperature must be >= 0, got " + std::to_string(options.temperature));
  }
  if (options.top_k < 0) {
    throw InvalidArgument("top_k must be >= 0 (0: no limit), got " + std::to_string(options.top_k));
  }
}

int32_t TokenSampler::next(std::span<const float> logits) {
  const int V = static_cast<int>(logits.size());
  if (options_.temperature == 0.0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  order_.resize(static_cast<size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  const int k = options_.top_k > 0 ? std::min(options_.top_k, V) : V;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  if (k < V) std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
  const double max_logit =
      k < V ? logits[order_[0]] : *std::max_element(logits.begin(), logits.end());
  probs_.resize(static_cast<size_t>(k));
  double sum = 0.0;
  for (int i = 0; i < k; ++i) {
    probs_[i] = std::exp((logits[order_[i]] - max_logit) / options_.temperature);
    sum += probs_[i];
  }
  // A uniform double in [0, 1) from 53 random bits: the same on every standard library.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (int i = 0; i < k; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  return order_[k - 1];
}

}  // namespace longhaul::model
