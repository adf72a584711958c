// generate_text past the context length, and how a checkpoint's tokenizer is found.
#include "longhaul/trainer/sampling.h"

#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/model/gpt2_layout.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::trainer {
namespace {

namespace fs = std::filesystem;

model::GPT2Config tiny_bytes() {
  return {.vocab_size = 256, .context_length = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
}

std::vector<float> random_params(const model::GPT2Config& c) {
  model::ParameterLayout layout(c);
  std::vector<float> p(layout.num_parameters());
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (float& x : p) x = n(rng);
  return p;
}

int32_t greedy_after(const model::GPT2Config& c, const std::vector<float>& p,
                     const std::vector<int32_t>& context) {
  model::GPT2Inference inf(c, p, c.context_length);
  auto logits = inf.append(context);
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(GenerateText, RunsPastTheContextByKeepingItsLastHalf) {
  const auto c = tiny_bytes();
  const auto p = random_params(c);
  tokenizer::ByteTokenizer tok;
  GenerateOptions o;
  o.prompt = "abc";
  o.max_new_tokens = 20;  // the context of 8 overflows several times
  o.sampling.temperature = 0;
  o.stop_at_end_of_text = false;
  const Generated g = generate_text(c, p, tok, o);
  ASSERT_EQ(g.ids.size(), 20u);
  EXPECT_EQ(g.prompt_ids, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(tok.decode(g.ids), g.text);
  // Until the context is full, each token is greedy over everything so far.
  std::vector<int32_t> all = g.prompt_ids;
  for (size_t i = 0; all.size() < static_cast<size_t>(c.context_length) + 1; ++i) {
    ASSERT_EQ(g.ids[i], greedy_after(c, p, all)) << "token " << i;
    all.push_back(g.ids[i]);
  }
  // The first token after the overflow is greedy over the last half of the context.
  const size_t first_cropped = c.context_length - g.prompt_ids.size() + 1;
  std::vector<int32_t> context = g.prompt_ids;
  context.insert(context.end(), g.ids.begin(), g.ids.begin() + first_cropped);
  std::vector<int32_t> half(context.end() - c.context_length / 2, context.end());
  EXPECT_EQ(g.ids[first_cropped], greedy_after(c, p, half));
  // Deterministic for a seed at temperature 1.
  o.sampling.temperature = 1.0;
  EXPECT_EQ(generate_text(c, p, tok, o).ids, generate_text(c, p, tok, o).ids);
}

TEST(GenerateText, RejectsAPromptOutsideTheVocabulary) {
  auto c = tiny_bytes();
  c.vocab_size = 100;
  const auto p = random_params(c);
  tokenizer::ByteTokenizer tok;
  GenerateOptions o;
  o.prompt = "\xff";
  EXPECT_THROW(generate_text(c, p, tok, o), InvalidArgument);
  o.prompt = "a";  // ids < 100: fine; draws stay below min(100, 256)
  o.max_new_tokens = 30;
  for (int32_t id : generate_text(c, p, tok, o).ids) EXPECT_LT(id, 100);
}

// A TensorSource with only a path and metadata.
class MetadataOnly : public supervisor::TensorSource {
 public:
  MetadataOnly(std::string path, std::map<std::string, std::string> md)
      : path_(std::move(path)), md_(std::move(md)) {}
  const std::string& path() const override { return path_; }
  bool contains(std::string_view) const override { return false; }
  std::vector<std::string> tensor_names() const override { return {}; }
  const supervisor::TensorSpec& spec(std::string_view name) const override {
    throw NotFound(std::string(name));
  }
  std::span<const std::byte> data(std::string_view name) const override {
    throw NotFound(std::string(name));
  }
  const std::map<std::string, std::string>& metadata() const override { return md_; }

 private:
  std::string path_;
  std::map<std::string, std::string> md_;
};

class TokenizerLookup : public ::testing::Test {
 protected:
  void write(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << s;
  }
  longhaul::testing::TempDir dir_{"lh-sampling"};
};

TEST_F(TokenizerLookup, FlagsThenMetadataThenTheLogdirThenTheVocabularySize) {
  const std::string ckpt = (dir_ / "model.ckpt-5.safetensors").string();
  model::GPT2Config gpt2 = {
      .vocab_size = 50257, .context_length = 8, .n_layer = 1, .n_head = 1, .n_embd = 8};
  model::GPT2Config bytes = tiny_bytes();
  // Explicit files win; one without the other is an error.
  auto s = checkpoint_tokenizer(MetadataOnly(ckpt, {}), gpt2, "v.json", "m.txt");
  EXPECT_EQ(s.kind, "gpt2");
  EXPECT_EQ(s.vocab, "v.json");
  EXPECT_THROW(checkpoint_tokenizer(MetadataOnly(ckpt, {}), gpt2, "v.json", ""), InvalidArgument);
  // Metadata gpt2 without <dir>/tokenizer/: a clear error; with it: those files.
  EXPECT_THROW(checkpoint_tokenizer(MetadataOnly(ckpt, {{"tokenizer", "gpt2"}}), gpt2),
               InvalidArgument);
  // No metadata: bytes for vocab 256, unknown otherwise.
  EXPECT_EQ(checkpoint_tokenizer(MetadataOnly(ckpt, {}), bytes).kind, "bytes");
  EXPECT_EQ(checkpoint_tokenizer(MetadataOnly(ckpt, {}), gpt2).kind, "");
  EXPECT_EQ(checkpoint_tokenizer(MetadataOnly(ckpt, {{"tokenizer", "bytes"}}), gpt2).kind, "bytes");
  // save_tokenizer_files puts a run's files where checkpoint_tokenizer looks.
  write(dir_ / "data" / "vocab.json", "{}");
  write(dir_ / "data" / "merges.txt", "#version: 0.2\n");
  save_tokenizer_files({"gpt2", dir_ / "data" / "vocab.json", dir_ / "data" / "merges.txt"}, dir_);
  save_tokenizer_files({"gpt2", dir_ / "data" / "vocab.json", dir_ / "data" / "merges.txt"}, dir_);
  s = checkpoint_tokenizer(MetadataOnly(ckpt, {{"tokenizer", "gpt2"}}), gpt2);
  EXPECT_EQ(s.kind, "gpt2");
  EXPECT_EQ(s.vocab, dir_ / "tokenizer" / "vocab.json");
  EXPECT_EQ(s.merges, dir_ / "tokenizer" / "merges.txt");
  EXPECT_EQ(checkpoint_tokenizer(MetadataOnly(ckpt, {}), gpt2).kind, "gpt2");  // files alone
}

}  // namespace
}  // namespace longhaul::trainer
