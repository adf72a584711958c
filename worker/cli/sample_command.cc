// `longhaul-worker sample --checkpoint FILE`: generate text with a KV cache on the CPU.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "checkpoint_weights.h"
#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/trainer/sampling.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::cli {

int run_sample(const SampleArgs& args) {
  if (args.device == "cuda") {
    throw InvalidArgument(
        "sample runs on the CPU (its KV-cache inference has no CUDA path); use --device cpu");
  }
  CheckpointWeights w = load_checkpoint_weights(args.checkpoint, args.config, args.sets);
  const trainer::TokenizerSpec spec =
      trainer::checkpoint_tokenizer(*w.reader, w.config, args.vocab, args.merges);
  if (spec.kind.empty()) {
    throw InvalidArgument("checkpoint " + args.checkpoint + " (vocab_size " +
                          std::to_string(w.config.vocab_size) +
                          ") does not say which tokenizer made its data; pass --vocab vocab.json "
                          "--merges merges.txt");
  }
  std::unique_ptr<tokenizer::Tokenizer> tok;
  try {
    tok = tokenizer::make_tokenizer(spec.kind, spec.vocab, spec.merges);
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
  if (tok->vocab_size() > w.config.vocab_size) {
    LH_LOG(WARNING) << "the tokenizer has more ids than the model's vocabulary"
                    << kv("tokenizer_vocab", tok->vocab_size())
                    << kv("model_vocab_size", w.config.vocab_size);
  }
  trainer::GenerateOptions go;
  go.prompt = args.prompt;
  go.max_new_tokens = args.tokens;
  go.sampling = {.temperature = args.temperature, .top_k = args.top_k, .seed = args.seed};
  go.stop_at_end_of_text = !args.ignore_end_of_text;
  std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
  const auto start = std::chrono::steady_clock::now();
  const trainer::Generated g =
      trainer::generate_text(w.config, w.params, *tok, go, [](std::string_view bytes) {
        std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        std::fflush(stdout);
      });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "sample: %zu prompt + %zu generated tokens (%s) in %.2f s, %.1f tokens/s on cpu, "
               "step %s of %s\n",
               g.prompt_ids.size(), g.ids.size(), spec.kind.c_str(), secs,
               secs > 0 ? static_cast<double>(g.ids.size()) / secs : 0.0,
               w.step < 0 ? "unknown" : std::to_string(w.step).c_str(), args.checkpoint.c_str());
  return kExitFinished;
}

}  // namespace longhaul::cli
