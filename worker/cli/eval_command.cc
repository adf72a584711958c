// `longhaul-worker eval --checkpoint FILE --data GLOB`: mean loss of a checkpoint's weights.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/data/data_loader.h"
#include "longhaul/model/gpt2_cpu.h"
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
  if (!shape) {
    try {
      shape = trainer::model_config_for(config);  // e.g. a Hugging Face file: --set model.preset
    } catch (const Error& e) {
      throw InvalidArgument(e.what());
    }
  }
  const int B = static_cast<int>(config.training.batch_size);
  const int T = static_cast<int>(std::min<int64_t>(config.training.seq_len, shape->context_length));

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
