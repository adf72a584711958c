// longhaul-worker: the training program. Subcommands:
//   train         train a GPT-2 model under the supervisor (checkpoints, resume, events, metrics)
//   eval          mean loss of a checkpoint over token shards
//   inspect       what a logdir holds and what a restart would restore
//   prepare-data  text files -> token shards (bytes or GPT-2 BPE)
//   sample        generate text from a checkpoint (KV cache, CPU)
//   export        a checkpoint as a Hugging Face GPT-2 directory or an llm.c model file
//   doctor        what works on this machine: GPU/CPU self-check, chosen path, measurements
// `longhaul-worker <command> --help` describes each; exit codes are listed in exit_codes.h.
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "exit_codes.h"

namespace {

using namespace longhaul::cli;

// Flag checks whose errors say in words what the flag takes. CLI11's Range/PositiveNumber print
// their bounds as 300-digit doubles and its integer parse says nothing about the flag; CLI11
// prefixes these messages with the flag's name.
CLI::Validator whole_number(long long min, long long max, const std::string& what) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        long long value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc() || stop != end || value < min || value > max) {
          return "takes " + what + ", not '" + text + "'";
        }
        return {};
      },
      "");
}

CLI::Validator real_number(double min, bool min_allowed, double max, bool max_allowed,
                           const std::string& what) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* stop = nullptr;
        const double value = std::strtod(text.c_str(), &stop);
        const bool parsed = !text.empty() && stop == text.c_str() + text.size();
        if (!parsed || !std::isfinite(value) || (min_allowed ? value < min : value <= min) ||
            (max_allowed ? value > max : value >= max)) {
          return "takes " + what + ", not '" + text + "'";
        }
        return {};
      },
      "");
}

// Each add_<name>_command registers one subcommand with its help and flags, bound to `args`.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args) {
  auto* cmd = app.add_subcommand(
      "train",
      "Train under the supervisor. With no --config: the tiny preset on the embedded demo "
      "corpus. Resumes from the logdir's latest valid checkpoint. SIGTERM/SIGINT/SIGHUP: final "
      "checkpoint, then exit 143/130/129.");
  cmd->add_option("--config,-c", args.config, "YAML config (see examples/worker-tiny.yaml)");
  cmd->add_option("--logdir", args.logdir,
                  "checkpoints + events (default: $LONGHAUL_LOGDIR, the config's logdir, "
                  "or runs/<preset>)");
  cmd->add_option("--set", args.sets, "override a config key: --set training.max_steps=50")
      ->allow_extra_args(false);
  cmd->add_option("--metrics-port", args.metrics_port,
                  "Prometheus /metrics port (0 disables; default: the config's)")
      ->check(whole_number(0, 65535,
                           "a TCP port from 1 to 65535, or 0 to turn the metrics server off"));

  cmd->add_option("--rank", args.rank,
                  "this replica's rank without TF_CONFIG (default $LONGHAUL_RANK or 0)")
      ->check(whole_number(0, INT_MAX, "a whole number from 0 (the chief)"));
  cmd->add_option("--world-size", args.world_size,
                  "replicas without TF_CONFIG (default $LONGHAUL_WORLD_SIZE or 1)")
      ->check(whole_number(1, INT_MAX, "a whole number of replicas, at least 1"));
  cmd->add_option("--rendezvous-dir", args.rendezvous_dir,
                  "shared folder for the replicas' rendezvous (default <logdir>/.rendezvous)");
  cmd->add_option("--allreduce-overlap", args.allreduce_overlap,
                  "CPU replicas: all-reduce gradient buckets while the backward pass runs (on) "
                  "or the whole buffer after it (off); default $LONGHAUL_ALLREDUCE_OVERLAP or on")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--allreduce-bucket-mb", args.allreduce_bucket_mb,
                  "CPU replicas: gradient bucket size in MiB for the overlapped all-reduce; 0: "
                  "min(25, a quarter of the gradients) (default $LONGHAUL_ALLREDUCE_BUCKET_MB)")
      ->check(real_number(0, true, 1e9, true, "a size in MiB, 0 or more (0: automatic)"));
  return cmd;
}

