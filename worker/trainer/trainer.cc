// Trainer: TrainingState over a LanguageModel + the optimizer step. See trainer.h.
#include "longhaul/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "longhaul/base/log.h"
#include "longhaul/trainer/validation.h"

namespace longhaul::trainer {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string where(const WorkerConfig& config) {
  return config.source.empty() ? "config" : "config " + config.source.string();
}

// PretrainedTensorReader over a safetensors TensorSource, converting F32/F16/BF16 to fp32.
class TensorSourceReader : public model::PretrainedTensorReader {
 public:
  explicit TensorSourceReader(const supervisor::TensorSource& source) : source_(source) {}
  std::vector<std::string> tensor_names() const override { return source_.tensor_names(); }
  std::vector<int64_t> shape(std::string_view name) const override {
    return source_.spec(name).shape;
  }
  void read(std::string_view name, std::span<float> out) const override {
    const auto& spec = source_.spec(name);
    auto bytes = source_.data(name);
    const size_t n = static_cast<size_t>(spec.numel());
    if (out.size() != n) {
      throw InvalidArgument("tensor " + std::string(name) + " in " + source_.path() + " has " +
                            std::to_string(n) + " elements, expected " +
                            std::to_string(out.size()));
    }
    switch (spec.dtype) {
      case supervisor::DType::kF32:
        std::memcpy(out.data(), bytes.data(), n * sizeof(float));
        return;
      case supervisor::DType::kBF16:
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, bytes.data() + 2 * i, 2);
          uint32_t bits = static_cast<uint32_t>(h) << 16;
          std::memcpy(&out[i], &bits, 4);
        }
        return;
      case supervisor::DType::kF16:
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, bytes.data() + 2 * i, 2);
          const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
          float v = exp == 0    ? std::ldexp(static_cast<float>(mant), -24)
                    : exp == 31 ? (mant ? NAN : INFINITY)
                                : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
          out[i] = sign ? -v : v;
        }
        return;
      default:
        throw InvalidArgument("tensor " + std::string(name) + " in " + source_.path() +
                              " has dtype " + std::string(supervisor::dtype_name(spec.dtype)) +
                              "; pre-trained weights must be F32, F16 or BF16");
    }
  }

 private:
  const supervisor::TensorSource& source_;
};

int64_t metadata_int(const supervisor::TensorSource& ckpt, const std::string& key) {
  const auto& md = ckpt.metadata();
  auto it = md.find(key);
  if (it == md.end()) {
    throw FailedPrecondition("checkpoint " + ckpt.path() + " has no '" + key +
                             "' metadata: it was not written by longhaul-worker; use it with "
                             "checkpoint.init_from instead");
  }
  try {
    size_t used = 0;
    int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw DataLoss("checkpoint " + ckpt.path() + " has a garbled '" + key + "' metadata value '" +
                 it->second + "'");
}

}  // namespace

std::unique_ptr<model::PretrainedTensorReader> pretrained_reader(
    const supervisor::TensorSource& source) {
  return std::make_unique<TensorSourceReader>(source);
}

std::optional<model::GPT2Config> checkpoint_model_config(const supervisor::TensorSource& source) {
  auto it = source.metadata().find("model_config");
  if (it == source.metadata().end()) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(it->second);
    model::GPT2Config c;
    c.vocab_size = j.at("vocab_size").get<int>();
    c.context_length = j.at("context_length").get<int>();
    c.n_layer = j.at("n_layer").get<int>();
    c.n_head = j.at("n_head").get<int>();
    c.n_embd = j.at("n_embd").get<int>();
    c.validate();
    return c;
  } catch (const std::exception& e) {
    throw CheckpointError(Code::kDataLoss, "checkpoint " + source.path() +
                                               " has garbled model_config metadata '" + it->second +
                                               "': " + e.what());
  }
}

std::string model_config_json(const model::GPT2Config& c) {
  nlohmann::json j{{"vocab_size", c.vocab_size},
                   {"context_length", c.context_length},
                   {"n_layer", c.n_layer},
                   {"n_head", c.n_head},
                   {"n_embd", c.n_embd}};
  return j.dump();
}

