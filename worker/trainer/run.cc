// run_training: model + data + supervisor for one replica. See run.h.
#include "longhaul/trainer/run.h"

#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "longhaul/base/log.h"
#include "longhaul/data/prepare.h"
#include "longhaul/kernels/cpu/threading.h"
#include "longhaul/supervisor/events.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/supervisor/signals.h"
#include "longhaul/supervisor/supervisor.h"
#include "longhaul/trainer/sampling.h"

namespace longhaul::trainer {
namespace {

std::string hms(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "--:--:--";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02" PRId64 ":%02" PRId64 ":%02" PRId64, s / 3600, (s / 60) % 60,
                s % 60);
  return buf;
}

template <typename Fn>
auto as_data_error(Fn&& fn) {
  try {
    return fn();
  } catch (const DataError&) {
    throw;
  } catch (const Cancelled&) {
    throw;  // a stop request, not bad data
  } catch (const Error& e) {
    throw DataError(e.code(), e.what());
  }
}

// The labels of a device plan as one JSON object.
std::string kernels_json(const selfcheck::DevicePlan& plan) {
  nlohmann::json j = nlohmann::json::object();
  j["device"] = plan.device;
  for (const auto& [key, value] : plan.labels()) j[key] = value;
  return j.dump();
}

// A TensorBoard text summary: plugin "text", a scalar DT_STRING tensor holding Markdown (the
// text is shown preformatted: indented by four spaces).
tensorboard::Summary text_summary(const std::string& tag, const std::string& text) {
  tensorboard::Summary summary;
  auto* value = summary.add_value();
  value->set_tag(tag);
  value->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* tensor = value->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  std::string markdown;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) markdown += "    " + line + "\n";
  tensor->add_string_val(markdown);
  return summary;
}

// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 when the bytes there are not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80             ? 1
                   : (b & 0xE0) == 0xC0 ? 2
                   : (b & 0xF0) == 0xE0 ? 3
                   : (b & 0xF8) == 0xF0 ? 4
                                        : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t c = n == 1 ? b : b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto x = static_cast<unsigned char>(s[i + k]);
    if ((x & 0xC0) != 0x80) return 0;
    c = (c << 6) | (x & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMin[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  return n;
}

// Valid UTF-8 for logs and TensorBoard: bytes that are not UTF-8 become `invalid(byte)`, and
// with `one_line` newlines, tabs and other control bytes are escaped (\n, \t, \xNN).
std::string printable(std::string_view text, bool one_line) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    char buf[8];
    if (n == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += one_line ? buf : "\uFFFD";
      i += 1;
      continue;
    }
    if (one_line && n == 1 && (c < 0x20 || c == 0x7f)) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

// Markdown for TensorBoard's text dashboard: an indented code block shows the text verbatim.
std::string markdown_code_block(std::string_view text) {
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

// The tokenizer of the training data: the data manifest's, bytes for the embedded corpus or a
// 256-token vocabulary, else unknown ("").
TokenizerSpec data_tokenizer(const WorkerConfig& config, const model::GPT2Config& shape) {
  if (config.data.train.empty()) return {"bytes", {}, {}};
  std::optional<data::DataManifest> manifest =
      as_data_error([&] { return data::read_data_manifest(config.data.train); });
  if (manifest) return {manifest->tokenizer, manifest->vocab, manifest->merges};
  if (shape.vocab_size == 256) return {"bytes", {}, {}};
  return {};
}

}  // namespace

std::shared_ptr<const data::TokenDataset> open_train_dataset(
    const WorkerConfig& config, const std::function<bool()>& stop_requested) {
  return as_data_error([&] {
    return config.data.train.empty()
               ? data::embedded_dataset(false)
               : data::TokenDataset::from_glob(config.data.train, stop_requested);
  });
}

std::shared_ptr<const data::TokenDataset> open_val_dataset(
    const WorkerConfig& config, const std::function<bool()>& stop_requested) {
  return as_data_error([&]() -> std::shared_ptr<const data::TokenDataset> {
    if (!config.data.val.empty()) {
      return data::TokenDataset::from_glob(config.data.val, stop_requested);
    }
    if (config.data.train.empty()) return data::embedded_dataset(true);
    return nullptr;
  });
}

namespace {

// The data a run reads: the training loader over train_set and, when evaluation is on and there
// is validation data, the validation loader (DataError, exit 3, on any problem).
struct RunData {
  std::shared_ptr<const data::TokenDataset> train_set;
  std::unique_ptr<data::DataLoader> train;
  std::unique_ptr<data::EvalLoader> val;
};

// `stop_requested` is asked between shards (Cancelled).
RunData open_run_data(const WorkerConfig& config, const RunOptions& options,
                      const std::function<bool()>& stop_requested) {
  const auto& t = config.training;
  data::LoaderOptions loader_options{.batch_size = t.batch_size,
                                     .seq_len = t.seq_len,
                                     .seed = t.seed,
                                     .shuffle = config.data.shuffle,
                                     .rank = options.rank,
                                     .world_size = options.world_size};
  RunData d;
  d.train_set = open_train_dataset(config, stop_requested);
  d.train = as_data_error(
      [&] { return std::make_unique<data::DataLoader>(d.train_set, loader_options); });
  if (config.eval.every_steps > 0) {
    if (auto val_set = open_val_dataset(config, stop_requested)) {
      d.val = as_data_error([&] {
        return std::make_unique<data::EvalLoader>(val_set, loader_options, config.eval.batches);
      });
    } else {
      LH_LOG(WARNING) << "eval.every_steps is set but there is no validation data (data.val); "
                         "evaluation is off";
    }
  }
  return d;
}

// The model on the device the config asks for, with the plan that chose it. A device that cannot
// run it (cuda without a usable GPU, activations that do not fit, ...) is a config error.
selfcheck::ModelOnDevice make_run_model(const WorkerConfig& config,
                                        const model::GPT2Config& model_config, int world_size) {
  try {
    return selfcheck::make_model_on_device(model_config, device_options(config, world_size));
  } catch (const Error& e) {
    throw InvalidArgument(
        (config.source.empty() ? std::string("config") : "config " + config.source.string()) +
        ": device " + config.device + ": " + e.what());
  }
}

// A step that reads more tokens than the training data holds repeats data inside one step.
void warn_if_a_step_repeats_data(const Trainer& trainer, const data::TokenDataset& train_set,
                                 int world_size) {
  const uint64_t step_tokens =
      static_cast<uint64_t>(trainer.tokens_per_step()) * static_cast<uint64_t>(world_size);
  if (step_tokens > train_set.total_tokens()) {
    LH_LOG(WARNING) << "one optimizer step reads more tokens than the training data holds: "
                       "every step repeats data; lower training.total_batch_tokens or add data"
                    << kv("training.total_batch_tokens", step_tokens)
                    << kv("data_tokens", train_set.total_tokens());
  }
}

// The data's tokenizer: recorded in checkpoints (gpt2 files copied into the logdir by the chief)
// so that `sample` and `export` decode. Returns the tokenizer the chief samples text with at each
// evaluation (null: no samples).
std::unique_ptr<tokenizer::Tokenizer> set_up_tokenizer(Trainer& trainer,
                                                       const model::GPT2Config& model_config,
                                                       const RunOptions& options,
                                                       bool chief_at_start) {
  const WorkerConfig& config = options.config;
  const TokenizerSpec spec = data_tokenizer(config, model_config);
  if (spec.kind.empty()) return nullptr;
  trainer.set_checkpoint_metadata("tokenizer", spec.kind);
  if (chief_at_start) save_tokenizer_files(spec, options.logdir);
  // Samples are the chief's; with recovery in place any replica may become the chief.
  if (!(chief_at_start || options.regroup) || config.eval.sample_tokens <= 0) return nullptr;
  return as_data_error(
      [&] { return tokenizer::make_tokenizer(spec.kind, spec.vocab, spec.merges); });
}

// The supervisor's settings from the config (init_fn, which needs the trainer, is the caller's).
supervisor::SupervisorOptions supervisor_options(const RunOptions& options, bool chief_at_start) {
  const WorkerConfig& config = options.config;
  supervisor::SupervisorOptions so;
  so.logdir = options.logdir;
  so.is_chief = chief_at_start;
  so.save_model_secs = config.checkpoint.save_model_secs;
  so.save_summaries_secs = config.summaries.save_summaries_secs;
  so.recovery_wait_secs = config.supervisor.recovery_wait_secs;
  so.max_wait_secs = config.supervisor.max_wait_secs;
  so.lock_lease_secs = config.supervisor.lock_lease_secs;
  so.stop_grace_secs = std::min(config.supervisor.stop_grace_secs, config.grace_period_secs);
  so.max_to_keep = config.checkpoint.max_to_keep;
  so.keep_checkpoint_every_n_hours = config.checkpoint.keep_checkpoint_every_n_hours;
  so.summaries_enabled = config.summaries.every_steps > 0;
  so.checkpoint_listeners = options.checkpoint_listeners;
  so.state_from_peers = options.receive_state;
  return so;
}

// Attaches the signal handler to the supervisor for as long as it lives: detached before the
// supervisor is destroyed, on every path.
class SignalAttachment {
 public:
  SignalAttachment(supervisor::SignalHandler* signals, supervisor::Supervisor& sv)
      : signals_(signals) {
    if (signals_ != nullptr) signals_->attach(sv);
  }
  ~SignalAttachment() {
    if (signals_ != nullptr) signals_->detach();
  }
  SignalAttachment(const SignalAttachment&) = delete;
  SignalAttachment& operator=(const SignalAttachment&) = delete;

 private:
  supervisor::SignalHandler* signals_;
};

// Between micro-batches: abandon the step when a stop was requested and its rest would not fit
// in half of what is left of the grace period (the other half is for the final checkpoint); a
// stop with an error (a failed service) abandons it at once.
void set_stop_check(Trainer& trainer, supervisor::Supervisor& sv,
                    supervisor::SignalHandler* signals, double grace) {
  trainer.set_stop_check([&sv, signals, grace](double seconds_left_in_step) {
    if (!sv.should_stop()) return false;
    if (signals == nullptr || !signals->stop_requested()) return true;
    const double budget = 0.5 * grace - signals->seconds_since_signal();
    return seconds_left_in_step > budget;
  });
}

// One managed session of the supervisor: the start line, the step loop (progress lines,
// summaries, evaluations, checkpoints by step count), recovery in place after a lost peer, and
// the final evaluation.
class TrainingSession {
 public:
  TrainingSession(const RunOptions& options, Trainer& trainer, supervisor::Supervisor& sv,
                  const selfcheck::DevicePlan& plan, const std::string& numerics,
                  tokenizer::Tokenizer* sample_tokenizer, bool pretrained, RunResult& result)
      : options_(options),
        config_(options.config),
        t_(options.config.training),
        out_(options.progress ? *options.progress : std::cout),
        trainer_(trainer),
        sv_(sv),
        plan_(plan),
        numerics_(numerics),
        sample_tokenizer_(sample_tokenizer),
        pretrained_(pretrained),
        from_peers_(static_cast<bool>(options.receive_state)),
        result_(result) {}

  void run() {
    if (options_.sync_state && !from_peers_) options_.sync_state(trainer_);
    start_step_ = trainer_.global_step();
    result_.restored_step = sv_.restored_step();
    announce_start();
    while (true) {
      StepStats s;
      try {
        if (stopping() || trainer_.global_step() >= t_.max_steps) break;
        s = trainer_.train_step();
      } catch (const Aborted& lost) {
        if (!options_.regroup) throw;
        if (recovered_from(lost)) continue;
        break;
      }
      record(s);
    }
    if (config_.eval.every_steps > 0 && trainer_.global_step() >= t_.max_steps &&
        last_eval_step_ != trainer_.global_step() && !sv_.should_stop()) {
      evaluate(trainer_.global_step());
    }
  }

 private:
  bool stopping() {
    return options_.agree_stop ? options_.agree_stop(sv_.should_stop()) : sv_.should_stop();
  }

  // The numerical-environment warning, on_session_start, the start line, and what this run
  // trains on and why as the events file's first summary (TensorBoard: Text).
  void announce_start() {
    if (sv_.restored_step() && !trainer_.restored_numerics().empty() &&
        trainer_.restored_numerics() != numerics_) {
      LH_LOG(WARNING) << "resuming in another numerical environment than the checkpoint was "
                         "written in: the continuation is numerically equivalent, not "
                         "bit-identical to an uninterrupted run"
                      << kv("checkpoint", trainer_.restored_numerics()) << kv("now", numerics_);
    }
    if (options_.on_session_start) {
      options_.on_session_start(start_step_, sv_.restored_step().has_value());
    }
    const auto& mc = trainer_.model().config();
    std::ostringstream head;
    head << "longhaul-worker: " << (sv_.restored_step() || from_peers_ ? "resuming" : "starting")
         << " at step " << start_step_ << "/" << t_.max_steps
         << (from_peers_ ? " (state from the running replicas, no checkpoint read)" : "")
         << " | model " << config_.model.preset << " (" << mc.to_string() << ", "
         << trainer_.model().num_parameters() << " params) on " << trainer_.model().device_name()
         << (trainer_.model().memory_space() == model::MemorySpace::kHost
                 ? " (" + std::to_string(kernels::cpu::num_threads()) +
                       (kernels::cpu::num_threads() == 1 ? " thread)" : " threads)")
                 : "")
         << " | data " << (config_.data.train.empty() ? "<embedded corpus>" : config_.data.train)
         << " | " << trainer_.tokens_per_step() << " tokens/step (" << trainer_.accumulation_steps()
         << " micro-batches of " << t_.batch_size << "x" << t_.seq_len << ")"
         << (pretrained_ ? " | initialised from " + config_.checkpoint.init_from : "")
         << " | logdir " << options_.logdir.string() << "\n";
    out_ << head.str() << std::flush;
    sv_.summary_computed(text_summary("device", plan_.details()), start_step_);
  }

  // The validation loss at `step` (and, on the chief, a text sample).
  void evaluate(int64_t step) {
    if (auto val = trainer_.evaluate()) {
      result_.last_val_loss = val;
      sv_.add_scalar("val_loss", *val, step);
      char line[128];
      std::snprintf(line, sizeof line, "step %6" PRId64 "/%" PRId64 " | val_loss %.4f\n", step,
                    t_.max_steps, *val);
      out_ << line << std::flush;
    }
    if (sample_tokenizer_ != nullptr && sv_.is_chief()) sample(step);
    last_eval_step_ = step;
  }

  void sample(int64_t step) {
    auto& model = trainer_.model();
    std::vector<float> params(static_cast<size_t>(model.num_parameters()));
    model.download(model.parameters_flat(), params);
    GenerateOptions go;
    go.prompt = config_.eval.sample_prompt;
    go.max_new_tokens = static_cast<int>(config_.eval.sample_tokens);
    go.sampling.seed = t_.seed + static_cast<uint64_t>(step);  // the same after a resume
    const Generated g = generate_text(model.config(), params, *sample_tokenizer_, go);
    const std::string text = go.prompt + g.text;
    sv_.add_text("samples", markdown_code_block(printable(text, false)), step);
    out_ << "step " << std::setw(6) << step << "/" << t_.max_steps
         << " | sample: " << printable(text, true) << "\n"
         << std::flush;
  }

  // Recovery in place after a failed collective (see RunOptions::regroup). Bounded: a group
  // that cannot be re-formed within the regroup callback's own timeout gives up.
  enum class Recovery { kRegrouped, kGaveUp, kStopped };
  Recovery recover(const Aborted& lost) {
    LH_LOG(WARNING) << "a peer was lost; recovering in place" << kv("step", trainer_.global_step())
                    << kv("error", lost.what());
    // Losses during the regroup start another one, but none starts after the regroup timeout
    // (a replacement that crashes at every start must not keep the survivors forever).
    const auto give_up = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(
                             static_cast<int64_t>(config_.supervisor.regroup_timeout_secs * 1000));
    while (true) {
      if (std::chrono::steady_clock::now() >= give_up) {
        LH_LOG(ERROR) << "peers kept being lost while regrouping for longer than "
                         "supervisor.regroup_timeout_secs; giving up";
        return Recovery::kGaveUp;
      }
      try {
        return options_.regroup(trainer_) ? Recovery::kRegrouped : Recovery::kGaveUp;
      } catch (const Aborted& again) {
        LH_LOG(WARNING) << "a peer was lost again while regrouping" << kv("error", again.what());
      } catch (const Cancelled& e) {
        LH_LOG(INFO) << "stop requested while regrouping" << kv("reason", e.what());
        return Recovery::kStopped;
      }
    }
  }

  // True when training goes on after the loss; false when the session ends (stop requested).
  bool recovered_from(const Aborted& lost) {
    const Recovery r = recover(lost);
    if (r == Recovery::kRegrouped) {
      ++result_.regroups;
      // The chief was the one lost and this replica is the lowest surviving rank: it takes
      // over the chief's writes before the next step. The lost chief's writer lock went with
      // its process; one still alive (a partition) keeps it, and promote_to_chief gives up
      // after the wait (Aborted: exit 138, the group restarts).
      if (options_.chief_role && options_.chief_role() && !sv_.is_chief()) {
        sv_.promote_to_chief(trainer_, std::chrono::milliseconds(static_cast<int64_t>(
                                           config_.supervisor.regroup_timeout_secs * 1000)));
        // The new events file tells what this run trains on, as the first chief's did.
        sv_.summary_computed(text_summary("device", plan_.details()), trainer_.global_step());
      }
      return true;
    }
    result_.regroup_failed = r == Recovery::kGaveUp;
    // The last completed step is committed as the session's final checkpoint (chief). A
    // worker commits it when the chief is the one lost (nobody holds the writer lock).
    if (result_.regroup_failed && !sv_.is_chief()) {
      try {
        sv_.commit_checkpoint_as_successor(trainer_);
      } catch (const Error& e) {  // still exit 138: the latest checkpoint stays as it was
        LH_LOG(ERROR) << "could not commit a checkpoint in place of the lost chief"
                      << kv("error", e.what());
      }
    }
    sv_.request_stop();
    return false;
  }

  // After a step: the result, the progress line, the summaries, an evaluation and a checkpoint
  // when their step counts come, and the step boundary.
  void record(const StepStats& s) {
    result_.skipped_steps = s.skipped_total;
    if (s.skipped) {
      // Logged at the step's index like the training scalars; counted in metrics by on_step.
      sv_.add_scalar("skipped_steps", static_cast<double>(s.skipped_total), s.step - 1);
      char line[320];
      std::snprintf(line, sizeof line,
                    "step %6" PRId64 "/%" PRId64 " | SKIPPED (%s) | %" PRId64 " skipped so far\n",
                    s.step, t_.max_steps, s.skip_reason.c_str(), s.skipped_total);
      out_ << line << std::flush;
    } else {
      result_.last_loss = s.loss;
    }
    ema_step_seconds_ =
        ema_step_seconds_ == 0 ? s.seconds : 0.9 * ema_step_seconds_ + 0.1 * s.seconds;
    if (options_.on_step) options_.on_step(s);
    const double tokens_per_sec = s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0;
    if (!s.skipped && (s.step % config_.log.every_steps == 0 || s.step == t_.max_steps ||
                       s.step == start_step_ + 1)) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %6" PRId64 "/%" PRId64
                    " | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | eta %s\n",
                    s.step, t_.max_steps, s.loss, s.learning_rate, s.grad_norm, tokens_per_sec,
                    hms(ema_step_seconds_ * static_cast<double>(t_.max_steps - s.step)).c_str());
      out_ << line << std::flush;
    }
    // Training scalars carry the step's 0-based index (the global step before it ran), as in
    // TensorFlow: a restart's SessionLog START at the restored step s makes TensorBoard purge
    // events at steps >= s from the earlier run, so the last step before a checkpoint at s
    // must be logged at s - 1 to survive.
    const int64_t index = s.step - 1;
    const int64_t summary_every = config_.summaries.every_steps;
    if (summary_every > 0 && index % summary_every == 0 && !s.skipped) {
      sv_.add_scalar("loss", s.loss, index);
      sv_.add_scalar("learning_rate", s.learning_rate, index);
      sv_.add_scalar("grad_norm", s.grad_norm, index);
      sv_.add_scalar("tokens_per_sec", tokens_per_sec, index);
    }
    if (config_.eval.every_steps > 0 && s.step % config_.eval.every_steps == 0) evaluate(s.step);
    if (config_.checkpoint.save_model_steps > 0 &&
        s.step % config_.checkpoint.save_model_steps == 0) {
      sv_.request_checkpoint();
    }
    sv_.step_boundary(s.step);
  }

  const RunOptions& options_;
  const WorkerConfig& config_;
  const TrainingConfigSection& t_;
  std::ostream& out_;
  Trainer& trainer_;
  supervisor::Supervisor& sv_;
  const selfcheck::DevicePlan& plan_;
  const std::string& numerics_;
  tokenizer::Tokenizer* sample_tokenizer_;
  const bool pretrained_;
  const bool from_peers_;
  RunResult& result_;
  int64_t start_step_ = 0;
  double ema_step_seconds_ = 0;
  int64_t last_eval_step_ = -1;
};

}  // namespace

