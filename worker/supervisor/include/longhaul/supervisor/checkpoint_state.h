// The `<logdir>/checkpoint` state file, in TensorFlow's CheckpointState text-proto format, so
// TensorFlow tooling and people reading the logdir see what they expect:
//
//   model_checkpoint_path: "model.ckpt-1234"
//   all_model_checkpoint_paths: "model.ckpt-1000"
//   all_model_checkpoint_paths: "model.ckpt-1234"
//   all_model_checkpoint_timestamps: 1763731200.25
//   all_model_checkpoint_timestamps: 1763731800.5
//   last_preserved_timestamp: 1763731200.25
//
// Paths are checkpoint *prefixes*, as in TF: relative to the logdir, without the file extension.
// The prefix "model.ckpt-1234" names the file `<logdir>/model.ckpt-1234.safetensors`
// (checkpoint_file_for). Absolute prefixes are accepted on read; a prefix that already ends in
// ".safetensors" is used as is. Paths are listed oldest first; timestamps (seconds since the
// epoch) are parallel to them.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::supervisor {

inline constexpr std::string_view kCheckpointStateFile = "checkpoint";
inline constexpr std::string_view kCheckpointExtension = ".safetensors";

struct CheckpointState {
  std::string model_checkpoint_path;                    // the latest; empty when none
  std::vector<std::string> all_model_checkpoint_paths;  // oldest first
  std::vector<double> all_model_checkpoint_timestamps;  // parallel to the paths (may be empty)
  double last_preserved_timestamp = 0;                  // keep_checkpoint_every_n_hours anchor

  // The text-proto form above (strings C-escaped, doubles in shortest round-trip form).
  std::string to_text() const;
  // Parses the text form. Unknown fields and comments are skipped. Throws DataLoss naming
  // `source` (the file) and the line when a known field is malformed or a line is not a field.
  static CheckpointState parse(std::string_view text, std::string_view source = "checkpoint");

  bool operator==(const CheckpointState&) const = default;
};

// Reads `<logdir>/checkpoint`: nullopt when absent; DataLoss when garbled.
std::optional<CheckpointState> read_checkpoint_state(const std::filesystem::path& logdir);
// Writes `<logdir>/checkpoint` with the AtomicFile protocol; `before_rename`, when set, is called
// just before the rename (a fence that throws when this writer may no longer commit).
void write_checkpoint_state(const std::filesystem::path& logdir, const CheckpointState& state,
                            const std::function<void()>& before_rename = {});

// "model.ckpt-1234" -> <logdir>/model.ckpt-1234.safetensors (see above).
std::filesystem::path checkpoint_file_for(const std::filesystem::path& logdir,
                                          std::string_view prefix);
// "<logdir>/model.ckpt-1234.safetensors" -> "model.ckpt-1234".
std::string checkpoint_prefix_for(const std::filesystem::path& file);
// The step of "model.ckpt-1234[.safetensors]" for `basename` "model.ckpt", or nullopt.
std::optional<int64_t> checkpoint_step(std::string_view prefix_or_file,
                                       std::string_view basename = "model.ckpt");

}  // namespace longhaul::supervisor
