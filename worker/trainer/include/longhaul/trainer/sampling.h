// Text generation from a model's weights (`longhaul-worker sample`, and the sample the chief
// writes at each evaluation), and how a run's tokenizer is found again.
//
// The tokenizer of a run: training records the data manifest's tokenizer (longhaul/data/
// prepare.h) as the checkpoint metadata "tokenizer" ("bytes" or "gpt2"), and the chief copies
// a gpt2 run's vocab.json and merges.txt into <logdir>/tokenizer/, next to the checkpoints.
//
// Thread-safety: free functions; generate_text uses the tokenizer (not thread-safe) it is given.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longhaul/model/config.h"
#include "longhaul/model/gpt2_inference.h"
#include "longhaul/supervisor/training_state.h"
#include "longhaul/tokenizer/tokenizer.h"

namespace longhaul::trainer {

// The folder of a logdir holding a gpt2 run's vocab.json and merges.txt.
inline constexpr std::string_view kTokenizerDir = "tokenizer";

struct TokenizerSpec {
  std::string kind;                     // "bytes", "gpt2", or "" when unknown
  std::filesystem::path vocab, merges;  // gpt2
};

// The tokenizer that decodes a checkpoint's tokens. In order: explicit files (vocab_flag and
// merges_flag, both or neither: InvalidArgument otherwise) are gpt2; the metadata "tokenizer"
// ("gpt2": the files in <checkpoint dir>/tokenizer/, InvalidArgument naming them when absent);
// without metadata, gpt2 when <checkpoint dir>/tokenizer/ has the files, "bytes" when
// vocab_size is 256, else unknown ("").
TokenizerSpec checkpoint_tokenizer(const supervisor::TensorSource& checkpoint,
                                   const model::GPT2Config& config,
                                   const std::string& vocab_flag = {},
                                   const std::string& merges_flag = {});

// Copies a gpt2 tokenizer's files into <logdir>/tokenizer/ (atomically, only when they differ).
void save_tokenizer_files(const TokenizerSpec& spec, const std::filesystem::path& logdir);

struct GenerateOptions {
  std::string prompt;       // empty: start from <|endoftext|> (gpt2) or "\n" (bytes)
  int max_new_tokens = 64;  // >= 0
  model::SamplingOptions sampling;
  bool stop_at_end_of_text = true;  // stop after generating <|endoftext|>
};

struct Generated {
  std::vector<int32_t> prompt_ids;  // what the context started with
  std::vector<int32_t> ids;         // the generated tokens
  std::string text;                 // ids decoded (not including the prompt)
};

// Generates up to max_new_tokens after the prompt with a KV cache (GPT2Inference). A context
// longer than the model's context_length keeps its last half and recomputes the cache (as
// nanoGPT crops the context). Only ids below min(vocab_size, tokenizer.vocab_size()) are drawn
// (a model's vocabulary may be larger than its tokenizer's, e.g. padded, or a 50257-token model
// trained on bytes). on_text, if set, receives each token's bytes as it is generated.
// InvalidArgument when the prompt encodes to ids outside the model's vocabulary.
Generated generate_text(const model::GPT2Config& config, std::span<const float> params,
                        tokenizer::Tokenizer& tokenizer, const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text = {});

}  // namespace longhaul::trainer
