// `longhaul-worker export --checkpoint FILE --output DIR [--format hf|llmc]`: a checkpoint's
// model as a Hugging Face GPT-2 directory or an llm.c model file.
//
// hf:   config.json (GPT2Config), model.safetensors (only the parameters, Hugging Face names,
//       lm_head tied so not stored, as save_pretrained writes it), generation_config.json, and
//       with GPT-2 tokens vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json.
// llmc: model.bin in llm.c's gpt2_124M.bin layout (train_gpt2.c's gpt2_build_from_checkpoint):
//       256 int32 header {20240326, 3, maxT, V, L, NH, C, Vp} with Vp = V rounded up to a multiple
//       of 128, then fp32 wte (Vp, C; padded rows zero), wpe (maxT, C), and per-kind stacks over
//       the L layers: ln1w, ln1b, qkvw (L, 3C, C), qkvb, attprojw (L, C, C), attprojb, ln2w, ln2b,
//       fcw (L, 4C, C), fcb, fcprojw (L, C, 4C), fcprojb, then lnfw, lnfb. llm.c's matmul weights
//       are (OC, C) (torch Linear), so Hugging Face's Conv1D (C, OC) weights are transposed. With
//       GPT-2 tokens also tokenizer.bin in llm.c's format {20240328, 2, V, eot} + length-prefixed
//       token bytes.
//
// Atomic: everything is written into a hidden temporary directory next to DIR, which is renamed
// to DIR at the end; a crash or an error leaves no DIR (the temporary one is removed on error).
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint_weights.h"
#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/model/gpt2_layout.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/tokenizer/tokenizer.h"
#include "longhaul/trainer/sampling.h"

namespace longhaul::cli {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int32_t kLlmcModelVersion = 3;  // fp32, padded vocabulary
constexpr int32_t kLlmcTokenizerMagic = 20240328;
constexpr int32_t kLlmcTokenizerVersion = 2;  // with the eot token in the header

// Removes the temporary directory unless released.
class TempDir {
 public:
  explicit TempDir(fs::path path) : path_(std::move(path)) { fs::create_directories(path_); }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  const fs::path& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

void write_json(const fs::path& path, const nlohmann::json& j) {
  file::write_atomically(path, j.dump(2) + "\n");
}

void write_hf(const fs::path& dir, const CheckpointWeights& w, const trainer::TokenizerSpec& spec,
              tokenizer::Tokenizer* tok) {
  const model::GPT2Config& c = w.config;
  const std::optional<int32_t> eot = tok ? tok->end_of_text() : std::nullopt;
  const nlohmann::json eot_id = eot ? nlohmann::json(*eot) : nlohmann::json(nullptr);
  nlohmann::json config{{"architectures", {"GPT2LMHeadModel"}},
                        {"model_type", "gpt2"},
                        {"vocab_size", c.vocab_size},
                        {"n_positions", c.context_length},
                        {"n_ctx", c.context_length},
                        {"n_embd", c.n_embd},
                        {"n_layer", c.n_layer},
                        {"n_head", c.n_head},
                        {"n_inner", nullptr},  // 4 * n_embd
                        {"activation_function", "gelu_new"},
                        {"layer_norm_epsilon", 1e-5},
                        {"initializer_range", 0.02},
                        // longhaul trains without dropout; fine-tuning can set these.
                        {"attn_pdrop", 0.0},
                        {"embd_pdrop", 0.0},
                        {"resid_pdrop", 0.0},
                        {"scale_attn_weights", true},
                        {"use_cache", true},
                        {"tie_word_embeddings", true},
                        {"bos_token_id", eot_id},
                        {"eos_token_id", eot_id},
                        {"torch_dtype", "float32"}};
  write_json(dir / "config.json", config);
  write_json(dir / "generation_config.json",
             {{"_from_model_config", true}, {"bos_token_id", eot_id}, {"eos_token_id", eot_id}});

  // Only the parameters, in layout order, under Hugging Face names.
  model::ParameterLayout layout(c);
  std::vector<supervisor::TensorSpec> specs;
  specs.reserve(layout.size());
  for (const auto& t : layout) specs.push_back({t.name, supervisor::DType::kF32, t.shape});
  std::vector<supervisor::TensorView> views;
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto* bytes = reinterpret_cast<const std::byte*>(w.params.data() + layout[i].offset);
    views.push_back({&specs[i], {bytes, layout[i].numel * sizeof(float)}});
  }
  supervisor::write_safetensors(dir / "model.safetensors", views, {{"format", "pt"}});

