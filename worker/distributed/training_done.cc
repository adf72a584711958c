// The training.done marker. See training_done.h.
#include "longhaul/distributed/training_done.h"

#include <string>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"

namespace longhaul::dist {

void write_training_done(const std::filesystem::path& logdir, int64_t final_step) {
  file::write_atomically(logdir / kTrainingDoneFile, std::to_string(final_step) + "\n");
}

void clear_training_done(const std::filesystem::path& logdir) {
  std::error_code ec;
  std::filesystem::remove(logdir / kTrainingDoneFile, ec);
}

std::optional<int64_t> read_training_done(const std::filesystem::path& logdir) {
  std::error_code ec;
  if (!std::filesystem::exists(logdir / kTrainingDoneFile, ec)) return std::nullopt;
  try {
    const std::string text = file::read_file(logdir / kTrainingDoneFile);
    size_t used = 0;
    const long long step = std::stoll(text, &used);
    return step;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace longhaul::dist
