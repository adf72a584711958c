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
#include "longhaul/kernels/cpu/platform.h"
#include "longhaul/model/cuda/device_info.h"
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

// Where the bits of a step are computed: what bit-identical resume depends on. CPU: the
// OpenBLAS build and core it selected (OPENBLAS_CORETYPE changes it) and the thread count; GPU:
// its name and compute capability, the CUDA runtime (and so cuBLAS/cuBLASLt) and the driver.
std::string numerical_environment(const model::LanguageModel& model) {
  if (model.device_name() == "cpu") {
    const auto p = kernels::cpu::cpu_platform();
    return "cpu: " + p.blas + ", " + std::to_string(p.threads) + " threads";
  }
  const auto build = backend_cuda::cuda_build_info();
  const auto sys = backend_cuda::cuda_system_info();
  std::string gpu = sys.devices.empty() ? std::string("unknown GPU") : sys.devices[0].name;
  if (!sys.devices.empty()) {
    gpu += " (compute " + std::to_string(sys.devices[0].cc_major) + "." +
           std::to_string(sys.devices[0].cc_minor) + ")";
  }
  return "cuda: " + gpu + ", CUDA runtime and cuBLAS " + build.runtime_version + ", driver " +
         sys.driver_version;
}

}  // namespace

std::shared_ptr<const data::TokenDataset> open_train_dataset(const WorkerConfig& config) {
  return as_data_error([&] {
    return config.data.train.empty() ? data::embedded_dataset(false)
                                     : data::TokenDataset::from_glob(config.data.train);
  });
}

std::shared_ptr<const data::TokenDataset> open_val_dataset(const WorkerConfig& config) {
  return as_data_error([&]() -> std::shared_ptr<const data::TokenDataset> {
    if (!config.data.val.empty()) return data::TokenDataset::from_glob(config.data.val);
    if (config.data.train.empty()) return data::embedded_dataset(true);
    return nullptr;
  });
}