  if (spec.kind == "gpt2") {
    file::write_atomically(dir / "vocab.json", file::read_file(spec.vocab));
    file::write_atomically(dir / "merges.txt", file::read_file(spec.merges));
    const std::string eot_text(tokenizer::kEndOfText);
    write_json(dir / "tokenizer_config.json", {{"tokenizer_class", "GPT2Tokenizer"},
                                               {"model_max_length", c.context_length},
                                               {"add_prefix_space", false},
                                               {"bos_token", eot_text},
                                               {"eos_token", eot_text},
                                               {"unk_token", eot_text}});
    write_json(dir / "special_tokens_map.json",
               {{"bos_token", eot_text}, {"eos_token", eot_text}, {"unk_token", eot_text}});
  }
}

// llm.c's model.bin: the header, then every tensor in llm.c's order (wte padded to Vp rows).
void write_llmc_model(const fs::path& dir, const CheckpointWeights& w) {
  const model::GPT2Config& c = w.config;
  const int V = c.vocab_size, C = c.n_embd, L = c.n_layer, maxT = c.context_length;
  const int Vp = (V + 127) / 128 * 128;
  model::ParameterLayout layout(c);
  const float* p = w.params.data();
  file::AtomicFile out(dir / "model.bin");
  int32_t header[256] = {};
  header[0] = kLlmcModelMagic;
  header[1] = kLlmcModelVersion;
  header[2] = maxT;
  header[3] = V;
  header[4] = L;
  header[5] = c.n_head;
  header[6] = C;
  header[7] = Vp;
  out.write(header, sizeof header);
  auto put = [&](const float* data, size_t n) { out.write(data, n * sizeof(float)); };
  put(p + layout.wte().offset, static_cast<size_t>(V) * C);
  const std::vector<float> zeros(static_cast<size_t>(Vp - V) * C, 0.0f);
  put(zeros.data(), zeros.size());
  put(p + layout.wpe().offset, static_cast<size_t>(maxT) * C);
  std::vector<float> transposed;
  // Every layer's tensor of one kind; Conv1D (rows, cols) weights are written transposed.
  auto stack = [&](model::BlockTensor kind, bool transpose) {
    for (int l = 0; l < L; ++l) {
      const auto& t = layout.block(l, kind);
      const float* src = p + t.offset;
      if (!transpose) {
        put(src, t.numel);
        continue;
      }
      const auto rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
      transposed.resize(t.numel);
      for (size_t r = 0; r < rows; ++r)
        for (size_t k = 0; k < cols; ++k) transposed[k * rows + r] = src[r * cols + k];
      put(transposed.data(), transposed.size());
    }
  };
  stack(model::kLn1W, false);
  stack(model::kLn1B, false);
  stack(model::kQkvW, true);
  stack(model::kQkvB, false);
  stack(model::kAttProjW, true);
  stack(model::kAttProjB, false);
  stack(model::kLn2W, false);
  stack(model::kLn2B, false);
  stack(model::kFcW, true);
  stack(model::kFcB, false);
  stack(model::kFcProjW, true);
  stack(model::kFcProjB, false);
  put(p + layout.lnf_weight().offset, static_cast<size_t>(C));
  put(p + layout.lnf_bias().offset, static_cast<size_t>(C));
  out.commit();
}

// llm.c's tokenizer.bin: the header, then each token's bytes with their length (1..255).
void write_llmc_tokenizer(const fs::path& dir, tokenizer::Tokenizer& tok) {
  file::AtomicFile t(dir / "tokenizer.bin");
  int32_t th[256] = {};
  th[0] = kLlmcTokenizerMagic;
  th[1] = kLlmcTokenizerVersion;
  th[2] = tok.vocab_size();
  th[3] = *tok.end_of_text();
  t.write(th, sizeof th);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string bytes = tok.decode(std::span<const int32_t>(&id, 1));
    if (bytes.empty() || bytes.size() > 255) {
      throw InvalidArgument("token " + std::to_string(id) + " is " + std::to_string(bytes.size()) +
                            " bytes long; llm.c's tokenizer.bin holds 1..255");
    }
    const auto len = static_cast<uint8_t>(bytes.size());
    t.write(&len, 1);
    t.write(bytes);
  }
  t.commit();
}

void write_llmc(const fs::path& dir, const CheckpointWeights& w, tokenizer::Tokenizer* tok) {
  write_llmc_model(dir, w);
  if (tok != nullptr && tok->end_of_text()) write_llmc_tokenizer(dir, *tok);
}

}  // namespace

int run_export(const ExportArgs& args) {
  const fs::path output = fs::absolute(args.output).lexically_normal();
  std::error_code ec;
  if (fs::exists(output, ec)) {
    if (!fs::is_directory(output, ec) || !fs::is_empty(output, ec)) {
      throw InvalidArgument("export --output " + args.output +
                            " exists and is not an empty directory; choose a new one (nothing "
                            "was written)");
    }
  }
  CheckpointWeights w = load_checkpoint_weights(args.checkpoint, args.config, args.sets);
  const trainer::TokenizerSpec spec =
      trainer::checkpoint_tokenizer(*w.reader, w.config, args.vocab, args.merges);
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (!spec.kind.empty()) {
    try {
      tok = tokenizer::make_tokenizer(spec.kind, spec.vocab, spec.merges);
    } catch (const Error& e) {
      throw InvalidArgument(e.what());
    }
  }
  fs::create_directories(output.parent_path());
  TempDir temp(output.parent_path() /
               ("." + output.filename().string() + ".tmp." + std::to_string(::getpid())));
  if (args.format == "hf") {
    write_hf(temp.path(), w, spec, tok.get());
  } else {
    write_llmc(temp.path(), w, tok.get());
  }
  if (fs::exists(output, ec)) fs::remove(output);  // empty (checked above)
  fs::rename(temp.path(), output);
  temp.release();
  file::fsync_directory(output.parent_path());
  std::printf("exported %s (step %s, %s, %lld parameters, tokens: %s) as %s to %s\n",
              args.checkpoint.c_str(), w.step < 0 ? "unknown" : std::to_string(w.step).c_str(),
              w.config.to_string().c_str(), static_cast<long long>(w.config.num_parameters()),
              spec.kind.empty() ? "unknown" : spec.kind.c_str(), args.format.c_str(),
              output.string().c_str());
  if (args.format == "hf") {
    std::printf("load with: transformers.GPT2LMHeadModel.from_pretrained(\"%s\")\n",
                output.string().c_str());
  }
  return kExitFinished;
}

}  // namespace longhaul::cli
