// prepare-data: text files -> byte-level llm.c token shards; and the embedded demo dataset.
#include "longhaul/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"

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
  std::string text;
  for (const auto& input : options.inputs) text += file::read_file(input);
  if (text.empty()) throw InvalidArgument("prepare-data: the input files are empty");
  const std::vector<uint16_t> tokens = byte_tokens(text);
  const size_t n_val = val_count(tokens.size(), options.val_fraction);
  const std::span<const uint16_t> all(tokens);

  file::ensure_writable_directory(options.output_dir, "prepare-data --output-dir");
  PrepareResult result;
  result.train_shards = write_split(options.output_dir, "train", all.first(tokens.size() - n_val),
                                    options.shard_tokens);
  result.val_shards = write_split(options.output_dir, "val", all.last(n_val), options.shard_tokens);
  result.train_tokens = tokens.size() - n_val;
  result.val_tokens = n_val;

  // Remove stale shards from an earlier preparation with more shards.
  const std::regex ours(R"((train|val)_\d{6}\.bin)");
  for (const auto& entry : std::filesystem::directory_iterator(options.output_dir)) {
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, ours)) continue;
    const auto& keep = name[0] == 't' ? result.train_shards : result.val_shards;
    if (std::find(keep.begin(), keep.end(), entry.path()) == keep.end()) {
      LH_LOG(WARNING) << "removing stale shard of an earlier prepare-data run"
                      << kv("path", entry.path().string());
      std::filesystem::remove(entry.path());
    }
  }
  return result;
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
