// CPU training throughput of the GPT-2 model: tokens/s of full optimizer steps (zero_grad,
// forward_backward, global-norm clipping, AdamW) on random tokens, per preset.
//
//   build/<dir>/bench/model_bench [--preset tiny --preset small-4x256] [--batch B] [--seq T]
//                                 [--steps N] [--warmup W] [--threads N]
//
// Prints a table, and one machine-readable line per preset for bench/model_bench.sh:
//   RESULT <preset> <B> <T> <threads> <ms/step> <tokens/s> <params>
// Defaults: B=8, T=min(context, 256) (tiny: 128, small-4x256: 256); 3 warmup steps, then
// `--rounds` (3) rounds of `--steps` (10) timed steps; the best round is reported, because on a
// shared machine other processes only ever make a round slower.
// Speed is only ever measured here, never asserted in tests.
//
// --dump DIR (with one --preset) instead writes one forward_backward of the initialised model
// for bench/model_check_torch.py, which recomputes loss and gradients with PyTorch on the same
// weights: DIR/config.txt (V maxT L NH C B T), inputs.i32, targets.i32, params.f32 (the flat
// buffer, named_parameters() order), grads.f32, loss.txt.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <longhaul/kernels/cpu/threading.h>
#include <longhaul/model/config.h>
#include <longhaul/model/cpu/gpt2_cpu.h>

namespace {

struct Options {
  std::vector<std::string> presets;
  int batch = 0, seq = 0, steps = 10, warmup = 3, threads = 0, rounds = 3;
  std::string dump_dir;
};

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--preset NAME]... [--batch B] [--seq T] [--steps N] [--warmup W] "
               "[--rounds R] [--threads N] [--dump DIR]\n",
               argv0);
  return 2;
}

template <typename T>
bool write_raw(const std::string& path, const T* data, size_t count) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, sizeof(T), count, f) == count;
  return std::fclose(f) == 0 && ok;
}

// One forward_backward on random tokens, written for bench/model_check_torch.py.
int dump(longhaul::model::LanguageModel& gpt, const longhaul::model::GPT2Config& c, int B, int T,
         std::vector<int32_t>& x, std::vector<int32_t>& y, std::mt19937_64& rng,
         const std::string& dir) {
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  for (auto& t : x) t = token(rng);
  for (auto& t : y) t = token(rng);
  gpt.zero_grad();
  const float loss = gpt.forward_backward(x.data(), y.data(), B, T, 1.0f);
  const auto params = gpt.parameters_flat();
  const auto grads = gpt.gradients_flat();
  FILE* cfg = std::fopen((dir + "/config.txt").c_str(), "w");
  FILE* lf = std::fopen((dir + "/loss.txt").c_str(), "w");
  if (cfg == nullptr || lf == nullptr) {
    std::fprintf(stderr, "cannot write into %s: create the directory first\n", dir.c_str());
    return 1;
  }
  std::fprintf(cfg, "%d %d %d %d %d %d %d\n", c.vocab_size, c.context_length, c.n_layer, c.n_head,
               c.n_embd, B, T);
  std::fprintf(lf, "%.9g\n", loss);
  const bool ok = std::fclose(cfg) == 0 && std::fclose(lf) == 0 &&
                  write_raw(dir + "/inputs.i32", x.data(), x.size()) &&
                  write_raw(dir + "/targets.i32", y.data(), y.size()) &&
                  write_raw(dir + "/params.f32", params.data(), params.size()) &&
                  write_raw(dir + "/grads.f32", grads.data(), grads.size());
  if (!ok) std::fprintf(stderr, "writing into %s failed\n", dir.c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace longhaul;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    const char* value = argv[++i];
    if (arg == "--preset") {
      opt.presets.emplace_back(value);
    } else if (arg == "--batch") {
      opt.batch = std::atoi(value);
    } else if (arg == "--seq") {
      opt.seq = std::atoi(value);
    } else if (arg == "--steps") {
      opt.steps = std::atoi(value);
    } else if (arg == "--warmup") {
      opt.warmup = std::atoi(value);
    } else if (arg == "--dump") {
      opt.dump_dir = value;
    } else if (arg == "--rounds") {
      opt.rounds = std::max(1, std::atoi(value));
    } else if (arg == "--threads") {
      opt.threads = std::atoi(value);
    } else {
      return usage(argv[0]);
    }
  }
  if (opt.presets.empty()) opt.presets = {"tiny", "small-4x256"};
  kernels::cpu::set_num_threads(opt.threads);
  const int threads = kernels::cpu::num_threads();

  std::printf("%-12s %4s %5s %8s %10s %12s %12s\n", "preset", "B", "T", "threads", "params",
              "ms/step", "tokens/s");
  std::vector<std::string> results;
  for (const std::string& preset : opt.presets) {
    const model::GPT2Config config = model::GPT2Config::preset(preset);
    const int B = opt.batch > 0 ? opt.batch : 8;
    const int T = opt.seq > 0 ? opt.seq : std::min(config.context_length, 256);
    auto gpt = model::make_cpu_gpt2(config, B, T);
    gpt->init_weights(1337);
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
    std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
    if (!opt.dump_dir.empty()) return dump(*gpt, config, B, T, x, y, rng, opt.dump_dir);
    const model::AdamWOptions adamw;
    auto step = [&] {
      for (auto& t : x) t = token(rng);
      for (auto& t : y) t = token(rng);
      gpt->zero_grad();
      gpt->forward_backward(x.data(), y.data(), B, T, 1.0f);
      const float norm = gpt->gradient_norm();
      gpt->optimizer_step(adamw, 3e-4f, norm > 1.0f ? 1.0f / norm : 1.0f);
    };
    for (int i = 0; i < opt.warmup; ++i) step();
    double seconds = 1e300;
    for (int round = 0; round < opt.rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.steps; ++i) step();
      seconds = std::min(
          seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double ms = 1000.0 * seconds / opt.steps;
    const double tps = static_cast<double>(B) * T * opt.steps / seconds;
    std::printf("%-12s %4d %5d %8d %10lld %12.1f %12.0f\n", preset.c_str(), B, T, threads,
                static_cast<long long>(gpt->num_parameters()), ms, tps);
    char line[256];
    std::snprintf(line, sizeof line, "RESULT %s %d %d %d %.3f %.1f %lld", preset.c_str(), B, T,
                  threads, ms, tps, static_cast<long long>(gpt->num_parameters()));
    results.emplace_back(line);
  }
  for (const std::string& r : results) std::printf("%s\n", r.c_str());
  return 0;
}