model::GPT2Config model_config_for(const WorkerConfig& config) {
  model::GPT2Config c;
  try {
    c = model::GPT2Config::preset(config.model.preset);
  } catch (const Error& e) {
    throw InvalidArgument(where(config) + ": model.preset: " + e.what());
  }
  const auto& m = config.model;
  if (m.n_layer) c.n_layer = *m.n_layer;
  if (m.n_head) c.n_head = *m.n_head;
  if (m.n_embd) c.n_embd = *m.n_embd;
  if (m.context_length) c.context_length = *m.context_length;
  if (m.vocab_size) c.vocab_size = *m.vocab_size;
  try {
    c.validate();
  } catch (const Error& e) {
    throw InvalidArgument(where(config) + ": model: " + e.what());
  }
  if (config.training.seq_len > c.context_length) {
    throw InvalidArgument(
        where(config) + ": training.seq_len " + std::to_string(config.training.seq_len) +
        " exceeds model.context_length " + std::to_string(c.context_length) + " (of model.preset " +
        config.model.preset + " unless set): lower training.seq_len or raise model.context_length");
  }
  return c;
}

selfcheck::PlanOptions device_options(const WorkerConfig& config, int world_size) {
  selfcheck::PlanOptions options;
  options.device = config.device;
  options.self_check = config.cuda.self_check;
  options.allow_cpu_fallback = world_size <= 1;
  options.batch_size = static_cast<int>(config.training.batch_size);
  options.seq_len = static_cast<int>(config.training.seq_len);
  return options;
}

Trainer::Trainer(const WorkerConfig& config, std::unique_ptr<model::LanguageModel> model,
                 std::unique_ptr<data::DataLoader> train, std::unique_ptr<data::EvalLoader> val,
                 int world_size)
    : config_(config),
      model_(std::move(model)),
      train_(std::move(train)),
      val_(std::move(val)),
      watchdog_(WatchdogOptions{.loss_spike_mads = config.training.loss_spike_mads,
                                .window = config.training.loss_spike_window,
                                .spike_after_steps = config.training.loss_spike_after_steps}) {
  const auto& t = config_.training;
  if (const char* k = std::getenv("LONGHAUL_TEST_NAN_GRADIENT_AT_STEP"); k != nullptr && *k) {
    inject_nan_at_step_ = std::strtoll(k, nullptr, 10);
    LH_LOG(WARNING) << "test fault injection: a NaN gradient at step"
                    << kv("step", inject_nan_at_step_);
  }
  if (t.seq_len > model_->config().context_length) {
    throw InvalidArgument(where(config_) + ": training.seq_len " + std::to_string(t.seq_len) +
                          " exceeds the model's context_length " +
                          std::to_string(model_->config().context_length) +
                          "; lower training.seq_len or raise model.context_length");
  }
  batch_tokens_ = t.batch_size * t.seq_len;
  const int64_t per_round = batch_tokens_ * world_size;
  if (t.total_batch_tokens != 0) {
    if (t.total_batch_tokens % per_round != 0) {
      throw InvalidArgument(where(config_) + ": training.total_batch_tokens " +
                            std::to_string(t.total_batch_tokens) +
                            " must be a multiple of batch_size * seq_len * world_size = " +
                            std::to_string(per_round));
    }
    accumulation_steps_ = t.total_batch_tokens / per_round;
  }
  schedule_.max_lr = t.learning_rate;
  schedule_.min_lr = t.learning_rate * t.min_lr_ratio;
  schedule_.total_steps = t.max_steps;
  schedule_.warmup_steps = std::min(t.warmup_steps, t.max_steps);
  schedule_.validate();
  adamw_.beta1 = static_cast<float>(t.beta1);
  adamw_.beta2 = static_cast<float>(t.beta2);
  adamw_.eps = static_cast<float>(t.eps);
  adamw_.weight_decay = static_cast<float>(t.weight_decay);

  auto add = [&](const model::NamedTensor& nt, const std::string& name) {
    supervisor::TensorSpec spec{name, supervisor::DType::kF32, nt.shape};
    specs_.push_back(spec);
    slots_.push_back(Slot{spec, nt.data});
  };
  for (const auto& p : model_->named_parameters()) add(p, p.name);
  for (const auto& m : model_->named_optimizer_state()) add(m, m.name);
}

void Trainer::initialize() {
  model_->init_weights(config_.training.seed);
  step_.store(0, std::memory_order_release);
  train_tokens_ = 0;
  initialized_ = true;
}

