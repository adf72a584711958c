// Token shard writer (atomic) and reader (mmap); see token_shard.h for the format.
#include "longhaul/data/token_shard.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"

namespace longhaul::data {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; a big-endian host needs byte swapping");

void write_shard(const std::filesystem::path& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw InvalidArgument("shard " + path.string() + ": " + std::to_string(tokens.size()) +
                          " tokens do not fit the int32 token count of the header; use a "
                          "smaller shard size");
  }
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  file::AtomicFile out(path);
  out.write(header.data(), kShardHeaderBytes);
  out.write(tokens.data(), tokens.size_bytes());
  out.commit();
}

namespace {

// The header of the shard `name` of `file_bytes` bytes: llm.c's magic and version, and a token
// count that accounts for every byte after the header. Returns the count.
size_t check_header(const std::string& name, const int32_t (&header)[3], size_t file_bytes) {
  if (header[0] != kShardMagic) {
    throw InvalidArgument("token shard " + name + " has magic " + std::to_string(header[0]) +
                          ", expected " + std::to_string(kShardMagic) +
                          " (llm.c token shard format): is it a token shard? Make shards with "
                          "`longhaul-worker prepare-data`");
  }
  if (header[1] != kShardVersion) {
    throw InvalidArgument("token shard " + name + " has version " + std::to_string(header[1]) +
                          ", this build reads version " + std::to_string(kShardVersion) +
                          " (uint16 tokens); re-create it with `longhaul-worker prepare-data`");
  }
  if (header[2] < 0) {
    throw DataLoss("token shard " + name + " has a negative token count " +
                   std::to_string(header[2]) + " in its header: the file is corrupt");
  }
  const size_t expected = kShardHeaderBytes + static_cast<size_t>(header[2]) * sizeof(uint16_t);
  if (file_bytes < expected) {
    throw DataLoss("token shard " + name + " is truncated: its header promises " +
                   std::to_string(header[2]) + " tokens (" + std::to_string(expected) +
                   " bytes) but the file has " + std::to_string(file_bytes) +
                   " bytes; re-create or re-copy it");
  }
  if (file_bytes > expected) {
    throw DataLoss("token shard " + name + " has " + std::to_string(file_bytes - expected) +
                   " bytes after the " + std::to_string(header[2]) +
                   " tokens its header promises: the file is corrupt; re-create it");
  }
  return static_cast<size_t>(header[2]);
}

}  // namespace

TokenShard::TokenShard(std::filesystem::path path) : path_(std::move(path)) {
  const std::string name = path_.string();
  int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open token shard", name, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw_errno("cannot stat token shard", name, err);
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    throw DataLoss("token shard " + name + " is truncated: " + std::to_string(file_bytes) +
                   " bytes, smaller than the " + std::to_string(kShardHeaderBytes) +
                   "-byte header; re-create it with `longhaul-worker prepare-data`");
  }
  map_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw_errno("cannot mmap token shard", name, map_errno);
  }
  map_bytes_ = file_bytes;
  int32_t header[3];
  std::memcpy(header, map_, sizeof(header));
  try {
    num_tokens_ = check_header(name, header, file_bytes);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
  tokens_ =
      reinterpret_cast<const uint16_t*>(static_cast<const std::byte*>(map_) + kShardHeaderBytes);
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

std::vector<std::filesystem::path> expand_glob(std::string_view pattern) {
  const std::string pat(pattern);
  glob_t g{};
  int rc = ::glob(pat.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::filesystem::path> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(g.gl_pathv[i], ec)) out.emplace_back(g.gl_pathv[i]);
    }
  }
  ::globfree(&g);
  if (out.empty()) {
    throw NotFound("data glob '" + pat +
                   "' matches no files; check the path (relative paths are resolved against "
                   "the working directory) or run `longhaul-worker prepare-data`");
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace longhaul::data