RunResult run_training(const RunOptions& options) {
  const WorkerConfig& config = options.config;
  // Signals: the caller's handler (installed before start-up, attached to the supervisor below),
  // else our own when asked. The grace period runs from the signal, whatever runs then.
  std::optional<supervisor::SignalHandler> own_signals;
  supervisor::SignalHandler* signals = options.signals;
  if (signals == nullptr && options.handle_signals) {
    own_signals.emplace(std::vector<int>{SIGTERM, SIGINT, SIGHUP}, config.grace_period_secs);
    signals = &*own_signals;
  }
  RunResult result;
  // A signal during start-up (data, model): nothing new to commit, the logdir is as it was.
  auto stopped_during_start_up = [&](const char* stage) {
    if (signals == nullptr || !signals->stop_requested()) return false;
    LH_LOG(INFO) << "stop requested during start-up; nothing to commit" << kv("after", stage);
    result.signal = signals->signal_received();
    return true;
  };

  // 1. Model shape and device (config errors). 2. Data (exit 3 on any problem).
  const model::GPT2Config model_config = model_config_for(config);
  RunData data;
  try {
    data = open_run_data(config, options,
                         [signals] { return signals != nullptr && signals->stop_requested(); });
  } catch (const Cancelled&) {
    if (stopped_during_start_up("opening the data")) return result;
    throw;
  }
  if (stopped_during_start_up("opening the data")) return result;

  // 3. Model and trainer.
  selfcheck::ModelOnDevice made = make_run_model(config, model_config, options.world_size);
  if (options.on_model) options.on_model(*made.model);
  if (options.on_device_plan) options.on_device_plan(made.plan);
  const selfcheck::DevicePlan plan = std::move(made.plan);
  Trainer trainer(config, std::move(made.model), std::move(data.train), std::move(data.val),
                  options.world_size);
  if (options.reduce_gradients) trainer.set_gradient_hook(options.reduce_gradients);
  warn_if_a_step_repeats_data(trainer, *data.train_set, options.world_size);
  const bool chief_at_start = options.chief_role ? options.chief_role() : options.rank == 0;
  const std::unique_ptr<tokenizer::Tokenizer> sample_tokenizer =
      set_up_tokenizer(trainer, model_config, options, chief_at_start);
  if (options.start_reducing_gradients) {
    trainer.set_last_backward_hook(options.start_reducing_gradients);
  }
  const std::string numerics = trainer.model().numerical_environment();
  trainer.set_checkpoint_metadata("numerics", numerics);
  trainer.set_checkpoint_metadata("device", plan.summary());
  trainer.set_checkpoint_metadata("kernels", kernels_json(plan));
  // The watchdog judges the mean loss over replicas, so all replicas agree on a bad step.
  if (options.average_loss) trainer.set_loss_reducer(options.average_loss);

  // 4. Supervisor.
  supervisor::SupervisorOptions so = supervisor_options(options, chief_at_start);
  bool pretrained = false;
  if (!config.checkpoint.init_from.empty()) {
    so.init_fn = [&](supervisor::TrainingState&) {
      std::unique_ptr<supervisor::SafetensorsReader> reader;
      try {
        reader = std::make_unique<supervisor::SafetensorsReader>(
            config.checkpoint.init_from,
            supervisor::SafetensorsReader::Options{.require_checksums = false});
      } catch (const Error& e) {
        throw CheckpointError(e.code(), std::string("checkpoint.init_from: ") + e.what());
      }
      trainer.load_pretrained(*reader, config.checkpoint.init_name_map);
      pretrained = true;
    };
  }
  if (stopped_during_start_up("creating the model")) return result;
  // A chief may wait here for the logdir's writer lock (up to one lease, when its holder neither
  // renews nor lets go); a signal ends that wait.
  so.start_up_cancelled = [signals] { return signals != nullptr && signals->stop_requested(); };
  std::unique_ptr<supervisor::Supervisor> supervisor;
  try {
    supervisor = std::make_unique<supervisor::Supervisor>(so);
  } catch (const Cancelled&) {
    if (stopped_during_start_up("waiting for the logdir's writer lock")) return result;
    throw;
  }
  supervisor::Supervisor& sv = *supervisor;
  const SignalAttachment attachment(signals, sv);
  set_stop_check(trainer, sv, signals, config.grace_period_secs);
  sv.managed_session(trainer, [&](supervisor::Supervisor& session) {
    TrainingSession(options, trainer, session, plan, numerics, sample_tokenizer.get(), pretrained,
                    result)
        .run();
  });
  result.final_step = trainer.global_step();
  result.signal = signals != nullptr ? signals->signal_received() : 0;
  return result;
}

}  // namespace longhaul::trainer