RunResult run_training(const RunOptions& options) {
  const WorkerConfig& config = options.config;
  const auto& t = config.training;
  std::ostream& out = options.progress ? *options.progress : std::cout;

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

  // 1. Model shape and device (config errors).
  const model::GPT2Config model_config = model_config_for(config);

  // 2. Data (exit 3 on any problem).
  data::LoaderOptions loader_options{.batch_size = t.batch_size,
                                     .seq_len = t.seq_len,
                                     .seed = t.seed,
                                     .shuffle = config.data.shuffle,
                                     .rank = options.rank,
                                     .world_size = options.world_size};
  auto train_set = open_train_dataset(config);
  auto train_loader =
      as_data_error([&] { return std::make_unique<data::DataLoader>(train_set, loader_options); });
  std::unique_ptr<data::EvalLoader> val_loader;
  if (config.eval.every_steps > 0) {
    if (auto val_set = open_val_dataset(config)) {
      val_loader = as_data_error([&] {
        return std::make_unique<data::EvalLoader>(val_set, loader_options, config.eval.batches);
      });
    } else {
      LH_LOG(WARNING) << "eval.every_steps is set but there is no validation data (data.val); "
                         "evaluation is off";
    }
  }

  if (stopped_during_start_up("opening the data")) return result;

  // 3. Model and trainer.
  std::unique_ptr<model::LanguageModel> model;
  selfcheck::DevicePlan plan;
  try {
    ModelOnDevice made = make_model_on_device(config, model_config, options.world_size);
    model = std::move(made.model);
    plan = std::move(made.plan);
  } catch (const Error& e) {  // device: cuda without a usable GPU, activations do not fit, ...
    throw InvalidArgument(
        (config.source.empty() ? std::string("config") : "config " + config.source.string()) +
        ": device " + config.device + ": " + e.what());
  }
  if (options.on_model) options.on_model(*model);
  if (options.on_device_plan) options.on_device_plan(plan);
  Trainer trainer(config, std::move(model), std::move(train_loader), std::move(val_loader),
                  options.world_size);
  if (options.reduce_gradients) trainer.set_gradient_hook(options.reduce_gradients);
  // A step that reads more tokens than the training data holds repeats data inside one step.
  if (const uint64_t step_tokens = static_cast<uint64_t>(trainer.tokens_per_step()) *
                                   static_cast<uint64_t>(options.world_size);
      step_tokens > train_set->total_tokens()) {
    LH_LOG(WARNING) << "one optimizer step reads more tokens than the training data holds: "
                       "every step repeats data; lower training.total_batch_tokens or add data"
                    << kv("training.total_batch_tokens", step_tokens)
                    << kv("data_tokens", train_set->total_tokens());
  }
  // The data's tokenizer: recorded in checkpoints (gpt2 files copied into the logdir by the
  // chief) so that `sample` and `export` decode; the chief samples text at each evaluation.
  const TokenizerSpec tokenizer_spec = data_tokenizer(config, model_config);
  std::unique_ptr<tokenizer::Tokenizer> sample_tokenizer;
  const bool chief_at_start = options.chief_role ? options.chief_role() : options.rank == 0;
  if (!tokenizer_spec.kind.empty()) {
    trainer.set_checkpoint_metadata("tokenizer", tokenizer_spec.kind);
    if (chief_at_start) save_tokenizer_files(tokenizer_spec, options.logdir);
    // Samples are the chief's; with recovery in place any replica may become the chief.
    if (chief_at_start || options.regroup) {
      if (config.eval.sample_tokens > 0) {
        sample_tokenizer = as_data_error([&] {
          return tokenizer::make_tokenizer(tokenizer_spec.kind, tokenizer_spec.vocab,
                                           tokenizer_spec.merges);
        });
      }
    }
  }
  if (options.start_reducing_gradients) {
    trainer.set_last_backward_hook(options.start_reducing_gradients);
  }
  const std::string numerics = numerical_environment(trainer.model());
  trainer.set_checkpoint_metadata("numerics", numerics);
  trainer.set_checkpoint_metadata("device", plan.summary());
  trainer.set_checkpoint_metadata("kernels", kernels_json(plan));
  // The watchdog judges the mean loss over replicas, so all replicas agree on a bad step.
  if (options.average_loss) trainer.set_loss_reducer(options.average_loss);

  // 4. Supervisor.
  supervisor::SupervisorOptions so;
  so.logdir = options.logdir;
  so.is_chief = chief_at_start;
  so.save_model_secs = config.checkpoint.save_model_secs;
  so.save_summaries_secs = config.summaries.save_summaries_secs;
  so.recovery_wait_secs = config.supervisor.recovery_wait_secs;
  so.max_wait_secs = config.supervisor.max_wait_secs;
  so.stop_grace_secs = std::min(config.supervisor.stop_grace_secs, config.grace_period_secs);
  so.max_to_keep = config.checkpoint.max_to_keep;
  so.keep_checkpoint_every_n_hours = config.checkpoint.keep_checkpoint_every_n_hours;
  so.summaries_enabled = config.summaries.every_steps > 0;
  so.checkpoint_listeners = options.checkpoint_listeners;
  so.state_from_peers = options.receive_state;
  const bool from_peers = static_cast<bool>(options.receive_state);
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
  supervisor::Supervisor sv(so);
  struct Attachment {  // detached before `sv` is destroyed, on every path
    supervisor::SignalHandler* signals;
    Attachment(supervisor::SignalHandler* s, supervisor::Supervisor& sv) : signals(s) {
      if (signals != nullptr) signals->attach(sv);
    }
    ~Attachment() {
      if (signals != nullptr) signals->detach();
    }
  } attachment(signals, sv);
  // Between micro-batches: abandon the step when a stop was requested and its rest would not
  // fit in half of what is left of the grace period (the other half is for the final
  // checkpoint); a stop with an error (a failed service) abandons it at once.
  trainer.set_stop_check([&](double seconds_left_in_step) {
    if (!sv.should_stop()) return false;
    if (signals == nullptr || !signals->stop_requested()) return true;
    const double grace = config.grace_period_secs;
    const double budget = 0.5 * grace - signals->seconds_since_signal();
    return seconds_left_in_step > budget;
  });
  const int64_t log_every = config.log.every_steps;
  const int64_t summary_every = config.summaries.every_steps;
  const int64_t eval_every = config.eval.every_steps;
  sv.managed_session(trainer, [&](supervisor::Supervisor& sv) {
    if (options.sync_state && !from_peers) options.sync_state(trainer);
    const int64_t start_step = trainer.global_step();
    result.restored_step = sv.restored_step();
    if (sv.restored_step() && !trainer.restored_numerics().empty() &&
        trainer.restored_numerics() != numerics) {
      LH_LOG(WARNING) << "resuming in another numerical environment than the checkpoint was "
                         "written in: the continuation is numerically equivalent, not "
                         "bit-identical to an uninterrupted run"
                      << kv("checkpoint", trainer.restored_numerics()) << kv("now", numerics);
    }
    if (options.on_session_start)
      options.on_session_start(start_step, sv.restored_step().has_value());
    {
      const auto& mc = trainer.model().config();
      std::ostringstream head;
      head << "longhaul-worker: " << (sv.restored_step() || from_peers ? "resuming" : "starting")
           << " at step " << start_step << "/" << t.max_steps
           << (from_peers ? " (state from the running replicas, no checkpoint read)" : "")
           << " | model " << config.model.preset << " (" << mc.to_string() << ", "
           << trainer.model().num_parameters() << " params) on " << trainer.model().device_name()
           << " | data " << (config.data.train.empty() ? "<embedded corpus>" : config.data.train)
           << " | " << trainer.tokens_per_step() << " tokens/step (" << trainer.accumulation_steps()
           << " micro-batches of " << t.batch_size << "x" << t.seq_len << ")"
           << (pretrained ? " | initialised from " + config.checkpoint.init_from : "")
           << " | logdir " << options.logdir.string() << "\n";
      out << head.str() << std::flush;
    }
    // What this run trains on and why, as the events file's first summary (TensorBoard: Text).
    sv.summary_computed(text_summary("device", plan.details()), start_step);
    double ema_step_seconds = 0;
    int64_t last_eval_step = -1;
    auto run_eval = [&](int64_t step) {
      if (auto val = trainer.evaluate()) {
        result.last_val_loss = val;
        sv.add_scalar("val_loss", *val, step);
        char line[128];
        std::snprintf(line, sizeof line, "step %6" PRId64 "/%" PRId64 " | val_loss %.4f\n", step,
                      t.max_steps, *val);
        out << line << std::flush;
      }
      if (sample_tokenizer && sv.is_chief()) {
        auto& model = trainer.model();
        const auto& mc = model.config();
        std::vector<float> params(static_cast<size_t>(model.num_parameters()));
        model.download(model.parameters_flat(), params);
        GenerateOptions go;
        go.prompt = config.eval.sample_prompt;
        go.max_new_tokens = static_cast<int>(config.eval.sample_tokens);
        go.sampling.seed = t.seed + static_cast<uint64_t>(step);  // the same after a resume
        const Generated g = generate_text(mc, params, *sample_tokenizer, go);
        const std::string text = go.prompt + g.text;
        sv.add_text("samples", markdown_code_block(printable(text, false)), step);
        out << "step " << std::setw(6) << step << "/" << t.max_steps
            << " | sample: " << printable(text, true) << "\n"
            << std::flush;
      }
      last_eval_step = step;
    };
    auto stopping = [&] {
      return options.agree_stop ? options.agree_stop(sv.should_stop()) : sv.should_stop();
    };
    // Recovery in place after a failed collective (see RunOptions::regroup). Bounded: a group
    // that cannot be re-formed within the regroup callback's own timeout gives up.
    enum class Recovery { kRegrouped, kGaveUp, kStopped };
    auto recover = [&](const Aborted& lost) {
      LH_LOG(WARNING) << "a peer was lost; recovering in place" << kv("step", trainer.global_step())
                      << kv("error", lost.what());
      // Losses during the regroup start another one, but none starts after the regroup timeout
      // (a replacement that crashes at every start must not keep the survivors forever).
      const auto give_up = std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(
                               static_cast<int64_t>(config.supervisor.regroup_timeout_secs * 1000));
      while (true) {
        if (std::chrono::steady_clock::now() >= give_up) {
          LH_LOG(ERROR) << "peers kept being lost while regrouping for longer than "
                           "supervisor.regroup_timeout_secs; giving up";
          return Recovery::kGaveUp;
        }
        try {
          return options.regroup(trainer) ? Recovery::kRegrouped : Recovery::kGaveUp;
        } catch (const Aborted& again) {
          LH_LOG(WARNING) << "a peer was lost again while regrouping" << kv("error", again.what());
        } catch (const Cancelled& e) {
          LH_LOG(INFO) << "stop requested while regrouping" << kv("reason", e.what());
          return Recovery::kStopped;
        }
      }
    };
    while (true) {
      StepStats s;
      try {
        if (stopping() || trainer.global_step() >= t.max_steps) break;
        s = trainer.train_step();
      } catch (const Aborted& lost) {
        if (!options.regroup) throw;
        const Recovery r = recover(lost);
        if (r == Recovery::kRegrouped) {
          ++result.regroups;
          // The chief was the one lost and this replica is the lowest surviving rank: it takes
          // over the chief's writes before the next step. The lost chief's writer lock went with
          // its process; one still alive (a partition) keeps it, and promote_to_chief gives up
          // after the wait (Aborted: exit 138, the group restarts).
          if (options.chief_role && options.chief_role() && !sv.is_chief()) {
            sv.promote_to_chief(trainer, std::chrono::milliseconds(static_cast<int64_t>(
                                             config.supervisor.regroup_timeout_secs * 1000)));
          }
          continue;
        }
        result.regroup_failed = r == Recovery::kGaveUp;
        // The last completed step is committed as the session's final checkpoint (chief). A
        // worker commits it when the chief is the one lost (nobody holds the writer lock).
        if (result.regroup_failed && !sv.is_chief()) {
          try {
            sv.commit_checkpoint_as_successor(trainer);
          } catch (const Error& e) {  // still exit 138: the latest checkpoint stays as it was
            LH_LOG(ERROR) << "could not commit a checkpoint in place of the lost chief"
                          << kv("error", e.what());
          }
        }
        sv.request_stop();
        break;
      }
      result.skipped_steps = s.skipped_total;
      if (s.skipped) {
        // Logged at the step's index like the training scalars; counted in metrics by on_step.
        sv.add_scalar("skipped_steps", static_cast<double>(s.skipped_total), s.step - 1);
        char line[320];
        std::snprintf(line, sizeof line,
                      "step %6" PRId64 "/%" PRId64 " | SKIPPED (%s) | %" PRId64 " skipped so far\n",
                      s.step, t.max_steps, s.skip_reason.c_str(), s.skipped_total);
        out << line << std::flush;
      } else {
        result.last_loss = s.loss;
      }
      ema_step_seconds =
          ema_step_seconds == 0 ? s.seconds : 0.9 * ema_step_seconds + 0.1 * s.seconds;
      if (options.on_step) options.on_step(s);
      const double tokens_per_sec = s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0;
      if (!s.skipped &&
          (s.step % log_every == 0 || s.step == t.max_steps || s.step == start_step + 1)) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "step %6" PRId64 "/%" PRId64
                      " | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | eta %s\n",
                      s.step, t.max_steps, s.loss, s.learning_rate, s.grad_norm, tokens_per_sec,
                      hms(ema_step_seconds * static_cast<double>(t.max_steps - s.step)).c_str());
        out << line << std::flush;
      }
      // Training scalars carry the step's 0-based index (the global step before it ran), as in
      // TensorFlow: a restart's SessionLog START at the restored step s makes TensorBoard purge
      // events at steps >= s from the earlier run, so the last step before a checkpoint at s
      // must be logged at s - 1 to survive.
      const int64_t index = s.step - 1;
      if (summary_every > 0 && index % summary_every == 0 && !s.skipped) {
        sv.add_scalar("loss", s.loss, index);
        sv.add_scalar("learning_rate", s.learning_rate, index);
        sv.add_scalar("grad_norm", s.grad_norm, index);
        sv.add_scalar("tokens_per_sec", tokens_per_sec, index);
      }
      if (eval_every > 0 && s.step % eval_every == 0) run_eval(s.step);
      if (config.checkpoint.save_model_steps > 0 &&
          s.step % config.checkpoint.save_model_steps == 0) {
        sv.request_checkpoint();
      }
      sv.step_boundary(s.step);
    }
    if (eval_every > 0 && trainer.global_step() >= t.max_steps &&
        last_eval_step != trainer.global_step() && !sv.should_stop()) {
      run_eval(trainer.global_step());
    }
  });
  result.final_step = trainer.global_step();
  result.signal = signals != nullptr ? signals->signal_received() : 0;
  return result;
}

}  // namespace longhaul::trainer
