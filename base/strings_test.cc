// append_quoted: the one string-literal escaper of the structured log (JSON) and of the
// checkpoint state file (protobuf text format).
#include "longhaul/base/strings.h"

#include <string>

#include <gtest/gtest.h>

namespace longhaul {
namespace {

std::string quoted(std::string_view s, ControlEscape control) {
  std::string out = "prefix ";
  append_quoted(out, s, control);
  return out;
}

TEST(AppendQuoted, EscapesQuotesBackslashesAndControlBytesInBothDialects) {
  const std::string text = std::string("a \"b\" \\ c\n\r\td") + '\x01' + '\x1f' + "\xc3\xa9";
  EXPECT_EQ(quoted(text, ControlEscape::kJsonUnicode),
            "prefix \"a \\\"b\\\" \\\\ c\\n\\r\\td\\u0001\\u001f\xc3\xa9\"");
  EXPECT_EQ(quoted(text, ControlEscape::kOctal),
            "prefix \"a \\\"b\\\" \\\\ c\\n\\r\\td\\001\\037\xc3\xa9\"");
  EXPECT_EQ(quoted("", ControlEscape::kOctal), "prefix \"\"");
}

}  // namespace
}  // namespace longhaul
