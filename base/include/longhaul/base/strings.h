// Small string helpers shared by the worker and the operator.
#pragma once

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

}  // namespace longhaul
