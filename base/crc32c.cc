#include "longhaul/base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace longhaul::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t extend_portable(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    uint32_t lo = static_cast<uint32_t>(word) ^ c;
    uint32_t hi = static_cast<uint32_t>(word >> 32);
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
        kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xff];
  return ~c;
}

namespace {

#if defined(__x86_64__)
// The crc32 instruction issues once per cycle but takes three to deliver: one stream of it runs
// at a third of its speed. Three streams over three consecutive blocks run at full speed; their
// CRCs are then joined by shifting a block's CRC over the zero bytes of the block after it, a
// linear map over GF(2) applied byte by byte from tables made once per block length.
constexpr size_t kLongBlock = 8192;  // bytes per stream; three of them per round
constexpr size_t kShortBlock = 256;  // the same for the rest of a buffer under 3 long blocks

using Gf2Matrix = std::array<uint32_t, 32>;  // column n: the image of bit n

uint32_t gf2_times(const Gf2Matrix& m, uint32_t v) {
  uint32_t sum = 0;
  for (int n = 0; v != 0; ++n, v >>= 1) {
    if (v & 1) sum ^= m[n];
  }
  return sum;
}

// The map that feeds `bytes` zero bytes (a power of two) through a CRC register.
struct ShiftTables {
  explicit ShiftTables(size_t bytes) {
    Gf2Matrix op{};
    op[0] = kPoly;  // one zero bit: c -> (c >> 1) ^ (c & 1 ? kPoly : 0)
    for (int n = 1; n < 32; ++n) op[n] = 1u << (n - 1);
    for (size_t bits = 1; bits < 8 * bytes; bits *= 2) {  // square: twice as many zero bits
      Gf2Matrix square{};
      for (int n = 0; n < 32; ++n) square[n] = gf2_times(op, op[n]);
      op = square;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 0; k < 4; ++k) table[k][b] = gf2_times(op, b << (8 * k));
    }
  }
  uint32_t shift(uint32_t crc) const {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
  }
  std::array<std::array<uint32_t, 256>, 4> table{};
};

uint64_t load64(const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

// Rounds of three streams of `block` bytes while at least 3 * block bytes are left.
__attribute__((target("sse4.2"))) uint64_t three_streams(uint64_t c0, const uint8_t*& p, size_t& n,
                                                         size_t block, const ShiftTables& shift) {
  while (n >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    for (const uint8_t* end = p + block; p < end; p += 8) {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + block));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * block));
    }
    c0 = shift.shift(static_cast<uint32_t>(c0)) ^ c1;
    c0 = shift.shift(static_cast<uint32_t>(c0)) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const ShiftTables long_shift(kLongBlock), short_shift(kShortBlock);
  uint64_t c = ~crc;
  c = three_streams(c, p, n, kLongBlock, long_shift);
  c = three_streams(c, p, n, kShortBlock, short_shift);
  while (n >= 8) {
    c = _mm_crc32_u64(c, load64(p));
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#endif

}  // namespace

uint32_t extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool have_sse42 = __builtin_cpu_supports("sse4.2");
  if (have_sse42) return extend_sse42(crc, p, n);
#endif
  return extend_portable(crc, p, n);
}

}  // namespace longhaul::crc32c
