// LanguageModel's shared, non-virtual parts: the argument checks every backend applies.
#include "longhaul/model/language_model.h"

#include <string>
#include <utility>

#include "longhaul/base/error.h"

namespace longhaul::model {

void LanguageModel::check_batch(const int32_t* inputs, const int32_t* targets, int B, int T) const {
  if (B < 1 || B > max_batch_size()) {
    throw InvalidArgument("batch size B = " + std::to_string(B) + " is outside [1, " +
                          std::to_string(max_batch_size()) + "] (the model's max_batch_size)");
  }
  if (T < 1 || T > max_seq_len()) {
    throw InvalidArgument("sequence length T = " + std::to_string(T) + " is outside [1, " +
                          std::to_string(max_seq_len()) + "] (the model's max_seq_len)");
  }
  const int V = config().vocab_size;
  for (const auto& [tokens, what] : {std::pair{inputs, "input"}, std::pair{targets, "target"}}) {
    for (int i = 0; i < B * T; ++i) {
      if (tokens[i] < 0 || tokens[i] >= V) {
        throw InvalidArgument(std::string(what) + " token id " + std::to_string(tokens[i]) +
                              " at (b=" + std::to_string(i / T) + ", t=" + std::to_string(i % T) +
                              ") is outside [0, " + std::to_string(V) +
                              "): the data's vocabulary does not match the model's vocab_size");
      }
    }
  }
}

}  // namespace longhaul::model
