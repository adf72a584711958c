// prepare-data: text files -> llm.c token shards (bytes or GPT-2 BPE) + the data manifest; and
// the embedded demo dataset.
#include "longhaul/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"
#include "longhaul/data/token_shard.h"
#include "longhaul/tokenizer/tokenizer.h"

namespace longhaul::data {
namespace {

size_t val_count(size_t total, double val_fraction) {
  return static_cast<size_t>(std::floor(static_cast<double>(total) * val_fraction));
}

std::filesystem::path shard_path(const std::filesystem::path& dir, const char* split, size_t i) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s_%06zu.bin", split, i);
  return dir / name;
}

std::vector<std::filesystem::path> write_split(const std::filesystem::path& dir, const char* split,
                                               std::span<const uint16_t> tokens,
                                               size_t shard_tokens) {
  std::vector<std::filesystem::path> written;
  for (size_t begin = 0; begin < tokens.size(); begin += shard_tokens) {
    const size_t n = std::min(shard_tokens, tokens.size() - begin);
    written.push_back(shard_path(dir, split, written.size()));
    write_shard(written.back(), tokens.subspan(begin, n));
  }
  return written;
}

// The tokenizer --tokenizer names: bytes, or gpt2 from --vocab/--merges (InvalidArgument for
// anything it cannot use).
std::unique_ptr<tokenizer::Tokenizer> tokenizer_for(const PrepareOptions& options) {
  if (options.tokenizer == "bytes") return std::make_unique<tokenizer::ByteTokenizer>();
  if (options.tokenizer != "gpt2") {
    throw InvalidArgument("--tokenizer must be bytes or gpt2, got \"" + options.tokenizer + "\"");
  }
  if (options.vocab.empty() || options.merges.empty()) {
    throw InvalidArgument(
        "prepare-data --tokenizer gpt2 needs --vocab vocab.json and --merges "
        "merges.txt (Hugging Face's gpt2 files)");
  }
  try {
    return tokenizer::GPT2Tokenizer::load(options.vocab, options.merges);
  } catch (const InvalidArgument&) {
    throw;
  } catch (const Error& e) {
    throw InvalidArgument(std::string("prepare-data: ") + e.what());
  }
}

// Every input file as one document, in order (preceded by <|endoftext|> when the tokenizer has
// it, as llm.c does). InvalidArgument when all of them are empty.
std::vector<uint16_t> encode_inputs(const PrepareOptions& options, tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids;
  bool any_text = false;
  for (const auto& input : options.inputs) {
    const std::string text = file::read_file(input);
    any_text = any_text || !text.empty();
    if (auto eot = tok.end_of_text()) ids.push_back(*eot);
    tok.encode(text, ids);
  }
  if (!any_text) throw InvalidArgument("prepare-data: the input files are empty");
  return std::vector<uint16_t>(ids.begin(), ids.end());  // ids < 65536 (tokenizer.h)
}

// The manifest (and the tokenizer files it names), so training records how to decode.
void write_manifest(const PrepareOptions& options, const tokenizer::Tokenizer& tok,
                    const PrepareResult& result) {
  nlohmann::json manifest{{"tokenizer", std::string(tok.kind())},
                          {"vocab_size", tok.vocab_size()},
                          {"train_tokens", result.train_tokens},
                          {"val_tokens", result.val_tokens}};
  if (auto eot = tok.end_of_text()) manifest["end_of_text"] = *eot;
  if (tok.kind() == "gpt2") {
    file::write_atomically(options.output_dir / "vocab.json", file::read_file(options.vocab));
    file::write_atomically(options.output_dir / "merges.txt", file::read_file(options.merges));
    manifest["vocab"] = "vocab.json";
    manifest["merges"] = "merges.txt";
  }
  file::write_atomically(options.output_dir / kDataManifestName, manifest.dump(2) + "\n");
}

// Removes the shards of an earlier preparation with more shards than this one wrote.
void remove_stale_shards(const std::filesystem::path& dir, const PrepareResult& result) {
  const std::regex ours(R"((train|val)_\d{6}\.bin)");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, ours)) continue;
    const auto& keep = name[0] == 't' ? result.train_shards : result.val_shards;
    if (std::find(keep.begin(), keep.end(), entry.path()) == keep.end()) {
      LH_LOG(WARNING) << "removing stale shard of an earlier prepare-data run"
                      << kv("path", entry.path().string());
      std::filesystem::remove(entry.path());
    }
  }
}

}  // namespace

std::vector<uint16_t> byte_tokens(std::string_view text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

PrepareResult prepare_text_shards(const PrepareOptions& options) {
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    throw InvalidArgument("--val-fraction must be in [0, 1), got " +
                          std::to_string(options.val_fraction));
  }
  if (options.shard_tokens == 0) throw InvalidArgument("--shard-tokens must be positive");
  if (options.inputs.empty()) throw InvalidArgument("prepare-data needs at least one --input");
  const std::unique_ptr<tokenizer::Tokenizer> tok = tokenizer_for(options);
  const std::vector<uint16_t> tokens = encode_inputs(options, *tok);
  const size_t n_val = val_count(tokens.size(), options.val_fraction);
  const std::span<const uint16_t> all(tokens);

  file::ensure_writable_directory(options.output_dir, "prepare-data --output-dir");
  PrepareResult result;
  result.train_shards = write_split(options.output_dir, "train", all.first(tokens.size() - n_val),
                                    options.shard_tokens);
  result.val_shards = write_split(options.output_dir, "val", all.last(n_val), options.shard_tokens);
  result.train_tokens = tokens.size() - n_val;
  result.val_tokens = n_val;
  result.vocab_size = tok->vocab_size();
  write_manifest(options, *tok, result);
  remove_stale_shards(options.output_dir, result);
  return result;
}

std::optional<DataManifest> read_data_manifest(std::string_view glob) {
  std::vector<std::filesystem::path> files;
  try {
    files = expand_glob(glob);
  } catch (const Error&) {
    return std::nullopt;  // the data loader reports the missing data
  }
  const std::filesystem::path dir = files.front().parent_path();
  const std::filesystem::path path = dir / kDataManifestName;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(file::read_file(path));
    DataManifest m;
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.vocab_size = j.at("vocab_size").get<int>();
    if (m.tokenizer == "gpt2") {
      m.vocab = dir / j.at("vocab").get<std::string>();
      m.merges = dir / j.at("merges").get<std::string>();
    } else if (m.tokenizer != "bytes") {
      throw InvalidArgument("unknown tokenizer \"" + m.tokenizer + "\"");
    }
    return m;
  } catch (const std::exception& e) {
    throw InvalidArgument("data manifest " + path.string() + " is garbled (" + e.what() +
                          "); run prepare-data again or delete it");
  }
}

std::shared_ptr<const TokenDataset> embedded_dataset(bool validation, double val_fraction) {
  const std::string_view text = embedded_corpus();
  const size_t n_val = val_count(text.size(), val_fraction);
  if (validation) {
    return TokenDataset::from_tokens("<embedded corpus, validation split>",
                                     byte_tokens(text.substr(text.size() - n_val)));
  }
  return TokenDataset::from_tokens("<embedded corpus, training split>",
                                   byte_tokens(text.substr(0, text.size() - n_val)));
}

}  // namespace longhaul::data
