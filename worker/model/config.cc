#include "longhaul/model/config.h"

#include <sstream>

#include <longhaul/base/error.h>

namespace longhaul::model {
namespace {

struct Preset {
  const char* name;
  GPT2Config config;
};

// {vocab_size, context_length, n_layer, n_head, n_embd}
constexpr Preset kPresets[] = {
    {"tiny", {256, 128, 4, 4, 128}},
    {"small-4x256", {256, 256, 4, 4, 256}},
    {"gpt2-124m", {50257, 1024, 12, 12, 768}},
    {"gpt2-350m", {50257, 1024, 24, 16, 1024}},
};

void require_positive(const char* field, int value) {
  if (value <= 0) {
    throw InvalidArgument("GPT2Config." + std::string(field) + " = " + std::to_string(value) +
                          " is invalid: it must be a positive integer");
  }
}

}  // namespace

void GPT2Config::validate() const {
  require_positive("vocab_size", vocab_size);
  require_positive("context_length", context_length);
  require_positive("n_layer", n_layer);
  require_positive("n_head", n_head);
  require_positive("n_embd", n_embd);
  if (n_embd % n_head != 0) {
    throw InvalidArgument("GPT2Config.n_head = " + std::to_string(n_head) +
                          " does not divide n_embd = " + std::to_string(n_embd) +
                          ": choose n_head so that n_embd / n_head is a whole head size");
  }
}

int64_t GPT2Config::num_parameters() const {
  const int64_t V = vocab_size, maxT = context_length, L = n_layer, C = n_embd;
  const int64_t per_layer = 2 * C                   // ln_1
                            + C * 3 * C + 3 * C     // c_attn
                            + C * C + C             // attn.c_proj
                            + 2 * C                 // ln_2
                            + C * 4 * C + 4 * C     // c_fc
                            + 4 * C * C + C;        // mlp.c_proj
  return V * C + maxT * C + L * per_layer + 2 * C;  // wte, wpe, blocks, ln_f
}

std::string GPT2Config::to_string() const {
  std::ostringstream os;
  os << "vocab_size=" << vocab_size << " context_length=" << context_length
     << " n_layer=" << n_layer << " n_head=" << n_head << " n_embd=" << n_embd;
  return os.str();
}

GPT2Config GPT2Config::preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.config;
  }
  std::string known;
  for (const Preset& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw InvalidArgument("unknown model preset '" + std::string(name) + "': known presets are " +
                        known);
}

std::vector<std::string> GPT2Config::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace longhaul::model
