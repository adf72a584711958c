// ByteTokenizer and GPT2Tokenizer (byte-level BPE). See tokenizer.h for the algorithm.
#include "longhaul/tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "unicode_tables.h"

namespace longhaul::tokenizer {
namespace {

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the others to U+0100.. in order.
struct ByteMap {
  char32_t to_unicode[256];
  ByteMap() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_unicode[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    }
  }
  // The byte a code point stands for, or -1.
  int to_byte(char32_t c) const {
    if (c < 256) return to_unicode[c] == c ? static_cast<int>(c) : -1;
    for (int b = 0; b < 256; ++b) {
      if (to_unicode[b] == c) return b;
    }
    return -1;
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

constexpr char32_t kInvalid = 0xFFFFFFFF;

// Decodes the code point at s[i]; *len = its byte length. Invalid UTF-8 (bad lead or
// continuation byte, overlong form, surrogate, > U+10FFFF, truncation) yields kInvalid, len 1.
char32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n;
  char32_t c, min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return kInvalid;
  }
  if (i + n > s.size()) return kInvalid;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return kInvalid;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return kInvalid;
  *len = n;
  return c;
}

enum class CharClass { kLetter, kNumber, kSpace, kOther };

CharClass classify(char32_t c) {
  if (c == kInvalid) return CharClass::kOther;
  if (unicode::is_letter(c)) return CharClass::kLetter;
  if (unicode::is_number(c)) return CharClass::kNumber;
  if (unicode::is_whitespace(c)) return CharClass::kSpace;
  return CharClass::kOther;
}

CharClass class_at(std::string_view s, size_t i, size_t* len) {
  return classify(decode_utf8(s, i, len));
}

// End of the run of characters of class `cls` starting at i.
size_t run_end(std::string_view s, size_t i, CharClass cls) {
  size_t len;
  while (i < s.size() && class_at(s, i, &len) == cls) i += len;
  return i;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at s[i], or 0.
size_t contraction(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < s.size()) {
    const char b = s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// The end of the regex match that starts at i (see tokenizer.h, step 2).
size_t piece_end(std::string_view s, size_t i) {
  if (size_t n = contraction(s, i)) return i + n;
  size_t len;
  const CharClass first = class_at(s, i, &len);
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
  if (s[i] == ' ' && i + 1 < s.size()) {
    size_t next_len;
    const CharClass next = class_at(s, i + 1, &next_len);
    if (next != CharClass::kSpace) return run_end(s, i + 1, next);
  }
  if (first != CharClass::kSpace) return run_end(s, i + len, first);
  // `\s+(?!\S)`: a whitespace run, less its last character when a non-space follows (that
  // character then starts the next piece, e.g. " word"); `\s+` when the run is one character.
  size_t j = i, last = i;
  while (j < s.size()) {
    size_t l;
    if (class_at(s, j, &l) != CharClass::kSpace) break;
    last = j;
    j += l;
  }
  if (j == s.size() || last == i) return j;
  return last;
}

[[noreturn]] void bad_file(const std::string& name, const std::string& what) {
  throw InvalidArgument(name + ": " + what +
                        "; pass the vocab.json and merges.txt of one byte-level BPE tokenizer "
                        "(e.g. Hugging Face's gpt2)");
}

}  // namespace

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  out.reserve(out.size() + text.size());
  for (unsigned char c : text) out.push_back(c);
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id > 255) {
      throw InvalidArgument("token id " + std::to_string(id) +
                            " is not a byte (the bytes tokenizer has ids 0..255)");
    }
    out += static_cast<char>(id);
  }
  return out;
}

std::unique_ptr<GPT2Tokenizer> GPT2Tokenizer::load(const std::filesystem::path& vocab_json,
                                                   const std::filesystem::path& merges_txt) {
  return std::make_unique<GPT2Tokenizer>(file::read_file(vocab_json), file::read_file(merges_txt),
                                         vocab_json.string(), merges_txt.string());
}

GPT2Tokenizer::GPT2Tokenizer(std::string_view vocab_json, std::string_view merges_txt,
                             std::string vocab_name, std::string merges_name) {
  const TokenIds ids = read_vocab(vocab_json, vocab_name);
  map_bytes(ids, vocab_name);
  decode_tokens_to_bytes();
  read_merges(merges_txt, merges_name, ids, vocab_name);
}

GPT2Tokenizer::TokenIds GPT2Tokenizer::read_vocab(std::string_view vocab_json,
                                                  const std::string& vocab_name) {
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::exception& e) {
    bad_file(vocab_name, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!vocab.is_object() || vocab.empty()) {
    bad_file(vocab_name, "not a JSON object of token -> id");
  }
  TokenIds ids;
  ids.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > 65535) {
      bad_file(vocab_name, "token \"" + token + "\" has id " + id.dump() +
                               "; ids must be integers in [0, 65535] (token shards are uint16)");
    }
    const auto i = id.get<int32_t>();
    ids.emplace(token, i);
    if (static_cast<size_t>(i) >= tokens_.size()) tokens_.resize(static_cast<size_t>(i) + 1);
    tokens_[static_cast<size_t>(i)] = token;
  }
  vocab_size_ = static_cast<int>(tokens_.size());
  return ids;
}

