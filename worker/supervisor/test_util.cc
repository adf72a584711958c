#include "test_util.h"

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "longhaul/supervisor/safetensors.h"

namespace longhaul::supervisor::testing {

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<std::string> list_dir(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& de : std::filesystem::directory_iterator(dir)) {
    names.push_back(de.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<TensorSpec> toy_specs(int64_t width) {
  return {
      TensorSpec{"transformer.wte.weight", DType::kF32, {4, width}},
      TensorSpec{"transformer.h.0.attn.c_attn.weight", DType::kF32, {width, 3 * width}},
      TensorSpec{"optimizer.m.transformer.wte.weight", DType::kF32, {4, width}},
  };
}

ToyState::ToyState(int64_t width) : specs_(toy_specs(width)) {
  for (const auto& s : specs_) values.emplace_back(static_cast<size_t>(s.numel()), 0.0f);
}

void ToyState::initialize() {
  ++initialize_calls;
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t j = 0; j < values[i].size(); ++j) values[i][j] = static_cast<float>(i * 100 + j);
  }
  step_ = 0;
  initialized_ = !leave_uninitialized;
}

void ToyState::restore(const TensorSource& checkpoint) {
  ++restore_calls;
  check_compatible(specs_, checkpoint);
  for (size_t i = 0; i < specs_.size(); ++i) {
    auto bytes = checkpoint.data(specs_[i].name);
    std::memcpy(values[i].data(), bytes.data(), bytes.size());
  }
  step_ = std::stoll(checkpoint.metadata().at("global_step"));
  restored_from = checkpoint.path();
  initialized_ = true;
}

void ToyState::snapshot(Snapshot& out) {
  ++snapshot_calls;
  {
    MutexLock lock(threads_mu);
    snapshot_threads.push_back(std::this_thread::get_id());
  }
  out.reshape(specs_);
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::memcpy(out.buffers[i].data(), values[i].data(), out.buffers[i].size());
  }
  out.step = step_.load();
  out.metadata["rng_state"] = "42";
}

std::vector<std::string> ToyState::uninitialized() const {
  if (initialized_) return {};
  std::vector<std::string> names;
  for (const auto& s : specs_) names.push_back(s.name);
  return names;
}

void ToyState::train_step() {
  for (auto& v : values) {
    for (auto& x : v) x += 1.0f;
  }
  ++step_;
}

}  // namespace longhaul::supervisor::testing