CLI::App* add_launch_command(CLI::App& app, LaunchArgs& args) {
  auto* cmd = app.add_subcommand(
      "launch",
      "Run N data-parallel replicas on this machine (TF_CONFIG on 127.0.0.1), restarting them "
      "all after a retryable failure: launch --replicas 2 -- train --config x.yaml");
  cmd->add_option("--replicas,-n", args.replicas, "replicas (chief + workers)")
      ->check(whole_number(1, INT_MAX, "a whole number of replicas, at least 1"));
  cmd->add_option("--max-restarts", args.max_restarts,
                  "group restarts after retryable failures (default 3)")
      ->check(whole_number(0, INT_MAX, "a whole number, 0 or more"));
  cmd->add_flag("--evaluator", args.evaluator,
                "also run an evaluator task (val loss of each checkpoint in <logdir>/eval)");
  cmd->add_option("--grace-secs", args.grace_secs,
                  "SIGTERM -> SIGKILL delay when stopping replicas (default 30)")
      ->check(real_number(0, false, 1e9, true, "a number of seconds above 0, e.g. 30"));
  cmd->add_option("command", args.command, "after --: train [train flags]")->required();
  return cmd;
}

CLI::App* add_eval_command(CLI::App& app, EvalArgs& args) {
  auto* cmd = app.add_subcommand("eval", "Print the mean loss of a checkpoint over shards.");
  cmd->add_option("--checkpoint", args.checkpoint, "a model.ckpt-<step>.safetensors file")
      ->required();
  cmd->add_option("--data", args.data, "glob of token shards, e.g. 'data/val_*.bin'")->required();
  cmd->add_option("--config,-c", args.config, "config for batch_size/seq_len");
  cmd->add_option("--set", args.sets, "override a config key")->allow_extra_args(false);
  cmd->add_option("--batches", args.batches, "at most this many batches (0: all)")
      ->check(whole_number(0, LLONG_MAX, "a whole number of batches, 0 or more (0: all)"));
  cmd->add_flag("--json", args.json, "print one JSON object");
  return cmd;
}

CLI::App* add_inspect_command(CLI::App& app, InspectArgs& args) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "List checkpoints (step, size, validity), events files, and what a restart "
      "would restore.");
  cmd->add_option("logdir", args.logdir, "the logdir")->required();
  cmd->add_flag("--json", args.json, "print one JSON object");
  cmd->add_flag("--tensors", args.tensors,
                "also list the tensors of the checkpoint a restart would restore");
  return cmd;
}

CLI::App* add_prepare_data_command(CLI::App& app, PrepareArgs& args) {
  auto* cmd = app.add_subcommand(
      "prepare-data",
      "Turn text files into llm.c token shards: train_NNNNNN.bin and val_NNNNNN.bin (the last "
      "--val-fraction of the tokens), plus longhaul-data.json naming the tokenizer. "
      "--tokenizer bytes (default, vocab 256) or gpt2 (GPT-2 BPE from --vocab/--merges; each "
      "file is a document preceded by <|endoftext|>).");
  cmd->add_option("--input,-i", args.inputs, "text files, concatenated in order")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-dir,-o", args.output_dir, "where the shards go")->required();
  cmd->add_option("--tokenizer", args.tokenizer, "bytes (default) or gpt2")
      ->check(CLI::IsMember({"bytes", "gpt2"}));
  cmd->add_option("--vocab", args.vocab, "gpt2: vocab.json (Hugging Face's GPT-2 file)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--merges", args.merges, "gpt2: merges.txt (Hugging Face's GPT-2 file)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--val-fraction", args.val_fraction,
                  "fraction of the bytes for validation, in [0, 1) (default 0.05)")
      ->check(
          real_number(0, true, 1, false, "a fraction from 0 up to (not including) 1, e.g. 0.05"));
  cmd->add_option("--shard-tokens", args.shard_tokens, "tokens per shard (default 10000000)")
      ->check(whole_number(1, LLONG_MAX,
                           "a whole number of tokens per shard, at least 1 (e.g. 10000000)"));
  return cmd;
}

CLI::App* add_doctor_command(CLI::App& app, DoctorArgs& args) {
  auto* cmd = app.add_subcommand(
      "doctor",
      "Check this machine for training: build, driver, GPUs, the self-check of every kernel "
      "against the reference (PASS/FAIL/FALLBACK), the path train would take, and matmul / "
      "memory / PCIe measurements against nominal peaks. Without a GPU: the CPU path. Exit 0 "
      "when every check passed, 1 when one failed, 2 for --device cuda without a usable GPU.");
  cmd->add_option("--device", args.device, "auto (default), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--json", args.json, "print one JSON object");
  cmd->add_option("--config,-c", args.config,
                  "the training config whose model shape the self-check uses");
  cmd->add_option("--set", args.sets, "override a config key")->allow_extra_args(false);
  return cmd;
}

