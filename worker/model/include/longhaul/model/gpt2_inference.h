// GPT-2 inference on the CPU with a key/value cache, for sampling text (`longhaul-worker
// sample`, and the samples the chief writes at each evaluation) without re-running the whole
// context for every new token.
//
// GPT2Inference holds, per layer, the keys and values of every position seen so far
// ((max_tokens, C) each). append(tokens) runs only the new tokens through the model: each
// attends to the cached positions and to the new ones before it (causal), and their keys and
// values are added to the cache. The math is the training model's (gpt2_cpu.cc: layernorm
// eps 1e-5, gelu tanh, tied classifier), so logits match a full forward pass over the same
// context to float rounding (gpt2_inference_test.cc states the tolerance).
//
// Memory: 2 * n_layer * max_tokens * n_embd floats of cache plus activations for one batch of
// new tokens; the parameters are borrowed, not copied.
//
// TokenSampler turns logits into the next token: temperature 0 is greedy (argmax, the lowest id
// among equal maxima); otherwise softmax(logits / temperature), optionally restricted to the
// top_k largest logits, sampled with a 64-bit Mersenne Twister seeded by `seed`, so a seed gives
// the same tokens on every machine and standard library.
//
// Thread-safety: neither class is thread-safe; the parameters must not change while a
// GPT2Inference uses them. Internally the matmuls use the CPU kernels' thread team.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <longhaul/model/config.h>
#include <longhaul/model/gpt2_layout.h>
#include <longhaul/model/pretrained.h>

namespace longhaul::model {

// Every parameter of `layout` read from `reader` (names with or without "transformer.") into
// one flat fp32 buffer in layout order. Throws NotFound naming a missing tensor and
// FailedPrecondition naming a tensor whose shape differs (with both shapes).
std::vector<float> read_parameters(const ParameterLayout& layout,
                                   const PretrainedTensorReader& reader);

class GPT2Inference {
 public:
  // `params`: num_parameters() floats in ParameterLayout(config) order, borrowed for the life of
  // this object. max_tokens in [1, context_length]: how many positions the cache holds.
  // InvalidArgument for a bad config, size or max_tokens.
  GPT2Inference(const GPT2Config& config, std::span<const float> params, int max_tokens);

  const GPT2Config& config() const { return config_; }
  int max_tokens() const { return max_tokens_; }
  // Positions in the cache (tokens appended since the last reset()).
  int position() const { return position_; }
  // Empties the cache.
  void reset() { position_ = 0; }

  // Appends `tokens` (at least one) to the context and returns the logits (vocab_size floats)
  // predicting the token after the last one; valid until the next call. InvalidArgument for an
  // id outside [0, vocab_size) or when the cache would overflow (position() + tokens.size() >
  // max_tokens()); the cache is unchanged then.
  std::span<const float> append(std::span<const int32_t> tokens);

 private:
  void ensure_rows(int rows);
  // The pieces of append(): argument checks, token + position embedding into x_, one
  // transformer block over the N new rows, and its attention (cache update, then causal
  // attention of the new rows over the whole cache).
  void check_append(std::span<const int32_t> tokens) const;
  const float* tensor(const TensorLayout& t) const;
  void embed(std::span<const int32_t> tokens);
  void block(int layer, int N);
  void attend(int layer, int N);

  GPT2Config config_;
  ParameterLayout layout_;
  std::span<const float> params_;
  int max_tokens_;
  int position_ = 0;
  std::vector<float> keys_, values_;  // (n_layer, max_tokens, C) each
  // Activations for `rows_` new tokens.
  int rows_ = 0;
  std::vector<float> x_, ln_, qkv_, atty_, proj_, fch_, fch_gelu_, mean_, rstd_, scores_;
  std::vector<float> logits_;  // (V) of the last new token
};

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 1337;
};

class TokenSampler {
 public:
  // InvalidArgument for a negative temperature or top_k.
  explicit TokenSampler(const SamplingOptions& options);
  int32_t next(std::span<const float> logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace longhaul::model
