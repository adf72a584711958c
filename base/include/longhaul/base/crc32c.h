// CRC-32C (Castagnoli), as used by TFRecord framing and the per-tensor checksums in
// checkpoints. Uses the SSE4.2 crc32 instruction when the CPU has it (three interleaved streams,
// about 2.5x one stream on data in cache), a slicing-by-8 table otherwise; both give identical
// results.
//
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace longhaul::crc32c {

// Returns the CRC-32C of data[0, n) continuing from `crc` (the value of a previous call, or 0).
uint32_t extend(uint32_t crc, const void* data, size_t n);

// The table-driven implementation extend() falls back to without SSE4.2 (tests compare them).
uint32_t extend_portable(uint32_t crc, const void* data, size_t n);

inline uint32_t value(const void* data, size_t n) { return extend(0, data, n); }
inline uint32_t value(std::string_view s) { return extend(0, s.data(), s.size()); }

// TFRecord's masked CRC: rotate right by 15 bits and add a constant, so that a CRC of data that
// itself contains CRCs is still strong.
inline uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t unmask(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace longhaul::crc32c
