// Unicode character classes for GPT-2's pre-tokenization regex: \p{L} (letters), \p{N}
// (numbers) from the generated tables in unicode_tables.cc, and \s (White_Space). Internal to
// longhaul::tokenizer.
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <cstddef>

namespace longhaul::tokenizer::unicode {

struct CodePointRange {
  char32_t first;
  char32_t last;  // inclusive
};

extern const char* const kUnicodeVersion;
extern const CodePointRange kLetterRanges[];
extern const size_t kLetterRangeCount;
extern const CodePointRange kNumberRanges[];
extern const size_t kNumberRangeCount;

// General category L* (Lu, Ll, Lt, Lm, Lo).
bool is_letter(char32_t c);
// General category N* (Nd, Nl, No).
bool is_number(char32_t c);
// The White_Space property (PropList.txt), which is what \s matches in Oniguruma (Hugging Face
// tokenizers), Rust's regex (tiktoken) and Python's `regex` (OpenAI's GPT-2 encoder.py):
// U+0009..000D, 0020, 0085, 00A0, 1680, 2000..200A, 2028, 2029, 202F, 205F, 3000.
bool is_whitespace(char32_t c);

}  // namespace longhaul::tokenizer::unicode
