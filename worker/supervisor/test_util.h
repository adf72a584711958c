// Test helpers for the supervisor suites: a temporary directory, a condition wait with a
// deadline (both from tests/support), and ToyState, a tiny TrainingState with GPT-2-style tensor
// names.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/supervisor/training_state.h"
#include "longhaul/testing/eventually.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::supervisor::testing {

using longhaul::testing::eventually;
using longhaul::testing::TempDir;

std::string read_bytes(const std::filesystem::path& p);
void write_bytes(const std::filesystem::path& p, const std::string& bytes);
std::vector<std::string> list_dir(const std::filesystem::path& dir);

std::vector<TensorSpec> toy_specs(int64_t width = 3);

// A TrainingState of a few float tensors. train_step() adds 1 to every value. Every call is
// counted; snapshot() records the thread it ran on.
class ToyState : public TrainingState {
 public:
  explicit ToyState(int64_t width = 3);

  std::vector<TensorSpec> tensor_specs() const override { return specs_; }
  void initialize() override;
  void restore(const TensorSource& checkpoint) override;
  void snapshot(Snapshot& out) override;
  int64_t global_step() const override { return step_.load(); }
  std::vector<std::string> uninitialized() const override;

  void train_step();

  std::vector<std::vector<float>> values;
  bool leave_uninitialized = false;  // initialize() leaves the tensors uninitialised
  std::atomic<int> initialize_calls{0};
  std::atomic<int> restore_calls{0};
  std::atomic<int> snapshot_calls{0};
  std::string restored_from;
  Mutex threads_mu;
  std::vector<std::thread::id> snapshot_threads GUARDED_BY(threads_mu);  // one per snapshot()

 private:
  std::vector<TensorSpec> specs_;
  std::atomic<int64_t> step_{0};
  bool initialized_ = false;
};

}  // namespace longhaul::supervisor::testing
