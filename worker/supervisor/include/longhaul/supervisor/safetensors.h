// The safetensors file format (https://github.com/huggingface/safetensors), written and read
// exactly, so that Python's `safetensors`, PyTorch and Hugging Face load longhaul checkpoints and
// longhaul loads theirs.
//
// Layout: 8-byte little-endian N, then N bytes of UTF-8 JSON padded with spaces so that 8 + N is
// a multiple of 8, then the data. The JSON object maps each tensor name to
// {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets relative to the data
// section), plus an optional "__metadata__" object of string -> string. Tensors are laid out
// contiguously in offset order with no gaps and cover the whole data section.
//
// Checksums (longhaul's addition, invisible to other readers): `__metadata__["crc32c"]` holds a
// JSON object, serialised as a string, mapping every tensor name to the 8-hex-digit CRC-32C of
// its bytes, e.g. {"wte.weight":"1a2b3c4d", ...}; `__metadata__["metadata_crc32c"]` covers every
// other metadata value (a mismatch is DataLoss at open, so the checkpoint is skipped like one
// with a bad tensor). The writer also sets `__metadata__["format"]`
// to "pt" unless given, because Hugging Face transformers refuses files without it.
//
// Thread-safety: write_safetensors is reentrant. A SafetensorsReader is immutable after
// construction; its const members (data(), verify_all(), ...) may be called concurrently.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longhaul/base/file.h"
#include "longhaul/supervisor/training_state.h"

namespace longhaul::supervisor {

// The metadata key holding the per-tensor CRC-32C map.
inline constexpr std::string_view kCrc32cMetadataKey = "crc32c";
// The metadata key holding the CRC-32C of every other metadata entry (metadata_crc32c()), so a
// flipped bit in the step or the data position is corruption, like one in a tensor. Readers
// verify it when present (files of older longhaul versions and other tools have none).
inline constexpr std::string_view kMetadataCrc32cKey = "metadata_crc32c";

// CRC-32C of `key \0 value \0` for every entry in key order, except kMetadataCrc32cKey.
uint32_t metadata_crc32c(const std::map<std::string, std::string>& metadata);

// One tensor to write: its spec and its bytes (bytes.size() must equal spec.nbytes()).
struct TensorView {
  const TensorSpec* spec;
  std::span<const std::byte> bytes;
};

// Where a write_safetensors call's time went (seconds, steady clock), for benchmarks.
struct SafetensorsWriteTimes {
  double total_seconds = 0;   // the whole call
  double header_seconds = 0;  // building the JSON header (twice: placeholder, then checksums)
  // In-line checksums (a state under 16 MiB): their time on the writing thread. A larger state
  // is checksummed on a helper thread: its CPU time, and how long the writing thread waited for
  // it after writing the last byte.
  double checksum_seconds = 0;
  double checksum_wait_seconds = 0;
  int64_t checksum_sleeps = 0;  // how often the helper slept waiting for the writer (wake-ups)
  file::WriteTimes file;        // write syscalls, writeback pacing, fsync, rename + directory fsync
};

// Writes `tensors` (in the given order) with `metadata` to `path` through file::AtomicFile:
// temp file, fsync, rename, fsync dir. Adds the crc32c and format keys to the metadata.
// Returns the file size. Throws InvalidArgument for a size mismatch or duplicate name (naming
// the tensor), errno-mapped errors for I/O. `before_rename`, when set, is called after the fsync
// and just before the rename (a fence: what it throws propagates, and nothing is renamed).
// `times`, when set, receives where the time went (filled on success).
uint64_t write_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::function<void()>& before_rename = {},
                           SafetensorsWriteTimes* times = nullptr);
// Writes a whole Snapshot; adds `__metadata__["global_step"]` = snapshot.step.
uint64_t write_safetensors(const std::filesystem::path& path, const Snapshot& snapshot,
                           const std::function<void()>& before_rename = {},
                           SafetensorsWriteTimes* times = nullptr);

// A memory-mapped, validated safetensors file. The constructor checks the whole structure
// (header length, JSON, dtypes, shapes, offsets: contiguous, no gaps, no overlap, covering the
// file) and throws DataLoss naming the file and the defect. Tensor bytes are checked against
// their CRC-32C lazily, on first data() of each tensor, or all at once by verify_all().
class SafetensorsReader : public TensorSource {
 public:
  struct Options {
    // When true, every tensor must have a checksum (longhaul checkpoints); when false, tensors
    // without one are returned unchecked (files written by other tools, e.g. Hugging Face's).
    bool require_checksums = false;
  };

  // Throws NotFound / PermissionDenied when the file cannot be opened, DataLoss when malformed.
  explicit SafetensorsReader(std::filesystem::path path);
  SafetensorsReader(std::filesystem::path path, Options options);
  ~SafetensorsReader() override;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const override { return path_; }
  bool contains(std::string_view name) const override;
  std::vector<std::string> tensor_names() const override;  // in file (offset) order
  const TensorSpec& spec(std::string_view name) const override;
  std::span<const std::byte> data(std::string_view name) const override;
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

  // Checks every tensor's CRC-32C; throws DataLoss naming the first bad tensor and the file.
  void verify_all() const;
  // The specs in file order.
  std::vector<TensorSpec> specs() const;
  // __metadata__["global_step"] parsed, or -1 when absent.
  int64_t global_step() const;
  uint64_t file_size() const { return size_; }

 private:
  struct Entry {
    TensorSpec spec;
    uint64_t begin = 0;  // absolute file offsets
    uint64_t end = 0;
    bool has_crc = false;
    uint32_t crc = 0;
  };
  const Entry& entry(std::string_view name) const;
  void verify(size_t index) const;

  // The constructor's steps; each throws DataLoss naming the file and what is wrong.
  void map_file();          // path_ -> map_, size_ (a regular file)
  uint64_t parse_header();  // -> metadata_, entries_ by offset; returns where the data starts
  void check_tensors_tile_data(uint64_t data_start) const;  // no gap, no overlap, no tail
  // -> index_; each entry's CRC-32C from `crcs` (required with options_.require_checksums).
  void index_tensors(const std::map<std::string, uint32_t, std::less<>>& crcs);

  std::string path_;
  Options options_;
  const std::byte* map_ = nullptr;
  uint64_t size_ = 0;
  std::vector<Entry> entries_;                        // file order
  std::map<std::string, size_t, std::less<>> index_;  // name -> entries_ index
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<std::atomic<bool>[]> verified_;
};

// Compares what a TrainingState expects with what a checkpoint holds. Throws FailedPrecondition
// naming the first tensor (in `expected` order) that is missing from `source` or whose dtype or
// shape differs, e.g. "checkpoint runs/x/model.ckpt-100.safetensors does not match the model:
// tensor transformer.h.0.attn.c_attn.weight has shape [768, 2304] in the checkpoint but the model
// expects [512, 1536]; ...". Extra tensors in the checkpoint are allowed.
void check_compatible(const std::vector<TensorSpec>& expected, const TensorSource& source);

// "[768, 2304]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace longhaul::supervisor