// Every byte has a single-character token (byte-level BPE); <|endoftext|> is optional.
void GPT2Tokenizer::map_bytes(const TokenIds& ids, const std::string& vocab_name) {
  const ByteMap& map = byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, map.to_unicode[b]);
    auto it = ids.find(ch);
    if (it == ids.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      bad_file(vocab_name, "no token for byte " + std::string(hex) + " (\"" + ch +
                               "\"); a byte-level BPE vocabulary holds all 256 bytes");
    }
    byte_ids_[b] = it->second;
  }
  if (auto it = ids.find(std::string(kEndOfText)); it != ids.end()) end_of_text_ = it->second;
}

// What each id decodes to: its characters mapped back to bytes, or (special tokens such as
// <|endoftext|>, whose characters are not all byte characters) its literal text.
void GPT2Tokenizer::decode_tokens_to_bytes() {
  const ByteMap& map = byte_map();
  token_bytes_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    std::string bytes;
    bool all_bytes = true;
    for (size_t i = 0; i < t.size() && all_bytes;) {
      size_t len;
      const char32_t c = decode_utf8(t, i, &len);
      const int b = c == kInvalid ? -1 : map.to_byte(c);
      if (b < 0) all_bytes = false;
      bytes += static_cast<char>(b);
      i += len;
    }
    token_bytes_[id] = all_bytes ? bytes : t;
  }
}

// merges.txt: an optional "#version" first line, then one "left right" pair per line, by rank.
void GPT2Tokenizer::read_merges(std::string_view merges_txt, const std::string& merges_name,
                                const TokenIds& ids, const std::string& vocab_name) {
  size_t line_no = 0, begin = 0;
  int32_t rank = 0;
  while (begin < merges_txt.size()) {
    size_t end = merges_txt.find('\n', begin);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      bad_file(merges_name + ":" + std::to_string(line_no),
               "expected two tokens separated by one space, got \"" + std::string(line) + "\"");
    }
    const std::string left(line.substr(0, space)), right(line.substr(space + 1));
    auto l = ids.find(left), r = ids.find(right), m = ids.find(left + right);
    if (l == ids.end() || r == ids.end() || m == ids.end()) {
      const std::string& missing = l == ids.end() ? left : r == ids.end() ? right : left + right;
      bad_file(merges_name + ":" + std::to_string(line_no),
               "merge \"" + std::string(line) + "\" uses \"" + missing + "\", which " + vocab_name +
                   " does not have");
    }
    const uint64_t key =
        (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    merges_.emplace(key, Merge{rank++, m->second});  // a repeated pair keeps its first rank
  }
}

const std::string& GPT2Tokenizer::token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || tokens_[id].empty()) {
    throw InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                          std::to_string(vocab_size_) + ")");
  }
  return tokens_[id];
}

std::vector<std::string_view> GPT2Tokenizer::pre_tokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < text.size();) {
    const size_t end = piece_end(text, i);
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

void GPT2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  for (size_t i = 0; i < text.size();) {
    size_t special = end_of_text_ ? text.find(kEndOfText, i) : std::string_view::npos;
    const size_t stop = special == std::string_view::npos ? text.size() : special;
    while (i < stop) {
      const size_t end = piece_end(text.substr(0, stop), i);
      encode_piece(text.substr(i, end - i), out);
      i = end;
    }
    if (special != std::string_view::npos) {
      out.push_back(*end_of_text_);
      i = special + kEndOfText.size();
    }
  }
}

void GPT2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (auto it = cache_.find(std::string(piece)); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  // Symbols in a doubly-linked list; candidate merges in a min-heap by (rank, position), with
  // stale entries (a side already merged away) skipped when popped: O(n log n) per piece.
  struct Symbol {
    int32_t id;
    int prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  const int n = static_cast<int>(piece.size());
  std::vector<Symbol> syms(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    syms[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1,
               true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const uint64_t key =
        (static_cast<uint64_t>(syms[left].id) << 32) | static_cast<uint32_t>(syms[right].id);
    if (auto m = merges_.find(key); m != merges_.end()) {
      heap.push({m->second.rank, left, right, syms[left].id, syms[right].id});
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    if (!l.alive || l.next != c.right || l.id != c.left_id || !syms[c.right].alive ||
        syms[c.right].id != c.right_id) {
      continue;  // stale
    }
    const uint64_t key =
        (static_cast<uint64_t>(c.left_id) << 32) | static_cast<uint32_t>(c.right_id);
    l.id = merges_.at(key).result;
    Symbol& r = syms[c.right];
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i >= 0; i = syms[i].next) ids.push_back(syms[i].id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() >= (1u << 20)) cache_.clear();  // bound memory on unbounded vocabularies
  cache_.emplace(std::string(piece), std::move(ids));
}

std::string GPT2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= token_bytes_.size() || tokens_[id].empty()) {
      throw InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                            std::to_string(vocab_size_) + ")");
    }
    out += token_bytes_[id];
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view kind,
                                          const std::filesystem::path& vocab_json,
                                          const std::filesystem::path& merges_txt) {
  if (kind == "bytes") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") {
    if (vocab_json.empty() || merges_txt.empty()) {
      throw InvalidArgument(
          "the gpt2 tokenizer needs its files: --vocab vocab.json --merges merges.txt");
    }
    return GPT2Tokenizer::load(vocab_json, merges_txt);
  }
  throw InvalidArgument("unknown tokenizer \"" + std::string(kind) + "\"; use bytes or gpt2");
}

}  // namespace longhaul::tokenizer
