// Lookups in the generated Unicode tables (unicode_tables.cc).
#include <algorithm>

#include "unicode_tables.h"

namespace longhaul::tokenizer::unicode {
namespace {

bool in_ranges(const CodePointRange* ranges, size_t count, char32_t c) {
  const CodePointRange* end = ranges + count;
  // The first range whose last code point is >= c.
  const CodePointRange* it = std::lower_bound(
      ranges, end, c, [](const CodePointRange& r, char32_t value) { return r.last < value; });
  return it != end && it->first <= c;
}

}  // namespace

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in_ranges(kLetterRanges, kLetterRangeCount, c);
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kNumberRanges, kNumberRangeCount, c);
}

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace longhaul::tokenizer::unicode
