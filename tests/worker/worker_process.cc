// Test helpers for running longhaul-worker as a child process. See worker_process.h.
#include "worker_process.h"

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/supervisor/checkpoint_state.h"

namespace longhaul::worker_test {

fs::path worker_binary() {
  const char* dir = std::getenv("LONGHAUL_BINARY_DIR");
  return fs::path(dir ? dir : ".") / "worker" / "cli" / "longhaul-worker";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

WorkerProcess::WorkerProcess(std::vector<std::string> args, const fs::path& cwd,
                             const fs::path& output_dir, std::map<std::string, std::string> env) {
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  out_path_ = output_dir / ("worker." + tag + ".out");
  err_path_ = output_dir / ("worker." + tag + ".err");
  const std::string binary = worker_binary().string();
  std::vector<std::string> argv_strings{binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  pid_ = ::fork();
  if (pid_ == 0) {
    int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(120);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
}

bool WorkerProcess::running() {
  if (exit_code_) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

std::optional<int> WorkerProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // poll the exit condition
  }
  return exit_code_;
}

bool WorkerProcess::wait_for_stdout(const std::string& needle, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (out().find(needle) != std::string::npos) return true;
    if (!running()) return out().find(needle) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // poll the output condition
  }
  return false;
}

void WorkerProcess::signal(int sig) {
  if (!exit_code_) ::kill(pid_, sig);
}

std::string WorkerProcess::out() const { return read_text(out_path_); }
std::string WorkerProcess::err() const { return read_text(err_path_); }

RunOutput run_worker(const std::vector<std::string>& args, const fs::path& cwd,
                     std::chrono::milliseconds timeout, std::map<std::string, std::string> env) {
  WorkerProcess p(args, cwd, cwd, std::move(env));
  RunOutput r;
  auto code = p.wait(timeout);
  r.exit_code = code.value_or(-1);
  r.out = p.out();
  r.err = p.err();
  return r;
}

std::string small_model_config(int64_t max_steps, int64_t save_model_steps,
                               double save_model_secs) {
  std::ostringstream y;
  y << "model: {preset: tiny, n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}\n"
    << "training: {batch_size: 2, seq_len: 16, max_steps: " << max_steps
    << ", learning_rate: 0.01, warmup_steps: 2, seed: 7}\n"
    << "checkpoint: {save_model_secs: " << save_model_secs
    << ", save_model_steps: " << save_model_steps << ", max_to_keep: 3}\n"
    << "summaries: {every_steps: 1, save_summaries_secs: 0}\n"
    << "log: {every_steps: 1}\n"
    << "eval: {every_steps: 0}\n";
  return y.str();
}

std::optional<int64_t> state_file_latest_step(const fs::path& logdir) {
  auto state = supervisor::read_checkpoint_state(logdir);
  if (!state || state->model_checkpoint_path.empty()) return std::nullopt;
  return supervisor::checkpoint_step(state->model_checkpoint_path);
}

std::map<int64_t, fs::path> checkpoint_files(const fs::path& logdir) {
  std::map<int64_t, fs::path> out;
  const std::regex re(R"(model\.ckpt-(\d+)\.safetensors)");
  for (const auto& e : fs::directory_iterator(logdir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) out[std::stoll(m[1].str())] = e.path();
  }
  return out;
}

std::optional<int64_t> start_step(const std::string& text) {
  static const std::regex re(R"((starting|resuming) at step (\d+)/)");
  std::smatch m;
  if (std::regex_search(text, m, re)) return std::stoll(m[2].str());
  return std::nullopt;
}

}  // namespace longhaul::worker_test
