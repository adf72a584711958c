// The shape of a GPT-2 family model and its named presets.
//
// Presets (vocab / context / layers / heads / channels):
//   tiny          256 / 128  / 4  / 4  / 128   byte-level; visibly trains in a minute on 2 cores
//   small-4x256   256 / 256  / 4  / 4  / 256   byte-level; the CPU benchmark config
//   gpt2-124m   50257 / 1024 / 12 / 12 / 768   OpenAI GPT-2 small (Hugging Face "gpt2")
//   gpt2-350m   50257 / 1024 / 24 / 16 / 1024  OpenAI GPT-2 medium ("gpt2-medium")
//
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::model {

struct GPT2Config {
  int vocab_size = 0;      // number of token ids, V
  int context_length = 0;  // maximum sequence length, maxT (rows of wpe)
  int n_layer = 0;         // transformer blocks, L
  int n_head = 0;          // attention heads, NH; n_embd must be a multiple of it
  int n_embd = 0;          // channels, C

  // Throws InvalidArgument naming the first bad field and its value.
  void validate() const;

  // Number of trainable parameters (lm_head is tied to wte and not counted twice), computed
  // from the shape alone. 124,439,808 for gpt2-124m.
  int64_t num_parameters() const;

  // "vocab_size=256 context_length=128 n_layer=4 n_head=4 n_embd=128".
  std::string to_string() const;

  bool operator==(const GPT2Config&) const = default;

  // The preset with this name; throws InvalidArgument listing the known names when unknown.
  static GPT2Config preset(std::string_view name);
  static std::vector<std::string> preset_names();
};

}  // namespace longhaul::model
