// Raw text -> byte-level token shards (`longhaul-worker prepare-data`), and the demo corpus
// built into the binary (the "embedded default" that `longhaul-worker train` uses with no config).
//
// Byte-level tokenisation: every byte of the text is one token in [0, 256), so vocab_size 256
// covers any input (UTF-8 included) and no tokenizer files are needed.
//
// Split: the inputs are concatenated in the order given; the LAST val_fraction of the bytes (at
// least one batch's worth is the caller's concern) becomes the validation split, the rest the
// training split. Each split is cut into shards of at most shard_tokens tokens named
// `train_000000.bin`, `train_000001.bin`, ... and `val_000000.bin`, ... in output_dir.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "longhaul/data/data_loader.h"

namespace longhaul::data {

inline constexpr int kByteVocabSize = 256;

std::vector<uint16_t> byte_tokens(std::string_view text);

struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output_dir;
  double val_fraction = 0.05;        // in [0, 1)
  size_t shard_tokens = 10'000'000;  // tokens per shard, > 0
};

struct PrepareResult {
  std::vector<std::filesystem::path> train_shards;
  std::vector<std::filesystem::path> val_shards;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
};

// Reads every input (NotFound/PermissionDenied naming it), writes the shards atomically, and
// removes shards of an earlier run in output_dir that this run did not rewrite (so the
// `train_*.bin` glob never mixes two preparations). InvalidArgument for a val_fraction outside
// [0, 1), a zero shard size, or empty input.
PrepareResult prepare_text_shards(const PrepareOptions& options);

// The demo corpus compiled into the binary (worker/data/corpus/*.txt, concatenated), as text.
std::string_view embedded_corpus();

// The embedded corpus as byte tokens: the training split (all but the last val_fraction) or the
// validation split.
std::shared_ptr<const TokenDataset> embedded_dataset(bool validation, double val_fraction = 0.05);

}  // namespace longhaul::data
