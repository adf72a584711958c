// The subcommands of longhaul-worker (see main.cc for flags and README.md for examples). Each
// returns the process exit code (exit_codes.h) or throws a longhaul::Error that main() maps.
#pragma once

#include <string>
#include <vector>

namespace longhaul::cli {

struct TrainArgs {
  std::string config;             // empty: the embedded default
  std::string logdir;             // empty: $LONGHAUL_LOGDIR, config logdir, runs/<preset>
  std::vector<std::string> sets;  // key.sub=value overrides
  int metrics_port = -1;          // -1: the config's metrics_port
};
int run_train(const TrainArgs& args);

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
  double val_fraction = 0.05;
  long long shard_tokens = 10'000'000;
};
int run_prepare(const PrepareArgs& args);

// "0.1.0 (cpu)".
std::string version_string();

}  // namespace longhaul::cli
