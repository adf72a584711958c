// Tests of the tokenizers: GPT-2 pre-tokenization on the regex's corner cases, BPE merge order,
// byte-exact round trips, and clear errors for garbled files. The comparison with an
// independent implementation (Hugging Face `tokenizers`) is tests/tools/tokenizer_test.py.
#include "longhaul/tokenizer/tokenizer.h"

#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"

namespace longhaul::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(std::string_view text) {
  Pieces out;
  for (auto p : GPT2Tokenizer::pre_tokenize(text)) out.emplace_back(p);
  return out;
}

// Expected splits follow the regex  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  by hand.
TEST(PreTokenize, FollowsTheGpt2Regex) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm here, they'll see"),
            (Pieces{"I", "'m", " here", ",", " they", "'ll", " see"}));
  EXPECT_EQ(pieces("don't DON'T"), (Pieces{"don", "'t", " DON", "'", "T"}));  // case-sensitive
  EXPECT_EQ(pieces("a  b"), (Pieces{"a", " ", " b"}));                // \s+(?!\S) leaves one space
  EXPECT_EQ(pieces("a   \n\nb"), (Pieces{"a", "   \n", "\n", "b"}));  // \n then b: \s+ of 1
  EXPECT_EQ(pieces("x\tb"), (Pieces{"x", "\t", "b"}));
  EXPECT_EQ(pieces("end   "), (Pieces{"end", "   "}));  // trailing run: whole
  EXPECT_EQ(pieces("abc123 4.5"), (Pieces{"abc", "123", " 4", ".", "5"}));
  EXPECT_EQ(pieces("!!?' x"), (Pieces{"!!?'", " x"}));
  EXPECT_EQ(pieces("'s's"), (Pieces{"'s", "'s"}));
  // Unicode letters and numbers: é (Ll), 中 (Lo), Ⅻ (Nl), ² (No), U+3000 ideographic space.
  // " \u3000x": \s+(?!\S) keeps " ", then the lone U+3000 before "x" is \s+ alone.
  EXPECT_EQ(pieces("café 中文 Ⅻ² \u3000x"), (Pieces{"café", " 中文", " Ⅻ²", " ", "\u3000", "x"}));
  EXPECT_EQ(pieces("hi 🙂🙂!"), (Pieces{"hi", " 🙂🙂!"}));    // emoji are "other"
  EXPECT_EQ(pieces("a\xff\xfe b"), (Pieces{"a", "\xff\xfe", " b"}));  // invalid UTF-8 kept
  EXPECT_EQ(pieces(""), Pieces{});
}

// A small byte-level vocabulary: the 256 byte characters, then the merges' results.
struct SmallVocab {
  std::string vocab_json, merges_txt;
};
std::string byte_char(unsigned char b) {
  // GPT-2's map: printable bytes are themselves, others U+0100.. in order.
  int next = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const char32_t c = printable ? static_cast<char32_t>(x) : static_cast<char32_t>(256 + next++);
    if (x == b) {
      std::string s;
      if (c < 0x80) {
        s += static_cast<char>(c);
      } else {
        s += static_cast<char>(0xC0 | (c >> 6));
        s += static_cast<char>(0x80 | (c & 0x3F));
      }
      return s;
    }
  }
  return "";
}
SmallVocab small_vocab(const std::vector<std::pair<std::string, std::string>>& merges,
                       bool with_eot = true) {
  nlohmann::json v = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) v[byte_char(static_cast<unsigned char>(b))] = id++;
  std::string m = "#version: 0.2\n";
  for (const auto& [l, r] : merges) {
    if (!v.contains(l + r)) v[l + r] = id++;
    m += l + " " + r + "\n";
  }
  if (with_eot) v[std::string(kEndOfText)] = id++;
  return {v.dump(), m};
}

