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

// extend() takes three interleaved streams through long and short blocks, joined by shift
// tables; every split of lengths and alignments must give the table-driven result.
TEST(Crc32c, FastPathAgreesWithTheTableOnEveryLengthAndAlignment) {
  std::vector<uint8_t> data(3 * 8192 * 4 + 1000);
  uint32_t x = 12345;
  for (auto& b : data) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 64; ++n) lengths.push_back(n);
  for (size_t n : {255u, 256u, 767u, 768u, 769u, 1000u, 24575u, 24576u, 24577u, 25000u, 49152u,
                   49152u + 768u + 5u, 98304u}) {
    lengths.push_back(n);
  }
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n : lengths) {
      for (uint32_t seed : {0u, 0xdeadbeefu}) {
        ASSERT_EQ(extend(seed, data.data() + offset, n),
                  extend_portable(seed, data.data() + offset, n))
            << "length " << n << " offset " << offset << " seed " << seed;
      }
    }
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
