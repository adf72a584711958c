// Small string helpers shared by the worker and the operator.
#pragma once

#include <string>
#include <string_view>

namespace longhaul {

// `s` without the leading and trailing characters in `chars` (by default ASCII whitespace:
// space, tab, CR, LF, FF, VT). A view into `s`: keep `s` alive. HTTP's optional whitespace is
// trim(s, " \t").
constexpr std::string_view trim(std::string_view s, std::string_view chars = " \t\r\n\f\v") {
  const size_t begin = s.find_first_not_of(chars);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(chars) - begin + 1);
}

// How append_quoted writes a control byte (< 0x20) other than \n, \r and \t: JSON's \u00XX, or
// the octal \NNN of C and the protobuf text format (TensorFlow's CheckpointState file).
enum class ControlEscape { kJsonUnicode, kOctal };

// Appends `s` as a double-quoted string literal that JSON and the protobuf text format read back
// as `s`: `"` and `\` are backslash-escaped, newline, CR and tab become \n \r \t, other control
// bytes as `control` says; every other byte (UTF-8 included) is copied as is.
inline void append_quoted(std::string& out, std::string_view s, ControlEscape control) {
  constexpr std::string_view kHex = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (b >= 0x20) {
      out += c;
    } else if (control == ControlEscape::kJsonUnicode) {
      out += "\\u00";
      out += kHex[b >> 4];
      out += kHex[b & 0xf];
    } else {
      out += '\\';
      out += static_cast<char>('0' + (b >> 6));
      out += static_cast<char>('0' + ((b >> 3) & 7));
      out += static_cast<char>('0' + (b & 7));
    }
  }
  out += '"';
}

}  // namespace longhaul
