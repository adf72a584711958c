// `longhaul-worker eval --checkpoint FILE --data GLOB`: mean loss of a checkpoint's weights.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/data/data_loader.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/trainer/config.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::cli {

int run_eval(const EvalArgs& args) {
  trainer::WorkerConfig config;
  try {
    config = trainer::load_config(args.config, args.sets);
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }

  // The checkpoint: fully verified before use.
  std::unique_ptr<supervisor::SafetensorsReader> ckpt;
  std::optional<model::GPT2Config> shape;
  try {
    ckpt = std::make_unique<supervisor::SafetensorsReader>(
        args.checkpoint, supervisor::SafetensorsReader::Options{.require_checksums = false});
    ckpt->verify_all();
    shape = trainer::checkpoint_model_config(*ckpt);
  } catch (const trainer::CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw trainer::CheckpointError(e.code(), e.what());
  }
  const bool model_keys_set = std::any_of(args.sets.begin(), args.sets.end(), [](const auto& s) {
    return std::string_view(s).starts_with("model.");
  });
  if (!shape) {
    try {
      shape = trainer::model_config_for(config);  // e.g. a Hugging Face file: --set model.preset
    } catch (const Error& e) {
      throw InvalidArgument(e.what());
    }
  } else if (model_keys_set) {
    // The checkpoint records its own shape and eval uses it; a different shape asked for on the
    // command line is a mistake to report, not a request to ignore.
    std::optional<model::GPT2Config> asked;
    try {
      asked = trainer::model_config_for(config);
    } catch (const Error& e) {
      throw InvalidArgument(e.what());
    }
    if (*asked != *shape) {
      throw InvalidArgument("--set model.* asks for " + asked->to_string() + ", but " +
                            args.checkpoint + " records " + shape->to_string() +
                            "; eval always uses the checkpoint's own shape: drop the model.* "
                            "keys (they are only for files without longhaul metadata, such as a "
                            "Hugging Face model.safetensors)");
    }
  }
  const int B = static_cast<int>(config.training.batch_size);
  // The default seq_len follows the model; one the user chose is used as given or refused.
  const bool seq_len_chosen =
      !args.config.empty() || std::any_of(args.sets.begin(), args.sets.end(), [](const auto& s) {
        return std::string_view(s).starts_with("training.seq_len");
      });
  if (!seq_len_chosen) {
    config.training.seq_len = std::min<int64_t>(config.training.seq_len, shape->context_length);
  }
  if (config.training.seq_len > shape->context_length) {
    throw InvalidArgument(
        "training.seq_len = " + std::to_string(config.training.seq_len) +
        " is longer than the model's context_length = " + std::to_string(shape->context_length) +
        " (" + args.checkpoint + "): set training.seq_len to at most " +
        std::to_string(shape->context_length));
  }
  const int T = static_cast<int>(config.training.seq_len);

  std::shared_ptr<const data::TokenDataset> dataset;
  std::unique_ptr<data::EvalLoader> loader;
  try {
    dataset = data::TokenDataset::from_glob(args.data);
    loader = std::make_unique<data::EvalLoader>(
        dataset, data::LoaderOptions{.batch_size = B, .seq_len = T}, args.batches);
  } catch (const Error& e) {
    throw trainer::DataError(e.code(), e.what());
  }

  auto model = model::make_cpu_gpt2(*shape, B, T);
  try {
    auto reader = trainer::pretrained_reader(*ckpt);
    model->load_pretrained(*reader, model::PretrainedLoadOptions{.require_all = true});
  } catch (const Error& e) {
    throw trainer::CheckpointError(e.code(), "cannot load " + args.checkpoint + ": " + e.what());
  }

  std::vector<int32_t> inputs, targets;
  data::Batch batch;
  double sum = 0;
  int64_t n = 0;
  while (loader->next(batch)) {
    batch.to_int32(inputs, targets);
    try {
      sum += model->forward_loss(inputs.data(), targets.data(), B, T);
    } catch (const InvalidArgument& e) {
      throw trainer::DataError(Code::kInvalidArgument,
                               "bad batch from " + std::string(batch.source) + ": " + e.what());
    }
    ++n;
  }
  const double mean = sum / static_cast<double>(n);
  const int64_t step = ckpt->global_step();
  if (args.json) {
    nlohmann::json j{{"checkpoint", args.checkpoint},
                     {"step", step},
                     {"data", args.data},
                     {"mean_loss", mean},
                     {"batches", n},
                     {"tokens", n * B * T}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("checkpoint %s (step %lld): mean loss %.6f over %lld batches (%lld tokens) of %s\n",
                args.checkpoint.c_str(), static_cast<long long>(step), mean,
                static_cast<long long>(n), static_cast<long long>(n * B * T), args.data.c_str());
  }
  return kExitFinished;
}

}  // namespace longhaul::cli
