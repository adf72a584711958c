// Text generation and tokenizer lookup. See sampling.h.
#include "longhaul/trainer/sampling.h"

#include <algorithm>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"

namespace longhaul::trainer {
namespace {

bool tokenizer_files_in(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "vocab.json", ec) &&
         std::filesystem::exists(dir / "merges.txt", ec);
}

}  // namespace

TokenizerSpec checkpoint_tokenizer(const supervisor::TensorSource& checkpoint,
                                   const model::GPT2Config& config, const std::string& vocab_flag,
                                   const std::string& merges_flag) {
  if (vocab_flag.empty() != merges_flag.empty()) {
    throw InvalidArgument("--vocab and --merges go together (the gpt2 tokenizer's two files)");
  }
  if (!vocab_flag.empty()) return {"gpt2", vocab_flag, merges_flag};
  const std::filesystem::path dir =
      std::filesystem::path(checkpoint.path()).parent_path() / kTokenizerDir;
  auto it = checkpoint.metadata().find("tokenizer");
  const std::string kind = it == checkpoint.metadata().end() ? "" : it->second;
  if (kind == "gpt2" || (kind.empty() && tokenizer_files_in(dir))) {
    if (!tokenizer_files_in(dir)) {
      throw InvalidArgument("checkpoint " + checkpoint.path() + " was trained on gpt2 tokens but " +
                            (dir / "vocab.json").string() +
                            " or merges.txt is missing; pass --vocab and --merges");
    }
    return {"gpt2", dir / "vocab.json", dir / "merges.txt"};
  }
  if (kind == "bytes" || (kind.empty() && config.vocab_size == 256)) return {"bytes", {}, {}};
  return {};
}

void save_tokenizer_files(const TokenizerSpec& spec, const std::filesystem::path& logdir) {
  if (spec.kind != "gpt2") return;
  const std::filesystem::path dir = logdir / kTokenizerDir;
  std::filesystem::create_directories(dir);
  for (const auto& [from, name] :
       {std::pair{spec.vocab, "vocab.json"}, {spec.merges, "merges.txt"}}) {
    const std::string contents = file::read_file(from);
    std::error_code ec;
    if (std::filesystem::exists(dir / name, ec) && file::read_file(dir / name) == contents)
      continue;
    file::write_atomically(dir / name, contents);
  }
}

Generated generate_text(const model::GPT2Config& config, std::span<const float> params,
                        tokenizer::Tokenizer& tokenizer, const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text) {
  Generated out;
  if (options.prompt.empty()) {
    out.prompt_ids.push_back(tokenizer.end_of_text().value_or('\n'));
  } else {
    tokenizer.encode(options.prompt, out.prompt_ids);
  }
  for (int32_t id : out.prompt_ids) {
    if (id >= config.vocab_size) {
      throw InvalidArgument("the prompt has token id " + std::to_string(id) +
                            " but the model's vocab_size is " + std::to_string(config.vocab_size) +
                            "; is this the tokenizer the model was trained with?");
    }
  }
  const int ctx = config.context_length;
  model::GPT2Inference inference(config, params, ctx);
  model::TokenSampler sampler(options.sampling);
  std::vector<int32_t> context = out.prompt_ids;  // everything in (or owed to) the cache
  // Keeps the last half of the context when it no longer fits.
  auto crop = [&] {
    if (static_cast<int>(context.size()) >= ctx) {
      context.erase(context.begin(), context.end() - std::max(1, ctx / 2));
    }
  };
  crop();
  // Only ids the tokenizer can decode are drawn (a model's vocabulary may be padded beyond it).
  const size_t decodable = static_cast<size_t>(std::min(config.vocab_size, tokenizer.vocab_size()));
  auto logits = inference.append(context);
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int32_t next = sampler.next(logits.first(decodable));
    out.ids.push_back(next);
    const std::string bytes = tokenizer.decode(std::span<const int32_t>(&next, 1));
    out.text += bytes;
    if (on_text) on_text(bytes);
    if (options.stop_at_end_of_text && tokenizer.end_of_text() == next) break;
    if (i + 1 == options.max_new_tokens) break;
    context.push_back(next);
    if (inference.position() + 1 > ctx) {
      crop();
      inference.reset();
      logits = inference.append(context);
    } else {
      logits = inference.append(std::span<const int32_t>(&context.back(), 1));
    }
  }
  return out;
}

}  // namespace longhaul::trainer
