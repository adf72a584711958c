// Raw text -> token shards (`longhaul-worker prepare-data`), the data manifest that says which
// tokenizer made them, and the demo corpus built into the binary (the "embedded default" that
// `longhaul-worker train` uses with no config).
//
// Tokenizers (longhaul/tokenizer/tokenizer.h):
//   bytes (default)  every byte of the text is one token in [0, 256), so vocab_size 256 covers
//                    any input (UTF-8 included) and no tokenizer files are needed; the inputs
//                    are concatenated as they are.
//   gpt2             GPT-2 byte-level BPE from vocab.json + merges.txt (Hugging Face's files):
//                    ids equal Hugging Face's GPT-2 tokenizer's. As in llm.c's data scripts,
//                    every input file is a document preceded by <|endoftext|>, and a literal
//                    "<|endoftext|>" in the text also becomes that token.
//
// Manifest: output_dir/longhaul-data.json records {"tokenizer", "vocab_size", "end_of_text",
// token counts}; with gpt2, vocab.json and merges.txt are copied next to it. Training reads it
// (read_data_manifest) so checkpoints, `sample` and `export` know how to decode.
//
// Split: the inputs are encoded in the order given; the LAST val_fraction of the tokens (at
// least one batch's worth is the caller's concern) becomes the validation split, the rest the
// training split. Each split is cut into shards of at most shard_tokens tokens named
// `train_000000.bin`, `train_000001.bin`, ... and `val_000000.bin`, ... in output_dir.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "longhaul/data/data_loader.h"

namespace longhaul::data {

inline constexpr int kByteVocabSize = 256;

std::vector<uint16_t> byte_tokens(std::string_view text);

inline constexpr std::string_view kDataManifestName = "longhaul-data.json";

struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;
  std::string tokenizer = "bytes";      // bytes | gpt2
  std::filesystem::path vocab, merges;  // gpt2: vocab.json, merges.txt
  std::filesystem::path output_dir;
  double val_fraction = 0.05;        // in [0, 1)
  size_t shard_tokens = 10'000'000;  // tokens per shard, > 0
};

struct PrepareResult {
  std::vector<std::filesystem::path> train_shards;
  std::vector<std::filesystem::path> val_shards;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  int vocab_size = 256;  // the tokenizer's; model.vocab_size must be at least this
};

// Reads every input (NotFound/PermissionDenied naming it), loads the tokenizer (InvalidArgument
// naming a garbled vocab/merges file), writes the shards and the manifest atomically, and
// removes shards of an earlier run in output_dir that this run did not rewrite (so the
// `train_*.bin` glob never mixes two preparations). InvalidArgument for a val_fraction outside
// [0, 1), a zero shard size, or empty input.
PrepareResult prepare_text_shards(const PrepareOptions& options);

// What longhaul-data.json says about a directory of shards.
struct DataManifest {
  std::string tokenizer = "bytes";      // bytes | gpt2
  int vocab_size = 256;                 // one more than the largest id the tokenizer makes
  std::filesystem::path vocab, merges;  // gpt2: the copies next to the manifest
};

// The manifest of the directory holding the first file `glob` matches, or nullopt when there
// is none (shards from elsewhere, e.g. llm.c's scripts). InvalidArgument naming a garbled one.
std::optional<DataManifest> read_data_manifest(std::string_view glob);

// The demo corpus compiled into the binary (worker/data/corpus/*.txt, concatenated), as text.
std::string_view embedded_corpus();

// The embedded corpus as byte tokens: the training split (all but the last val_fraction) or the
// validation split.
std::shared_ptr<const TokenDataset> embedded_dataset(bool validation, double val_fraction = 0.05);

}  // namespace longhaul::data
