// The CPU backend of LanguageModel: fp32 GPT-2 on longhaul::kernels_cpu (OpenMP + OpenBLAS).
//
// Memory: four flat buffers of num_parameters() floats (parameters, gradients, AdamW m and v),
// plus activations sized at construction for (max_batch_size, max_seq_len): per layer
// ~ (16 C + NH T) floats per token, plus (V + 4C) per token for the classifier and the
// backward scratch. Calls may use any smaller B and T.
//
// Determinism: bit-identical results for the same seed, inputs and thread count.
#pragma once

#include <memory>

#include <longhaul/model/language_model.h>

namespace longhaul::model {

// Throws InvalidArgument for a bad config or max_batch_size/max_seq_len outside
// [1, context_length]; std::bad_alloc if the buffers do not fit in memory.
std::unique_ptr<LanguageModel> make_cpu_gpt2(const GPT2Config& config, int max_batch_size,
                                             int max_seq_len);

}  // namespace longhaul::model
