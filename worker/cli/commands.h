// The subcommands of longhaul-worker (see main.cc for flags and README.md for examples). Each
// returns the process exit code (exit_codes.h) or throws a longhaul::Error that main() maps.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "longhaul/distributed/cluster.h"
#include "longhaul/distributed/data_parallel.h"
#include "longhaul/trainer/run.h"

namespace longhaul::cli {

struct TrainArgs {
  std::string config;             // empty: the embedded default
  std::string logdir;             // empty: $LONGHAUL_LOGDIR, config logdir, runs/<preset>
  std::vector<std::string> sets;  // key.sub=value overrides
  int metrics_port = -1;          // -1: the config's metrics_port
  // Data-parallel runs without TF_CONFIG (launch_command.cc); -1: LONGHAUL_RANK /
  // LONGHAUL_WORLD_SIZE or a single replica.
  int rank = -1;
  int world_size = -1;
  std::string rendezvous_dir;  // empty: <logdir>/.rendezvous
  // Gradient all-reduce of CPU replicas: "on" (overlapped with the backward pass), "off", or
  // empty ($LONGHAUL_ALLREDUCE_OVERLAP, default on); bucket size in MiB, 0: automatic
  // ($LONGHAUL_ALLREDUCE_BUCKET_MB).
  std::string allreduce_overlap;
  double allreduce_bucket_mb = -1;
};
int run_train(const TrainArgs& args);

struct LaunchArgs {
  int replicas = 1;
  int max_restarts = 3;
  bool evaluator = false;
  double grace_secs = 30;
  std::vector<std::string> command;  // after `--`: train [flags]
};
int run_launch_command(const LaunchArgs& args);

struct EvalArgs {
  std::string checkpoint;
  std::string data;
  std::string config;  // optional: batch_size / seq_len (and model shape for non-longhaul files)
  std::vector<std::string> sets;
  long long batches = 0;  // 0: the whole data
  bool json = false;
};
int run_eval(const EvalArgs& args);

struct InspectArgs {
  std::string logdir;
  bool json = false;
  bool tensors = false;  // list the restore target's tensors
};
int run_inspect(const InspectArgs& args);

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string tokenizer = "bytes";  // bytes | gpt2
  std::string vocab, merges;        // gpt2: Hugging Face's vocab.json and merges.txt
  double val_fraction = 0.05;
  long long shard_tokens = 10'000'000;
};
int run_prepare(const PrepareArgs& args);

struct DoctorArgs {
  std::string device = "auto";  // auto | cpu | cuda
  bool json = false;
  std::string config;  // the model whose head size/vocabulary the self-check uses
  std::vector<std::string> sets;
};
int run_doctor(const DoctorArgs& args);

struct SampleArgs {
  std::string checkpoint;
  std::string prompt;
  int tokens = 256;
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: no limit
  uint64_t seed = 1337;
  std::string device = "auto";  // auto | cpu (sampling runs on the CPU)
  std::string vocab, merges;    // gpt2 tokenizer files (default: the checkpoint's logdir's)
  std::string config;           // model shape for files without longhaul metadata
  std::vector<std::string> sets;
  bool ignore_end_of_text = false;
};
int run_sample(const SampleArgs& args);

struct ExportArgs {
  std::string checkpoint;
  std::string output;
  std::string format = "hf";  // hf | llmc
  std::string vocab, merges;
  std::string config;
  std::vector<std::string> sets;
};
int run_export(const ExportArgs& args);

// Data-parallel replicas (launch_command.cc). join_replica_group forms the group when the
// world has more than one replica (null otherwise) and sets run's sync/gradient/stop hooks;
// the returned object must outlive run_training. finish_replica returns 138 for a replica that
// stopped only because a peer did, writes the chief's training.done marker after max_steps,
// and returns -1 otherwise. run_evaluator_task runs an evaluator task until training is done.
std::unique_ptr<dist::DataParallel> join_replica_group(const dist::ReplicaIdentity& id,
                                                       const TrainArgs& args,
                                                       trainer::RunOptions& run);
int finish_replica(const dist::ReplicaIdentity& id, const TrainArgs& args,
                   const trainer::RunOptions& run, const trainer::RunResult& result,
                   dist::DataParallel* dp);
int run_evaluator_task(const trainer::WorkerConfig& config, const std::filesystem::path& logdir);

// "0.1.0 (cpu)".
std::string version_string();

}  // namespace longhaul::cli
