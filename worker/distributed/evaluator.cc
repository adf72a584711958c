// The evaluator replica: follows the logdir, evaluates each new checkpoint. See evaluator.h.
#include "longhaul/distributed/evaluator.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/data/data_loader.h"
#include "longhaul/distributed/training_done.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/supervisor/events.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/trainer/run.h"
#include "longhaul/trainer/trainer.h"
#include "longhaul/trainer/validation.h"

namespace longhaul::dist {
namespace {

namespace fs = std::filesystem;

constexpr const char* kValLossTag = "val_loss";

// Committed checkpoints in the logdir, by step (temp files never match the pattern).
std::map<int64_t, fs::path> committed_checkpoints(const fs::path& logdir) {
  static const std::regex pattern(R"(model\.ckpt-(\d+)\.safetensors)");
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(logdir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern)) out[std::stoll(m[1].str())] = entry.path();
  }
  return out;
}

// Steps already recorded as val_loss in earlier evaluator runs.
std::set<int64_t> evaluated_steps(const fs::path& eval_dir) {
  std::set<int64_t> steps;
  std::error_code ec;
  if (!fs::exists(eval_dir, ec)) return steps;
  for (const auto& path : supervisor::list_events_files(eval_dir)) {
    try {
      supervisor::EventsReader reader(path);
      while (auto event = reader.next_event()) {
        for (const auto& value : event->summary().value()) {
          if (value.tag() == kValLossTag) steps.insert(event->step());
        }
      }
    } catch (const Error& e) {
      LH_LOG(WARNING) << "skipping the unreadable tail of an evaluator events file"
                      << kv("file", path.string()) << kv("error", e.what());
    }
  }
  return steps;
}

}  // namespace

EvaluatorResult run_evaluator(const EvaluatorOptions& options) {
  const trainer::WorkerConfig& config = options.config;
  std::ostream& out = options.progress ? *options.progress : std::cout;
  const auto& t = config.training;
  const model::GPT2Config model_config = trainer::model_config_for(config);
  auto val_set = trainer::open_val_dataset(config);
  if (!val_set) {
    throw trainer::DataError(
        Code::kInvalidArgument,
        (config.source.empty() ? std::string("config") : "config " + config.source.string()) +
            ": the evaluator needs validation data; set data.val");
  }
  data::LoaderOptions loader_options{.batch_size = t.batch_size,
                                     .seq_len = t.seq_len,
                                     .seed = t.seed,
                                     .shuffle = false,
                                     .rank = 0,
                                     .world_size = 1};
  std::unique_ptr<data::EvalLoader> val;
  try {
    val = std::make_unique<data::EvalLoader>(val_set, loader_options, config.eval.batches);
  } catch (const Error& e) {
    throw trainer::DataError(e.code(), e.what());
  }
  auto model = model::make_cpu_gpt2(model_config, static_cast<int>(t.batch_size),
                                    static_cast<int>(t.seq_len));

  const fs::path eval_dir = options.logdir / "eval";
  std::set<int64_t> done = evaluated_steps(eval_dir);
  std::unique_ptr<supervisor::EventsWriter> events;  // opened at the first evaluation
  EvaluatorResult result;
  LH_LOG(INFO) << "evaluator following the logdir" << kv("logdir", options.logdir.string())
               << kv("already_evaluated", done.size()) << kv("val", val_set->description());

  auto evaluate = [&](int64_t step, const fs::path& path) {
    std::unique_ptr<supervisor::SafetensorsReader> reader;
    try {
      reader = std::make_unique<supervisor::SafetensorsReader>(
          path, supervisor::SafetensorsReader::Options{.require_checksums = true});
      auto tensors = trainer::pretrained_reader(*reader);
      model::PretrainedLoadOptions load;
      load.require_all = true;
      model->load_pretrained(*tensors, load);
    } catch (const NotFound&) {
      LH_LOG(WARNING) << "checkpoint vanished before it was evaluated (retention?)"
                      << kv("file", path.string());
      return;
    } catch (const DataLoss& e) {
      LH_LOG(WARNING) << "skipping a corrupt checkpoint" << kv("file", path.string())
                      << kv("error", e.what());
      done.insert(step);
      return;
    } catch (const Error& e) {
      throw trainer::CheckpointError(e.code(),
                                     "evaluator cannot load " + path.string() + ": " + e.what());
    }
    const double loss = trainer::validation_loss(*model, *val, static_cast<int>(t.batch_size),
                                                 static_cast<int>(t.seq_len))
                            .mean_loss;
    if (!events) {
      events = std::make_unique<supervisor::EventsWriter>(eval_dir);
    }
    events->add_scalar(kValLossTag, loss, step);
    events->flush();
    done.insert(step);
    result.evaluated.emplace_back(step, loss);
    char line[160];
    std::snprintf(line, sizeof line, "evaluator | step %" PRId64 " | val_loss %.4f | %s\n", step,
                  loss, path.filename().string().c_str());
    out << line << std::flush;
  };

  while (true) {
    if (options.should_stop && options.should_stop()) break;
    for (const auto& [step, path] : committed_checkpoints(options.logdir)) {
      if (done.count(step)) continue;
      if (options.should_stop && options.should_stop()) break;
      evaluate(step, path);
    }
    if (auto final_step = read_training_done(options.logdir)) {
      if (done.count(*final_step) ||
          committed_checkpoints(options.logdir).count(*final_step) == 0) {
        // Evaluated, or the final checkpoint is gone (nothing more will come).
        if (!done.count(*final_step)) {
          LH_LOG(WARNING) << "the final checkpoint named by training.done is missing"
                          << kv("step", *final_step);
        }
        result.training_done = true;
        break;
      }
      continue;  // the final checkpoint appeared after the listing: evaluate it now
    }
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(options.poll_secs * 1000));
    while (std::chrono::steady_clock::now() < until) {
      if (options.should_stop && options.should_stop()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (events) events->close();
  LH_LOG(INFO) << "evaluator finished" << kv("evaluated", result.evaluated.size())
               << kv("training_done", result.training_done);
  return result;
}

}  // namespace longhaul::dist