std::string Trainer::incompatibility(const supervisor::TensorSource& ckpt) const {
  std::set<std::string> ours;
  for (const auto& spec : specs_) {
    ours.insert(spec.name);
    if (!ckpt.contains(spec.name)) {
      return "checkpoint " + ckpt.path() + " has no tensor " + spec.name +
             " that this model needs (shape " + shape_string(spec.shape) + ")";
    }
    const auto& theirs = ckpt.spec(spec.name);
    if (theirs.dtype != spec.dtype || theirs.shape != spec.shape) {
      return "checkpoint " + ckpt.path() + ": tensor " + spec.name + " is " +
             std::string(supervisor::dtype_name(theirs.dtype)) + shape_string(theirs.shape) +
             " but this model has " + std::string(supervisor::dtype_name(spec.dtype)) +
             shape_string(spec.shape);
    }
  }
  for (const auto& name : ckpt.tensor_names()) {
    if (!ours.count(name)) {
      return "checkpoint " + ckpt.path() + " has tensor " + name + " that this model does not";
    }
  }
  auto it = ckpt.metadata().find("model_config");
  if (it != ckpt.metadata().end()) {
    try {
      auto theirs = nlohmann::json::parse(it->second);
      auto mine = nlohmann::json::parse(model_config_json(model_->config()));
      for (const auto& [key, value] : mine.items()) {
        if (theirs.value(key, nlohmann::json()) != value) {
          return "checkpoint " + ckpt.path() + " was written for model " + key + "=" +
                 theirs.value(key, nlohmann::json()).dump() + " but the config gives " +
                 value.dump();
        }
      }
    } catch (const nlohmann::json::exception&) {
      return "checkpoint " + ckpt.path() + " has garbled model_config metadata";
    }
  }
  return "";
}

void Trainer::restore(const supervisor::TensorSource& ckpt) {
  if (std::string why = incompatibility(ckpt); !why.empty()) {
    throw FailedPrecondition(why +
                             ". The logdir belongs to another model shape: use a new "
                             "--logdir or the original model config");
  }
  const int64_t step = metadata_int(ckpt, "step");
  const int64_t opt_steps = metadata_int(ckpt, "optimizer_step_count");
  try {
    auto pos = ckpt.metadata().find("data_position");
    if (pos != ckpt.metadata().end()) train_->restore(pos->second);
    std::vector<float> staging;
    for (const auto& slot : slots_) {
      auto bytes = ckpt.data(slot.spec.name);  // CRC-verified
      const size_t n = bytes.size() / sizeof(float);
      std::span<const float> host;
      if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
        host = {reinterpret_cast<const float*>(bytes.data()), n};
      } else {
        staging.resize(n);
        std::memcpy(staging.data(), bytes.data(), bytes.size());
        host = staging;
      }
      model_->upload(host, {slot.data, n});
    }
  } catch (const Error& e) {  // same kind (DataLoss, FailedPrecondition, ...), file named
    throw_error(e.code(), "cannot restore from " + ckpt.path() + ": " + e.what());
  }
  model_->set_optimizer_step_count(opt_steps);
  auto numerics = ckpt.metadata().find("numerics");
  restored_numerics_ = numerics == ckpt.metadata().end() ? "" : numerics->second;
  auto tokens = ckpt.metadata().find("train_tokens");
  train_tokens_ = tokens == ckpt.metadata().end() ? 0 : std::stoll(tokens->second);
  model_->zero_grad();
  step_.store(step, std::memory_order_release);
  watchdog_.reset();
  initialized_ = true;
}

void Trainer::snapshot(supervisor::Snapshot& out) {
  out.reshape(specs_);
  // One step-consistent copy of every tensor (device-to-host on CUDA, memcpy on CPU).
  std::vector<model::HostCopy> copies;
  copies.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    copies.push_back({slots_[i].data, out.buffers[i]});
  }
  model_->snapshot_to_host(copies);
  const int64_t step = global_step();
  out.step = step;
  out.metadata["step"] = std::to_string(step);
  out.metadata["optimizer_step_count"] = std::to_string(model_->optimizer_step_count());
  out.metadata["data_position"] = train_->position_json();
  out.metadata["model_config"] = model_config_json(model_->config());
  out.metadata["seed"] = std::to_string(config_.training.seed);
  out.metadata["rng"] = std::to_string(config_.training.seed);
  out.metadata["train_tokens"] = std::to_string(train_tokens_);
  for (const auto& [key, value] : extra_metadata_) out.metadata[key] = value;
}

