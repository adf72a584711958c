// Sampling benchmark: tokens/s of KV-cache inference (GPT2Inference: prefill the prompt once,
// then one token per step against the cache) versus re-running the whole context for every new
// token (the CPU training model's forward pass over the growing context, what sampling costs
// without a cache). Random GPT-2 weights (the cost does not depend on their values).
//
//   build/<preset>/bench/sample_bench [--preset gpt2-124m] [--prompt 64] [--tokens 64]
//                                     [--recompute-tokens 8]
//
// Prints one table row per method. Threads: the CPU kernels' team (LONGHAUL_NUM_THREADS).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "longhaul/model/config.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/model/gpt2_inference.h"
#include "longhaul/model/gpt2_layout.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace longhaul::model;
  std::string preset = "gpt2-124m";
  int prompt = 64, tokens = 64, recompute_tokens = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--preset")
      preset = argv[i + 1];
    else if (flag == "--prompt")
      prompt = std::atoi(argv[i + 1]);
    else if (flag == "--tokens")
      tokens = std::atoi(argv[i + 1]);
    else if (flag == "--recompute-tokens")
      recompute_tokens = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const GPT2Config c = GPT2Config::preset(preset);
  const int total = prompt + tokens;
  if (prompt < 1 || tokens < 1 || total > c.context_length) {
    std::fprintf(stderr, "need 1 <= prompt, 1 <= tokens, prompt + tokens <= %d\n",
                 c.context_length);
    return 2;
  }
  ParameterLayout layout(c);
  std::vector<float> params(layout.num_parameters());
  layout.init_weights(1, params);
  std::vector<int32_t> ids(static_cast<size_t>(total));
  for (int i = 0; i < total; ++i) ids[i] = static_cast<int32_t>((i * 7919) % c.vocab_size);

  // KV cache: prefill, then one token at a time (the next token is fixed, not sampled, so both
  // methods do the same work).
  GPT2Inference inf(c, params, total);
  auto t0 = Clock::now();
  inf.append(std::span<const int32_t>(ids).first(prompt));
  const double prefill_s = seconds_since(t0);
  t0 = Clock::now();
  for (int i = prompt; i < total; ++i) inf.append(std::span<const int32_t>(&ids[i], 1));
  const double decode_s = seconds_since(t0);

  // Full recompute: the whole context through the training model for each new token.
  auto model = make_cpu_gpt2(c, 1, total);
  std::memcpy(model->parameters_flat().data(), params.data(), params.size() * sizeof(float));
  const int n_recompute = std::min(recompute_tokens, tokens);
  t0 = Clock::now();
  for (int i = 0; i < n_recompute; ++i) {
    const int T = prompt + i + 1;
    model->forward_loss(ids.data(), ids.data(), 1, T);
  }
  const double recompute_s = seconds_since(t0);

  std::printf("== sampling %s (%lld params), prompt %d tokens, then %d new tokens, cpu\n",
              preset.c_str(), static_cast<long long>(c.num_parameters()), prompt, tokens);
  std::printf("%-34s %12s %12s %10s\n", "method", "tokens", "tokens/s", "ms/token");
  std::printf("%-34s %12d %12.1f %10.2f\n", "kv-cache prefill (prompt)", prompt, prompt / prefill_s,
              1e3 * prefill_s / prompt);
  std::printf("%-34s %12d %12.1f %10.2f\n", "kv-cache decode (1 token/step)", tokens,
              tokens / decode_s, 1e3 * decode_s / tokens);
  std::printf("%-34s %12d %12.1f %10.2f\n", "full recompute per token", n_recompute,
              n_recompute / recompute_s, 1e3 * recompute_s / n_recompute);
  std::printf("kv-cache decode speedup over recompute: %.1fx\n",
              (tokens / decode_s) / (n_recompute / recompute_s));
  return 0;
}
