// load_checkpoint_weights: see checkpoint_weights.h.
#include "checkpoint_weights.h"

#include "longhaul/base/error.h"
#include "longhaul/model/gpt2_inference.h"
#include "longhaul/model/gpt2_layout.h"
#include "longhaul/trainer/config.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::cli {

CheckpointWeights load_checkpoint_weights(const std::string& path, const std::string& config_file,
                                          const std::vector<std::string>& sets) {
  CheckpointWeights w;
  std::optional<model::GPT2Config> shape;
  try {
    w.reader = std::make_unique<supervisor::SafetensorsReader>(
        path, supervisor::SafetensorsReader::Options{.require_checksums = false});
    w.reader->verify_all();
    shape = trainer::checkpoint_model_config(*w.reader);
  } catch (const trainer::CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw trainer::CheckpointError(e.code(), e.what());
  }
  if (!shape) {
    try {
      shape = trainer::model_config_for(trainer::load_config(config_file, sets));
    } catch (const Error& e) {
      throw InvalidArgument(e.what());
    }
  }
  const bool shape_from_config = !w.reader->metadata().count("model_config");
  w.config = *shape;
  try {
    model::ParameterLayout layout(w.config);
    w.params = model::read_parameters(layout, *trainer::pretrained_reader(*w.reader));
  } catch (const Error& e) {
    throw trainer::CheckpointError(
        e.code(),
        "cannot load " + path + ": " + e.what() +
            (shape_from_config
                 ? std::string("; the file has no longhaul model_config, so its shape "
                               "comes from the config (") +
                       w.config.to_string() + "): give it, e.g. --set model.preset=gpt2-124m"
                 : std::string()));
  }
  if (w.reader->metadata().count("global_step")) {
    try {
      w.step = w.reader->global_step();
    } catch (const Error&) {
      w.step = -1;
    }
  }
  return w;
}

}  // namespace longhaul::cli