double Trainer::learning_rate_at(int64_t step) const {
  return model::learning_rate_at(schedule_, step);
}

// Gives back the step's data when a stop or a lost peer abandons it, clears the gradients, so
// the state of the last completed step is kept.
void Trainer::abandon_step(const std::string& step_start_position) {
  if (!step_start_position.empty()) train_->restore(step_start_position);
  model_->zero_grad();
}

void Trainer::check_stop_inside_step(int64_t micro, std::chrono::steady_clock::time_point start,
                                     const std::string& step_start_position) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_micro = micro == 0 ? 0 : elapsed / static_cast<double>(micro);
  const double left = per_micro * static_cast<double>(accumulation_steps_ - micro);
  if (!stop_check_(left)) return;
  abandon_step(step_start_position);
  const std::string why = "stop requested inside step " + std::to_string(global_step() + 1) +
                          " after " + std::to_string(micro) + " of " +
                          std::to_string(accumulation_steps_) +
                          " micro-batches: the step was abandoned; the state of step " +
                          std::to_string(global_step()) + " is kept";
  LH_LOG(WARNING) << why;
  throw Cancelled(why);
}

void Trainer::warn_once_if_a_step_takes_a_day(std::chrono::steady_clock::time_point start) {
  if (warned_step_time_) return;
  warned_step_time_ = true;
  const double per_micro =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double step_secs = per_micro * static_cast<double>(accumulation_steps_);
  if (step_secs > 86400) {
    LH_LOG(WARNING) << "one optimizer step will take more than a day at the measured rate ("
                    << accumulation_steps_ << " micro-batches of " << per_micro
                    << " s): lower training.total_batch_tokens"
                    << kv("estimated_step_hours", step_secs / 3600);
  }
}

double Trainer::accumulate_gradients(std::chrono::steady_clock::time_point start) {
  const auto& t = config_.training;
  const int B = static_cast<int>(t.batch_size), T = static_cast<int>(t.seq_len);
  model_->zero_grad();
  double loss_sum = 0;
  const float scale = 1.0f / static_cast<float>(accumulation_steps_);
  // Where the step's data starts, to give it back if the step is abandoned (only kept when a
  // stop check can abandon it, and only for accumulated steps: a one-micro-batch step checks
  // before reading anything).
  // Data-parallel replicas also keep it always: a lost peer abandons the step (below).
  std::string step_start_position;
  if ((stop_check_ && accumulation_steps_ > 1) || gradient_hook_) {
    step_start_position = train_->position_json();
  }
  // A collective that fails (a lost peer: Aborted) abandons the step before anything is
  // applied: the data loader goes back to where the step started and the gradients are
  // cleared, so this replica holds exactly the state of its last completed step, which a
  // regroup may hand to a replacement (worker/distributed, "Recovery in place").
  const int64_t step = global_step();
  try {
    for (int64_t micro = 0; micro < accumulation_steps_; ++micro) {
      if (stop_check_) check_stop_inside_step(micro, start, step_start_position);
      if (micro == 1) warn_once_if_a_step_takes_a_day(start);  // one micro-batch's time known
      data::Batch batch = train_->next();
      batch.to_int32(inputs_, targets_);
      if (micro == accumulation_steps_ - 1 && last_backward_hook_) last_backward_hook_(*model_);
      try {
        loss_sum += model_->forward_backward(inputs_.data(), targets_.data(), B, T, scale);
      } catch (const InvalidArgument& e) {
        throw DataError(Code::kInvalidArgument, "bad batch from " + std::string(batch.source) +
                                                    ": " + e.what() +
                                                    "; the data does not fit model.vocab_size " +
                                                    std::to_string(model_->config().vocab_size));
      }
    }
    double loss = loss_sum / static_cast<double>(accumulation_steps_);
    if (inject_nan_at_step_ == step + 1) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      model_->upload(std::span<const float>(&nan, 1), model_->gradients_flat().subspan(0, 1));
    }
    // Data-parallel replicas average gradients here (longhaul/dist), so the norm, clipping and
    // the optimizer step are identical on every replica.
    if (gradient_hook_) gradient_hook_(*model_);
    if (loss_reducer_) loss = loss_reducer_(loss);
    return loss;
  } catch (const Aborted&) {
    abandon_step(step_start_position);
    LH_LOG(WARNING) << "step abandoned: a collective failed" << kv("step", global_step() + 1)
                    << kv("state_kept_at_step", global_step());
    throw;
  }
}

