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
#include "longhaul/trainer/validation.h"

namespace longhaul::cli {
namespace {

bool sets_a_key_starting_with(const EvalArgs& args, std::string_view prefix) {
  return std::any_of(args.sets.begin(), args.sets.end(),
                     [prefix](const auto& s) { return std::string_view(s).starts_with(prefix); });
}

model::GPT2Config shape_from_config(const trainer::WorkerConfig& config) {
  try {
    return trainer::model_config_for(config);
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
}

// The checkpoint, fully verified before use (CheckpointError, exit 4, when it is not).
std::unique_ptr<supervisor::SafetensorsReader> open_checkpoint(const std::string& path) {
  try {
    auto ckpt = std::make_unique<supervisor::SafetensorsReader>(
        path, supervisor::SafetensorsReader::Options{.require_checksums = false});
    ckpt->verify_all();
    return ckpt;
  } catch (const Error& e) {
    throw trainer::CheckpointError(e.code(), e.what());
  }
}

// The model's shape: the checkpoint's own, else (a file without longhaul metadata, such as a
// Hugging Face model.safetensors) the config's.
model::GPT2Config model_shape(const EvalArgs& args, const trainer::WorkerConfig& config,
                              const supervisor::SafetensorsReader& ckpt) {
  std::optional<model::GPT2Config> recorded;
  try {
    recorded = trainer::checkpoint_model_config(ckpt);
  } catch (const trainer::CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw trainer::CheckpointError(e.code(), e.what());
  }
  if (!recorded) return shape_from_config(config);  // e.g. a Hugging Face file: --set model.preset
  if (sets_a_key_starting_with(args, "model.")) {
    // The checkpoint records its own shape and eval uses it; a different shape asked for on the
    // command line is a mistake to report, not a request to ignore.
    const model::GPT2Config asked = shape_from_config(config);
    if (asked != *recorded) {
      throw InvalidArgument("--set model.* asks for " + asked.to_string() + ", but " +
                            args.checkpoint + " records " + recorded->to_string() +
                            "; eval always uses the checkpoint's own shape: drop the model.* "
                            "keys (they are only for files without longhaul metadata, such as a "
                            "Hugging Face model.safetensors)");
    }
  }
  return *recorded;
}

// training.seq_len for this model: the default follows the model's context; one the user chose
// is used as given, or refused when it is longer than the context.
int64_t choose_seq_len(const EvalArgs& args, const trainer::WorkerConfig& config,
                       const model::GPT2Config& shape) {
  const bool chosen = !args.config.empty() || sets_a_key_starting_with(args, "training.seq_len");
  const int64_t seq_len = chosen ? config.training.seq_len
                                 : std::min<int64_t>(config.training.seq_len, shape.context_length);
  if (seq_len > shape.context_length) {
    throw InvalidArgument(
        "training.seq_len = " + std::to_string(seq_len) +
        " is longer than the model's context_length = " + std::to_string(shape.context_length) +
        " (" + args.checkpoint + "): set training.seq_len to at most " +
        std::to_string(shape.context_length));
  }
  return seq_len;
}

// The token shards of --data, in order (DataError, exit 3, when they cannot be read).
std::unique_ptr<data::EvalLoader> open_eval_data(const EvalArgs& args, int B, int T) {
  try {
    return std::make_unique<data::EvalLoader>(data::TokenDataset::from_glob(args.data),
                                              data::LoaderOptions{.batch_size = B, .seq_len = T},
                                              args.batches);
  } catch (const Error& e) {
    throw trainer::DataError(e.code(), e.what());
  }
}

}  // namespace

int run_eval(const EvalArgs& args) {
  trainer::WorkerConfig config;
  try {
    config = trainer::load_config(args.config, args.sets);
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
  const std::unique_ptr<supervisor::SafetensorsReader> ckpt = open_checkpoint(args.checkpoint);
  const model::GPT2Config shape = model_shape(args, config, *ckpt);
  const int B = static_cast<int>(config.training.batch_size);
  const int T = static_cast<int>(choose_seq_len(args, config, shape));
  const std::unique_ptr<data::EvalLoader> loader = open_eval_data(args, B, T);

  auto model = model::make_cpu_gpt2(shape, B, T);
  try {
    auto reader = trainer::pretrained_reader(*ckpt);
    model->load_pretrained(*reader, model::PretrainedLoadOptions{.require_all = true});
  } catch (const Error& e) {
    throw trainer::CheckpointError(e.code(), "cannot load " + args.checkpoint + ": " + e.what());
  }

  const trainer::ValidationLoss loss = trainer::validation_loss(*model, *loader, B, T);
  const int64_t n = loss.batches;
  const int64_t step = ckpt->global_step();
  if (args.json) {
    nlohmann::json j{{"checkpoint", args.checkpoint}, {"step", step}, {"data", args.data},
                     {"mean_loss", loss.mean_loss},   {"batches", n}, {"tokens", n * B * T}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("checkpoint %s (step %lld): mean loss %.6f over %lld batches (%lld tokens) of %s\n",
                args.checkpoint.c_str(), static_cast<long long>(step), loss.mean_loss,
                static_cast<long long>(n), static_cast<long long>(n * B * T), args.data.c_str());
  }
  return kExitFinished;
}

}  // namespace longhaul::cli
