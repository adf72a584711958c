// The `<logdir>/training.done` marker: the chief writes it (atomically) once training reached
// max_steps and the final checkpoint is committed; its text is the final step. The evaluator
// ends after evaluating that step. The chief removes a stale marker when a session starts (a
// run continued with a larger max_steps).
//
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

namespace longhaul::dist {

inline constexpr std::string_view kTrainingDoneFile = "training.done";

void write_training_done(const std::filesystem::path& logdir, int64_t final_step);
// Never throws.
void clear_training_done(const std::filesystem::path& logdir);
// The final step, or nullopt when there is no (readable) marker.
std::optional<int64_t> read_training_done(const std::filesystem::path& logdir);

}  // namespace longhaul::dist
