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

// The validation data of the config, in order (DataError, exit 3, when there is none or it
// cannot be read).
std::unique_ptr<data::EvalLoader> open_validation(const trainer::WorkerConfig& config,
                                                  std::string& description) {
  const auto& t = config.training;
  auto val_set = trainer::open_val_dataset(config);
  if (!val_set) {
    throw trainer::DataError(
        Code::kInvalidArgument,
        (config.source.empty() ? std::string("config") : "config " + config.source.string()) +
            ": the evaluator needs validation data; set data.val");
  }
  description = val_set->description();
  data::LoaderOptions loader_options{.batch_size = t.batch_size,
                                     .seq_len = t.seq_len,
                                     .seed = t.seed,
                                     .shuffle = false,
                                     .rank = 0,
                                     .world_size = 1};
  try {
    return std::make_unique<data::EvalLoader>(val_set, loader_options, config.eval.batches);
  } catch (const Error& e) {
    throw trainer::DataError(e.code(), e.what());
  }
}

// Evaluates checkpoints one at a time with one model, recording each val_loss in the
// evaluator's own events files and in `result`.
class CheckpointEvaluator {
 public:
  CheckpointEvaluator(const EvaluatorOptions& options, EvaluatorResult& result)
      : config_(options.config),
        out_(options.progress ? *options.progress : std::cout),
        model_(model::make_cpu_gpt2(trainer::model_config_for(config_),
                                    static_cast<int>(config_.training.batch_size),
                                    static_cast<int>(config_.training.seq_len))),
        val_(open_validation(config_, val_description_)),
        eval_dir_(options.logdir / "eval"),
        done_(evaluated_steps(eval_dir_)),
        result_(result) {
    LH_LOG(INFO) << "evaluator following the logdir" << kv("logdir", options.logdir.string())
                 << kv("already_evaluated", done_.size()) << kv("val", val_description_);
  }

  // Closes the events file, if an evaluation opened one.
  void close() {
    if (events_) events_->close();
  }

  bool done(int64_t step) const { return done_.count(step) > 0; }

  // Loads the checkpoint and records its validation loss. A checkpoint removed by retention is
  // skipped (it may come back under the same step: not marked done), a corrupt one skipped for
  // good; one of another model shape is a CheckpointError, a bad validation batch a DataError.
  void evaluate(int64_t step, const fs::path& path) {
    if (!load(step, path)) return;
    const auto& t = config_.training;
    const double loss = trainer::validation_loss(*model_, *val_, static_cast<int>(t.batch_size),
                                                 static_cast<int>(t.seq_len))
                            .mean_loss;
    if (!events_) events_ = std::make_unique<supervisor::EventsWriter>(eval_dir_);
    events_->add_scalar(kValLossTag, loss, step);
    events_->flush();
    done_.insert(step);
    result_.evaluated.emplace_back(step, loss);
    char line[160];
    std::snprintf(line, sizeof line, "evaluator | step %" PRId64 " | val_loss %.4f | %s\n", step,
                  loss, path.filename().string().c_str());
    out_ << line << std::flush;
  }

 private:
  // The checkpoint's weights into the model; false when it is gone or corrupt.
  bool load(int64_t step, const fs::path& path) {
    try {
      supervisor::SafetensorsReader reader(
          path, supervisor::SafetensorsReader::Options{.require_checksums = true});
      auto tensors = trainer::pretrained_reader(reader);
      model::PretrainedLoadOptions load;
      load.require_all = true;
      model_->load_pretrained(*tensors, load);
      return true;
    } catch (const NotFound&) {
      LH_LOG(WARNING) << "checkpoint vanished before it was evaluated (retention?)"
                      << kv("file", path.string());
      return false;
    } catch (const DataLoss& e) {
      LH_LOG(WARNING) << "skipping a corrupt checkpoint" << kv("file", path.string())
                      << kv("error", e.what());
      done_.insert(step);
      return false;
    } catch (const Error& e) {
      throw trainer::CheckpointError(e.code(),
                                     "evaluator cannot load " + path.string() + ": " + e.what());
    }
  }

  const trainer::WorkerConfig& config_;
  std::ostream& out_;
  std::unique_ptr<model::LanguageModel> model_;
  std::string val_description_;
  std::unique_ptr<data::EvalLoader> val_;
  const fs::path eval_dir_;
  std::set<int64_t> done_;
  std::unique_ptr<supervisor::EventsWriter> events_;  // opened at the first evaluation
  EvaluatorResult& result_;
};

// Waits up to poll_secs, or until should_stop says so.
void wait_for_next_poll(const EvaluatorOptions& options) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(options.poll_secs * 1000));
  while (std::chrono::steady_clock::now() < until) {
    if (options.should_stop && options.should_stop()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

EvaluatorResult run_evaluator(const EvaluatorOptions& options) {
  EvaluatorResult result;
  CheckpointEvaluator evaluator(options, result);
  while (true) {
    if (options.should_stop && options.should_stop()) break;
    for (const auto& [step, path] : committed_checkpoints(options.logdir)) {
      if (evaluator.done(step)) continue;
      if (options.should_stop && options.should_stop()) break;
      evaluator.evaluate(step, path);
    }
    if (auto final_step = read_training_done(options.logdir)) {
      if (evaluator.done(*final_step) ||
          committed_checkpoints(options.logdir).count(*final_step) == 0) {
        // Evaluated, or the final checkpoint is gone (nothing more will come).
        if (!evaluator.done(*final_step)) {
          LH_LOG(WARNING) << "the final checkpoint named by training.done is missing"
                          << kv("step", *final_step);
        }
        result.training_done = true;
        break;
      }
      continue;  // the final checkpoint appeared after the listing: evaluate it now
    }
    wait_for_next_poll(options);
  }
  evaluator.close();
  LH_LOG(INFO) << "evaluator finished" << kv("evaluated", result.evaluated.size())
               << kv("training_done", result.training_done);
  return result;
}

}  // namespace longhaul::dist
