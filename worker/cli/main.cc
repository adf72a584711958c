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
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "exit_codes.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  using namespace longhaul::cli;
  CLI::App app{
      "longhaul-worker: GPT-2 training that survives crashes, preemptions and restarts.\n"
      "Exit codes: 0 finished, 1 other error, 2 bad usage/config, 3 bad data,\n"
      "4 incompatible/corrupt checkpoint, 5 numerical fault (NaN/Inf or loss spike),\n"
      "129 SIGHUP, 130 SIGINT, 138 aborted (retry; nothing new committed), 143 SIGTERM.",
      "longhaul-worker"};
  app.set_version_flag("--version", "longhaul-worker " + version_string());
  app.require_subcommand(1);

  TrainArgs train;
  auto* train_cmd = app.add_subcommand(
      "train",
      "Train under the supervisor. With no --config: the tiny preset on the embedded demo "
      "corpus. Resumes from the logdir's latest valid checkpoint. SIGTERM/SIGINT/SIGHUP: final "
      "checkpoint, then exit 143/130/129.");
  train_cmd->add_option("--config,-c", train.config, "YAML config (see examples/worker-tiny.yaml)");
  train_cmd->add_option("--logdir", train.logdir,
                        "checkpoints + events (default: $LONGHAUL_LOGDIR, the config's logdir, "
                        "or runs/<preset>)");
  train_cmd->add_option("--set", train.sets, "override a config key: --set training.max_steps=50")
      ->allow_extra_args(false);
  train_cmd
      ->add_option("--metrics-port", train.metrics_port,
                   "Prometheus /metrics port (0 disables; default: the config's)")
      ->check(whole_number(0, 65535,
                           "a TCP port from 1 to 65535, or 0 to turn the metrics server off"));

  train_cmd
      ->add_option("--rank", train.rank,
                   "this replica's rank without TF_CONFIG (default $LONGHAUL_RANK or 0)")
      ->check(whole_number(0, INT_MAX, "a whole number from 0 (the chief)"));
  train_cmd
      ->add_option("--world-size", train.world_size,
                   "replicas without TF_CONFIG (default $LONGHAUL_WORLD_SIZE or 1)")
      ->check(whole_number(1, INT_MAX, "a whole number of replicas, at least 1"));
  train_cmd->add_option(
      "--rendezvous-dir", train.rendezvous_dir,
      "shared folder for the replicas' rendezvous (default <logdir>/.rendezvous)");
  train_cmd
      ->add_option("--allreduce-overlap", train.allreduce_overlap,
                   "CPU replicas: all-reduce gradient buckets while the backward pass runs (on) "
                   "or the whole buffer after it (off); default $LONGHAUL_ALLREDUCE_OVERLAP or on")
      ->check(CLI::IsMember({"on", "off"}));
  train_cmd
      ->add_option("--allreduce-bucket-mb", train.allreduce_bucket_mb,
                   "CPU replicas: gradient bucket size in MiB for the overlapped all-reduce; 0: "
                   "min(25, a quarter of the gradients) (default $LONGHAUL_ALLREDUCE_BUCKET_MB)")
      ->check(real_number(0, true, 1e9, true, "a size in MiB, 0 or more (0: automatic)"));

  LaunchArgs launch;
  auto* launch_cmd = app.add_subcommand(
      "launch",
      "Run N data-parallel replicas on this machine (TF_CONFIG on 127.0.0.1), restarting them "
      "all after a retryable failure: launch --replicas 2 -- train --config x.yaml");
  launch_cmd->add_option("--replicas,-n", launch.replicas, "replicas (chief + workers)")
      ->check(whole_number(1, INT_MAX, "a whole number of replicas, at least 1"));
  launch_cmd
      ->add_option("--max-restarts", launch.max_restarts,
                   "group restarts after retryable failures (default 3)")
      ->check(whole_number(0, INT_MAX, "a whole number, 0 or more"));
  launch_cmd->add_flag("--evaluator", launch.evaluator,
                       "also run an evaluator task (val loss of each checkpoint in <logdir>/eval)");
  launch_cmd
      ->add_option("--grace-secs", launch.grace_secs,
                   "SIGTERM -> SIGKILL delay when stopping replicas (default 30)")
      ->check(real_number(0, false, 1e9, true, "a number of seconds above 0, e.g. 30"));
  launch_cmd->add_option("command", launch.command, "after --: train [train flags]")->required();

  EvalArgs eval;
  auto* eval_cmd = app.add_subcommand("eval", "Print the mean loss of a checkpoint over shards.");
  eval_cmd->add_option("--checkpoint", eval.checkpoint, "a model.ckpt-<step>.safetensors file")
      ->required();
  eval_cmd->add_option("--data", eval.data, "glob of token shards, e.g. 'data/val_*.bin'")
      ->required();
  eval_cmd->add_option("--config,-c", eval.config, "config for batch_size/seq_len");
  eval_cmd->add_option("--set", eval.sets, "override a config key")->allow_extra_args(false);
  eval_cmd->add_option("--batches", eval.batches, "at most this many batches (0: all)")
      ->check(whole_number(0, LLONG_MAX, "a whole number of batches, 0 or more (0: all)"));
  eval_cmd->add_flag("--json", eval.json, "print one JSON object");

  InspectArgs inspect;
  auto* inspect_cmd = app.add_subcommand(
      "inspect",
      "List checkpoints (step, size, validity), events files, and what a restart "
      "would restore.");
  inspect_cmd->add_option("logdir", inspect.logdir, "the logdir")->required();
  inspect_cmd->add_flag("--json", inspect.json, "print one JSON object");
  inspect_cmd->add_flag("--tensors", inspect.tensors,
                        "also list the tensors of the checkpoint a restart would restore");

  PrepareArgs prepare;
  auto* prepare_cmd = app.add_subcommand(
      "prepare-data",
      "Turn text files into llm.c token shards: train_NNNNNN.bin and val_NNNNNN.bin (the last "
      "--val-fraction of the tokens), plus longhaul-data.json naming the tokenizer. "
      "--tokenizer bytes (default, vocab 256) or gpt2 (GPT-2 BPE from --vocab/--merges; each "
      "file is a document preceded by <|endoftext|>).");
  prepare_cmd->add_option("--input,-i", prepare.inputs, "text files, concatenated in order")
      ->required()
      ->check(CLI::ExistingFile);
  prepare_cmd->add_option("--output-dir,-o", prepare.output_dir, "where the shards go")->required();
  prepare_cmd->add_option("--tokenizer", prepare.tokenizer, "bytes (default) or gpt2")
      ->check(CLI::IsMember({"bytes", "gpt2"}));
  prepare_cmd->add_option("--vocab", prepare.vocab, "gpt2: vocab.json (Hugging Face's GPT-2 file)")
      ->check(CLI::ExistingFile);
  prepare_cmd
      ->add_option("--merges", prepare.merges, "gpt2: merges.txt (Hugging Face's GPT-2 file)")
      ->check(CLI::ExistingFile);
  prepare_cmd
      ->add_option("--val-fraction", prepare.val_fraction,
                   "fraction of the bytes for validation, in [0, 1) (default 0.05)")
      ->check(
          real_number(0, true, 1, false, "a fraction from 0 up to (not including) 1, e.g. 0.05"));
  prepare_cmd
      ->add_option("--shard-tokens", prepare.shard_tokens, "tokens per shard (default 10000000)")
      ->check(whole_number(1, LLONG_MAX,
                           "a whole number of tokens per shard, at least 1 (e.g. 10000000)"));

  DoctorArgs doctor;
  auto* doctor_cmd = app.add_subcommand(
      "doctor",
      "Check this machine for training: build, driver, GPUs, the self-check of every kernel "
      "against the reference (PASS/FAIL/FALLBACK), the path train would take, and matmul / "
      "memory / PCIe measurements against nominal peaks. Without a GPU: the CPU path. Exit 0 "
      "when every check passed, 1 when one failed, 2 for --device cuda without a usable GPU.");
  doctor_cmd->add_option("--device", doctor.device, "auto (default), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  doctor_cmd->add_flag("--json", doctor.json, "print one JSON object");
  doctor_cmd->add_option("--config,-c", doctor.config,
                         "the training config whose model shape the self-check uses");
  doctor_cmd->add_option("--set", doctor.sets, "override a config key")->allow_extra_args(false);

  SampleArgs sample;
  auto* sample_cmd = app.add_subcommand(
      "sample",
      "Generate text from a checkpoint on the CPU with a KV cache; prints the prompt and the "
      "continuation (stops at <|endoftext|>). Decodes bytes or GPT-2 BPE (the tokenizer the "
      "run's data used, kept in <logdir>/tokenizer/).");
  sample_cmd->add_option("--checkpoint", sample.checkpoint, "a model.ckpt-<step>.safetensors file")
      ->required();
  sample_cmd->add_option("--prompt", sample.prompt,
                         "text to continue (default: start of a document)");
  sample_cmd->add_option("--tokens,-n", sample.tokens, "tokens to generate (default 256)")
      ->check(whole_number(0, INT_MAX, "a whole number of tokens, 0 or more"));
  sample_cmd
      ->add_option("--temperature", sample.temperature,
                   "softmax temperature; 0 is greedy (default 1)")
      ->check(real_number(0, true, 1e6, true, "a temperature, 0 (greedy) or more, e.g. 0.8"));
  sample_cmd->add_option("--top-k", sample.top_k, "sample among the k likeliest tokens (0: all)")
      ->check(whole_number(0, INT_MAX, "a whole number, 0 (all tokens) or more"));
  sample_cmd->add_option("--seed", sample.seed, "random seed: the same seed, the same text");
  sample_cmd->add_option("--device", sample.device, "auto or cpu: sampling runs on the CPU")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sample_cmd->add_option("--vocab", sample.vocab, "gpt2 vocab.json (default: the logdir's)");
  sample_cmd->add_option("--merges", sample.merges, "gpt2 merges.txt (default: the logdir's)");
  sample_cmd->add_option("--config,-c", sample.config,
                         "model shape for a file without longhaul metadata");
  sample_cmd->add_option("--set", sample.sets, "override a config key, e.g. model.preset=gpt2-124m")
      ->allow_extra_args(false);
  sample_cmd->add_flag("--ignore-eot", sample.ignore_end_of_text,
                       "keep generating after <|endoftext|>");

  ExportArgs exp;
  auto* export_cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's model for other tools: --format hf (default) a directory that "
      "transformers.GPT2LMHeadModel.from_pretrained loads; --format llmc llm.c's model.bin "
      "(+ tokenizer.bin). DIR must not exist or be empty; it appears complete or not at all.");
  export_cmd->add_option("--checkpoint", exp.checkpoint, "a model.ckpt-<step>.safetensors file")
      ->required();
  export_cmd->add_option("--output,-o", exp.output, "the directory to create")->required();
  export_cmd->add_option("--format", exp.format, "hf (default) or llmc")
      ->check(CLI::IsMember({"hf", "llmc"}));
  export_cmd->add_option("--vocab", exp.vocab, "gpt2 vocab.json (default: the logdir's)");
  export_cmd->add_option("--merges", exp.merges, "gpt2 merges.txt (default: the logdir's)");
  export_cmd->add_option("--config,-c", exp.config,
                         "model shape for a file without longhaul metadata");
  export_cmd->add_option("--set", exp.sets, "override a config key")->allow_extra_args(false);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help/version (rc 0) or the error
    return rc == 0 ? kExitFinished : kExitUsage;
  }
  try {
    if (*train_cmd) return run_train(train);
    if (*launch_cmd) return run_launch_command(launch);
    if (*eval_cmd) return run_eval(eval);
    if (*inspect_cmd) return run_inspect(inspect);
    if (*prepare_cmd) return run_prepare(prepare);
    if (*doctor_cmd) return run_doctor(doctor);
    if (*sample_cmd) return run_sample(sample);
    if (*export_cmd) return run_export(exp);
  } catch (...) {
    return report_error(std::current_exception());
  }
  return kExitUsage;
}
