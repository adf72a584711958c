#include "longhaul/base/crc32c.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace longhaul::crc32c {
namespace {

TEST(Crc32c, KnownVectors) {
  // Check values from RFC 3720 (iSCSI) appendix B.4 and the standard "123456789" check.
  EXPECT_EQ(value("123456789"), 0xe3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(value(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(value(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(value(inc.data(), inc.size()), 0x46dd794eu);
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s += static_cast<char>(i * 7 + 3);
  for (size_t cut : {0u, 1u, 7u, 8u, 9u, 500u, 999u, 1000u}) {
    uint32_t part = extend(value(s.data(), cut), s.data() + cut, s.size() - cut);
    EXPECT_EQ(part, value(s)) << "cut at " << cut;
  }
}

TEST(Crc32c, MaskRoundTripsAndDiffers) {
  for (uint32_t c : {0u, 1u, 0xe3069283u, 0xffffffffu}) {
    EXPECT_EQ(unmask(mask(c)), c);
    EXPECT_NE(mask(c), c);
  }
}

}  // namespace
}  // namespace longhaul::crc32c