TEST(GPT2Tokenizer, MergesByRankLeftmostFirst) {
  const std::string G = byte_char(' ');  // "Ġ"
  auto vocab = small_vocab({{"t", "h"}, {"th", "e"}, {G, "the"}, {"a", "a"}, {"e", "r"}});
  GPT2Tokenizer tok(vocab.vocab_json, vocab.merges_txt);
  EXPECT_EQ(tok.vocab_size(), 256 + 5 + 1);
  auto ids = tok.encode("the there aaa");
  std::vector<std::string> strs;
  for (int32_t id : ids) strs.push_back(tok.token(id));
  // "the"; " there" -> Ġthe + r + e ("th" "e" outranks "e" "r"); "aaa" -> "aa" + "a".
  EXPECT_EQ(strs, (std::vector<std::string>{"the", G + "the", "r", "e", G, "aa", "a"}));
  ASSERT_TRUE(tok.end_of_text().has_value());
  EXPECT_EQ(*tok.end_of_text(), 261);
  auto with_eot = tok.encode("a<|endoftext|>the");
  EXPECT_EQ(with_eot, (std::vector<int32_t>{tok.encode("a")[0], 261, tok.encode("the")[0]}));
  EXPECT_EQ(tok.decode(with_eot), "a<|endoftext|>the");
}

TEST(GPT2Tokenizer, RoundTripsEveryByteString) {
  const std::string G = byte_char(' ');
  auto vocab = small_vocab({{"t", "h"},
                            {"th", "e"},
                            {G, "the"},
                            {G, "a"},
                            {"i", "n"},
                            {"in", "g"},
                            {byte_char(0xC3), byte_char(0xA9)}});
  GPT2Tokenizer tok(vocab.vocab_json, vocab.merges_txt);
  const std::vector<std::string> texts = {
      "the thing is in the café,  isn't it?\n\n  ok\t\t1234 ²³ 中文 🙂",
      std::string("\0\x01\xff\xfe mixed \xc3\xa9 invalid \xe4\xb8", 31),
      "   ",
      "\n",
      "'''",
      "<|endoftext|><|endoftext|>x"};
  for (const auto& t : texts) EXPECT_EQ(tok.decode(tok.encode(t)), t) << t;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
    EXPECT_EQ(tok.encode(s), tok.encode(s));  // the cache gives the same ids
  }
}

TEST(GPT2Tokenizer, LongPiecesAreLinearish) {
  auto vocab = small_vocab({{"a", "b"}, {"ab", "ab"}, {"abab", "abab"}});
  GPT2Tokenizer tok(vocab.vocab_json, vocab.merges_txt);
  std::string s;
  for (int i = 0; i < 200000; ++i) s += "ab";
  auto ids = tok.encode(s);
  EXPECT_EQ(ids.size(), 100000u / 2);  // "abababab" tokens
  EXPECT_EQ(tok.decode(ids), s);
}

TEST(GPT2Tokenizer, GarbledFilesAreClearErrors) {
  auto ok = small_vocab({{"a", "b"}});
  auto expect_error = [](std::string_view vocab, std::string_view merges, const std::string& what) {
    try {
      GPT2Tokenizer tok(vocab, merges, "v.json", "m.txt");
      ADD_FAILURE() << "no error for " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error("[1,2]", ok.merges_txt, "v.json: not a JSON object");
  expect_error("{", ok.merges_txt, "v.json: not valid JSON");
  expect_error(R"({"a": 70000})", ok.merges_txt, "[0, 65535]");
  expect_error(R"({"a": 0})", ok.merges_txt, "no token for byte 0x00");
  expect_error(ok.vocab_json, "#version: 0.2\na b c\n", "m.txt:2: expected two tokens");
  expect_error(ok.vocab_json, "x y\n", "m.txt:1: merge \"x y\" uses \"xy\"");
  EXPECT_THROW(GPT2Tokenizer::load("/nonexistent/vocab.json", "/nonexistent/merges.txt"), Error);
  EXPECT_THROW(make_tokenizer("sentencepiece"), InvalidArgument);
  EXPECT_THROW(make_tokenizer("gpt2"), InvalidArgument);
}

TEST(ByteTokenizer, IsTheIdentityOnBytes) {
  ByteTokenizer tok;
  std::string s("a\0\xff", 3);
  auto ids = tok.encode(s);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', 0, 255}));
  EXPECT_EQ(tok.decode(ids), s);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{256}), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::tokenizer
