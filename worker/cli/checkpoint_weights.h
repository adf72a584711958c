// The weights of a checkpoint as one flat fp32 buffer in the model's layout, for the commands
// that read a model without training it (sample, export). Errors are typed for exit codes:
// CheckpointError (exit 4) for an unreadable, corrupt or mismatched file, InvalidArgument
// (exit 2) for a bad --config/--set.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longhaul/model/config.h"
#include "longhaul/supervisor/safetensors.h"

namespace longhaul::cli {

struct CheckpointWeights {
  std::unique_ptr<supervisor::SafetensorsReader> reader;  // fully CRC-verified
  model::GPT2Config config;   // from the model_config metadata, else --config/--set model.*
  std::vector<float> params;  // ParameterLayout(config) order
  int64_t step = -1;          // -1: not a longhaul checkpoint
};

// Reads `path` (a longhaul checkpoint, or a Hugging Face GPT-2 safetensors file whose shape the
// config gives, e.g. --set model.preset=gpt2-124m).
CheckpointWeights load_checkpoint_weights(const std::string& path, const std::string& config_file,
                                          const std::vector<std::string>& sets);

}  // namespace longhaul::cli