CLI::App* add_sample_command(CLI::App& app, SampleArgs& args) {
  auto* cmd = app.add_subcommand(
      "sample",
      "Generate text from a checkpoint on the CPU with a KV cache; prints the prompt and the "
      "continuation (stops at <|endoftext|>). Decodes bytes or GPT-2 BPE (the tokenizer the "
      "run's data used, kept in <logdir>/tokenizer/).");
  cmd->add_option("--checkpoint", args.checkpoint, "a model.ckpt-<step>.safetensors file")
      ->required();
  cmd->add_option("--prompt", args.prompt, "text to continue (default: start of a document)");
  cmd->add_option("--tokens,-n", args.tokens, "tokens to generate (default 256)")
      ->check(whole_number(0, INT_MAX, "a whole number of tokens, 0 or more"));
  cmd->add_option("--temperature", args.temperature, "softmax temperature; 0 is greedy (default 1)")
      ->check(real_number(0, true, 1e6, true, "a temperature, 0 (greedy) or more, e.g. 0.8"));
  cmd->add_option("--top-k", args.top_k, "sample among the k likeliest tokens (0: all)")
      ->check(whole_number(0, INT_MAX, "a whole number, 0 (all tokens) or more"));
  cmd->add_option("--seed", args.seed, "random seed: the same seed, the same text");
  cmd->add_option("--device", args.device, "auto or cpu: sampling runs on the CPU")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--vocab", args.vocab, "gpt2 vocab.json (default: the logdir's)");
  cmd->add_option("--merges", args.merges, "gpt2 merges.txt (default: the logdir's)");
  cmd->add_option("--config,-c", args.config, "model shape for a file without longhaul metadata");
  cmd->add_option("--set", args.sets, "override a config key, e.g. model.preset=gpt2-124m")
      ->allow_extra_args(false);
  cmd->add_flag("--ignore-eot", args.ignore_end_of_text, "keep generating after <|endoftext|>");
  return cmd;
}

CLI::App* add_export_command(CLI::App& app, ExportArgs& args) {
  auto* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's model for other tools: --format hf (default) a directory that "
      "transformers.GPT2LMHeadModel.from_pretrained loads; --format llmc llm.c's model.bin "
      "(+ tokenizer.bin). DIR must not exist or be empty; it appears complete or not at all.");
  cmd->add_option("--checkpoint", args.checkpoint, "a model.ckpt-<step>.safetensors file")
      ->required();
  cmd->add_option("--output,-o", args.output, "the directory to create")->required();
  cmd->add_option("--format", args.format, "hf (default) or llmc")
      ->check(CLI::IsMember({"hf", "llmc"}));
  cmd->add_option("--vocab", args.vocab, "gpt2 vocab.json (default: the logdir's)");
  cmd->add_option("--merges", args.merges, "gpt2 merges.txt (default: the logdir's)");
  cmd->add_option("--config,-c", args.config, "model shape for a file without longhaul metadata");
  cmd->add_option("--set", args.sets, "override a config key")->allow_extra_args(false);
  return cmd;
}

// A subcommand of the command line and what runs it with the flags it was given.
struct Subcommand {
  CLI::App* command;
  std::function<int()> run;
};

template <typename Args>
Subcommand subcommand(CLI::App& app, CLI::App* (*add)(CLI::App&, Args&), int (*run)(const Args&)) {
  auto args = std::make_shared<Args>();
  CLI::App* command = add(app, *args);
  return {command, [args, run] { return run(*args); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "longhaul-worker: GPT-2 training that survives crashes, preemptions and restarts.\n"
      "Exit codes: 0 finished, 1 other error, 2 bad usage/config, 3 bad data,\n"
      "4 incompatible/corrupt checkpoint, 5 numerical fault (NaN/Inf or loss spike),\n"
      "129 SIGHUP, 130 SIGINT, 138 aborted (retry; nothing new committed),\n"
      "140 logdir lock taken over by a newer chief (nothing committed after), 143 SIGTERM.",
      "longhaul-worker"};
  app.set_version_flag("--version", "longhaul-worker " + version_string());
  app.require_subcommand(1);

  const std::vector<Subcommand> subcommands = {
      subcommand(app, add_train_command, run_train),
      subcommand(app, add_launch_command, run_launch_command),
      subcommand(app, add_eval_command, run_eval),
      subcommand(app, add_inspect_command, run_inspect),
      subcommand(app, add_prepare_data_command, run_prepare),
      subcommand(app, add_doctor_command, run_doctor),
      subcommand(app, add_sample_command, run_sample),
      subcommand(app, add_export_command, run_export)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help/version (rc 0) or the error
    return rc == 0 ? kExitFinished : kExitUsage;
  }
  try {
    for (const Subcommand& s : subcommands) {
      if (*s.command) return s.run();
    }
  } catch (...) {
    return report_error(std::current_exception());
  }
  return kExitUsage;
}
