// Test helpers for end-to-end tests of the longhaul-worker binary: run it as a child process
// with stdout/stderr captured to files, wait for output or exit with a deadline, send signals;
// small-model configs; logdir readers.
//
// Thread-safety: used from the test thread only.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

namespace longhaul::worker_test {

namespace fs = std::filesystem;

// The binary under test: $LONGHAUL_BINARY_DIR/worker/cli/longhaul-worker.
fs::path worker_binary();
std::string read_text(const fs::path& path);
void write_text(const fs::path& path, const std::string& text);

// A running (or finished) longhaul-worker.
class WorkerProcess {
 public:
  WorkerProcess(std::vector<std::string> args, const fs::path& cwd, const fs::path& output_dir,
                std::map<std::string, std::string> env = {});
  ~WorkerProcess();  // kills (SIGKILL) and reaps the child if still running
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Waits for exit up to `timeout`; returns the exit code (128+signal when killed), or nullopt
  // on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // Waits until stdout contains `needle` (true) or the deadline passes / the process exits
  // without printing it (false).
  bool wait_for_stdout(const std::string& needle, std::chrono::milliseconds timeout);
  void signal(int sig);
  bool running();

  std::string out() const;
  std::string err() const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  fs::path out_path_, err_path_;
};

// Runs to completion (deadline `timeout`) and returns {exit code, stdout, stderr}.
struct RunOutput {
  int exit_code = -1;
  std::string out, err;
};
RunOutput run_worker(const std::vector<std::string>& args, const fs::path& cwd,
                     std::chrono::milliseconds timeout = std::chrono::seconds(120),
                     std::map<std::string, std::string> env = {});

// A config for a very small model (1 layer, 32 wide) that trains hundreds of steps per second
// on the embedded corpus. `extra` is appended YAML (later keys of the same section must not
// repeat a section: use --set for overrides instead).
std::string small_model_config(int64_t max_steps, int64_t save_model_steps,
                               double save_model_secs = 0);

// The step of the checkpoint the state file names, or nullopt when there is none.
std::optional<int64_t> state_file_latest_step(const fs::path& logdir);
// Checkpoint files in the logdir, by step.
std::map<int64_t, fs::path> checkpoint_files(const fs::path& logdir);
// The step in "resuming at step N" / "starting at step N" of a worker's stdout, or nullopt.
std::optional<int64_t> start_step(const std::string& stdout_text);

}  // namespace longhaul::worker_test