void Trainer::skip_step(int64_t step, const WatchdogVerdict& verdict) {
  const auto& t = config_.training;
  const bool skip = t.on_nonfinite == "skip_step";
  if (!skip || consecutive_skips_ + 1 > t.max_consecutive_skips) {
    throw NumericalError(
        "step " + std::to_string(step + 1) + ": " + verdict.reason +
        (skip ? "; " + std::to_string(consecutive_skips_ + 1) +
                    " bad steps in a row exceed training.max_consecutive_skips"
              : std::string()) +
        ". The step was not applied and not checkpointed: the latest checkpoint is the last "
        "good state. Lower training.learning_rate or check the data; training.on_nonfinite: "
        "skip_step drops such steps instead");
  }
  ++consecutive_skips_;
  ++skipped_steps_;
  LH_LOG(WARNING) << "numerical watchdog: step skipped, its update dropped" << kv("step", step + 1)
                  << kv("why", verdict.reason) << kv("skipped_total", skipped_steps_);
}

StepStats Trainer::train_step() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = global_step();
  StepStats stats;
  stats.loss = accumulate_gradients(start);
  const float norm = model_->gradient_norm();
  const double lr = learning_rate_at(step);
  // The watchdog judges the step before anything is applied (watchdog.h).
  if (const WatchdogVerdict verdict = watchdog_.check(step + 1, stats.loss, norm); !verdict.ok) {
    skip_step(step, verdict);  // or throws NumericalError
    stats.skipped = true;
    stats.skip_reason = verdict.reason;
  } else {
    consecutive_skips_ = 0;
    const float clip = static_cast<float>(config_.training.grad_clip);
    const float grad_scale = (clip > 0 && norm > clip) ? clip / norm : 1.0f;
    model_->optimizer_step(adamw_, static_cast<float>(lr), grad_scale);
  }
  train_tokens_ += tokens_per_step();
  step_.store(step + 1, std::memory_order_release);
  stats.step = step + 1;
  stats.learning_rate = lr;
  stats.grad_norm = norm;
  stats.tokens = tokens_per_step();
  stats.skipped_total = skipped_steps_;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

std::optional<double> Trainer::evaluate() {
  if (!val_) return std::nullopt;
  const auto& t = config_.training;
  const ValidationLoss loss = validation_loss(
      *model_, *val_, static_cast<int>(t.batch_size), static_cast<int>(t.seq_len),
      [this] { return stop_check_ && stop_check_(std::numeric_limits<double>::infinity()); });
  if (loss.stopped) {
    LH_LOG(INFO) << "evaluation abandoned: a stop was requested"
                 << kv("batches_done", loss.batches);
    return std::nullopt;
  }
  return loss.batches == 0 ? std::nullopt : std::optional<double>(loss.mean_loss);
}

void Trainer::load_pretrained(const supervisor::TensorSource& source,
                              const std::map<std::string, std::string>& name_map) {
  TensorSourceReader reader(source);
  model::PretrainedLoadOptions options;
  options.name_map = name_map;
  model::PretrainedLoadReport report;
  try {
    report = model_->load_pretrained(reader, options);
  } catch (const Error& e) {
    throw CheckpointError(e.code(),
                          "cannot initialise from pre-trained " + source.path() + ": " + e.what());
  }
  if (report.loaded.empty()) {
    throw CheckpointError(Code::kFailedPrecondition,
                          "pre-trained file " + source.path() +
                              " has no tensor matching this model's parameters; check "
                              "checkpoint.init_name_map");
  }
  LH_LOG(INFO) << "initialised from pre-trained weights" << kv("file", source.path())
               << kv("loaded", report.loaded.size()) << kv("missing", report.missing.size())
               << kv("unmatched", report.unmatched.size());
  for (const auto& name : report.missing) {
    LH_LOG(WARNING) << "parameter not in the pre-trained file keeps its random init"
                    << kv("tensor", name);
  }
}

}  // namespace longhaul::trainer
