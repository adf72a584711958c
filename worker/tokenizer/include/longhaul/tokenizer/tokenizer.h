// Tokenizers that turn text into the token ids a model trains on, and back:
//
//   ByteTokenizer   every byte is a token (ids 0..255, vocab 256): the `tiny` presets and the
//                   embedded corpus; needs no files.
//   GPT2Tokenizer   OpenAI GPT-2's byte-level BPE from the files Hugging Face distributes
//                   (vocab.json + merges.txt); ids equal Hugging Face's GPT2Tokenizer(Fast) and
//                   tiktoken's "gpt2" encoding for the same files.
//
// GPT-2 byte-level BPE, step by step:
//   1. `<|endoftext|>` in the text is the special end-of-text token (as Hugging Face does for
//      its special tokens); the text between them is encoded as follows.
//   2. Pre-tokenization by GPT-2's regex, implemented by hand (unicode_tables.h):
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      Bytes that are not valid UTF-8 are kept, each as one "other" character.
//   3. Each piece's UTF-8 bytes become printable characters by GPT-2's byte-to-unicode map
//      (bytes 33..126, 161..172, 174..255 map to themselves; the other 68 to U+0100.. in order;
//      so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
//   4. BPE: starting from single characters, the adjacent pair with the lowest merges.txt rank
//      is merged (leftmost first among equal pairs) until no pair has a rank; each resulting
//      symbol's id is its vocab.json id. Results are cached per piece.
// decode() inverts the byte map, so decode(encode(text)) == text for every byte string.
//
// Thread-safety: encode() of a GPT2Tokenizer updates its piece cache: use one tokenizer per
// thread (or guard it). decode() and the accessors are const and safe from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace longhaul::tokenizer {

inline constexpr std::string_view kEndOfText = "<|endoftext|>";

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "bytes" or "gpt2": what checkpoints and data manifests record.
  virtual std::string_view kind() const = 0;
  // One more than the largest id encode() can produce (the model's vocab_size must be >= it).
  virtual int vocab_size() const = 0;
  // The id of <|endoftext|>, placed before every document; nullopt for bytes.
  virtual std::optional<int32_t> end_of_text() const = 0;
  // Appends the ids of `text` to `out`.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) = 0;
  // The bytes of the ids, concatenated. Throws InvalidArgument naming an id outside the vocab.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string_view kind() const override { return "bytes"; }
  int vocab_size() const override { return 256; }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  void encode(std::string_view text, std::vector<int32_t>& out) override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
};

class GPT2Tokenizer final : public Tokenizer {
 public:
  // Reads vocab.json (a JSON object token -> id) and merges.txt ("#version" line optional, then
  // one "left right" pair per line, rank = line order). Throws NotFound/PermissionDenied naming
  // an unreadable file, InvalidArgument naming the file (and line) when it is garbled: not a
  // JSON object of non-negative ids, an id >= 65536 (shards hold uint16), a byte character
  // missing from the vocabulary, or a merge whose parts or result are not in the vocabulary.
  static std::unique_ptr<GPT2Tokenizer> load(const std::filesystem::path& vocab_json,
                                             const std::filesystem::path& merges_txt);
  // The same from the files' contents; `vocab_name`/`merges_name` name them in errors.
  GPT2Tokenizer(std::string_view vocab_json, std::string_view merges_txt,
                std::string vocab_name = "vocab.json", std::string merges_name = "merges.txt");

  std::string_view kind() const override { return "gpt2"; }
  int vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }
  void encode(std::string_view text, std::vector<int32_t>& out) override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;

  // Step 2 alone: the pre-tokenized pieces of `text` (no special-token handling), for tests.
  static std::vector<std::string_view> pre_tokenize(std::string_view text);
  // The vocabulary string of an id ("Ġthe"); InvalidArgument when unknown.
  const std::string& token(int32_t id) const;

 private:
  using TokenIds = std::unordered_map<std::string, int32_t>;  // vocabulary string -> id

  void encode_piece(std::string_view piece, std::vector<int32_t>& out);
  // The constructor's steps; each throws InvalidArgument naming the file (and line) at fault.
  TokenIds read_vocab(std::string_view vocab_json, const std::string& vocab_name);  // tokens_
  void map_bytes(const TokenIds& ids, const std::string& vocab_name);  // byte_ids_, end_of_text_
  void decode_tokens_to_bytes();                                       // token_bytes_
  void read_merges(std::string_view merges_txt, const std::string& merges_name, const TokenIds& ids,
                   const std::string& vocab_name);  // merges_

  struct PairHash {
    size_t operator()(uint64_t key) const {
      return std::hash<uint64_t>()(key * 0x9E3779B97F4A7C15ull);
    }
  };
  struct Merge {
    int32_t rank;
    int32_t result;  // id of the merged symbol
  };
  int vocab_size_ = 0;
  std::optional<int32_t> end_of_text_;
  int32_t byte_ids_[256] = {};            // id of each byte's single-character token
  std::vector<std::string> tokens_;       // id -> vocabulary string ("" for unused ids)
  std::vector<std::string> token_bytes_;  // id -> the bytes it decodes to
  std::unordered_map<uint64_t, Merge, PairHash> merges_;         // (left id << 32 | right id)
  std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece -> ids
};

// The tokenizer a kind names: "bytes", or "gpt2" with its files (InvalidArgument for an
// unknown kind or gpt2 without files).
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view kind,
                                          const std::filesystem::path& vocab_json = {},
                                          const std::filesystem::path& merges_txt = {});

}  // namespace longhaul::tokenizer
