// Token shards in the llm.c format, the on-disk form of training and validation data.
//
// A shard is a 1024-byte header of 256 little-endian int32 — [0] magic 20240520, [1] version 1,
// [2] token count, the rest zero — followed by that many uint16 tokens. Files written by
// llm.c's data scripts and by `longhaul-worker prepare-data` are interchangeable.
//
// write_shard() commits with the AtomicFile protocol, so a crash never leaves a torn shard.
// TokenShard maps a shard read-only and validates the header against the file size; every
// error names the file and says what to do.
//
// Thread-safety: a TokenShard is immutable after construction; its tokens may be read from any
// number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Writes `tokens` as a shard at `path` (temp file, fsync, rename, fsync dir). Throws
// PermissionDenied/NotFound/Unavailable naming the file when it cannot be written.
void write_shard(const std::filesystem::path& path, std::span<const uint16_t> tokens);

// A read-only memory map of one shard.
class TokenShard {
 public:
  // Opens and validates `path`. Throws NotFound/PermissionDenied when it cannot be opened,
  // InvalidArgument for a wrong magic or version, DataLoss when the token count in the header
  // disagrees with the file size (truncated or trailing bytes). Messages name the file.
  explicit TokenShard(std::filesystem::path path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::span<const uint16_t> tokens() const { return {tokens_, num_tokens_}; }
  size_t size() const { return num_tokens_; }

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  size_t num_tokens_ = 0;
};

// Expands a glob ("data/train_*.bin"; a plain path is a glob matching itself) into the sorted
// list of matching regular files. Throws NotFound naming the pattern when nothing matches.
std::vector<std::filesystem::path> expand_glob(std::string_view pattern);

}  // namespace longhaul::data
