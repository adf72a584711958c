// CheckpointManager: commit, retention and the latest valid checkpoint. See checkpoint_manager.h.
#include "longhaul/supervisor/checkpoint_manager.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <system_error>

#include <sys/stat.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"

namespace longhaul::supervisor {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double mtime_seconds(const std::filesystem::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

std::filesystem::path normal_dir(const std::filesystem::path& p) {
  std::error_code ec;
  auto c = std::filesystem::weakly_canonical(p, ec);
  if (ec) c = std::filesystem::absolute(p, ec).lexically_normal();
  if (!c.empty() && !c.has_filename()) c = c.parent_path();  // "a/b/" -> "a/b"
  return c;
}

// The state file, or nullopt when it is missing or garbled; a garbled one is logged with what
// the caller does instead.
std::optional<CheckpointState> read_state_or_warn(const std::filesystem::path& logdir,
                                                  std::string_view instead) {
  try {
    return read_checkpoint_state(logdir);
  } catch (const DataLoss& e) {
    LH_LOG(WARNING) << "checkpoint state file is garbled; " << instead << kv("error", e.what());
    return std::nullopt;
  }
}

// The state file's contents for a list of checkpoints (oldest first): the last one is the latest.
CheckpointState state_of(const std::vector<CheckpointEntry>& entries,
                         double last_preserved_timestamp) {
  CheckpointState state;
  for (const auto& e : entries) {
    state.all_model_checkpoint_paths.push_back(checkpoint_prefix_for(e.file));
    state.all_model_checkpoint_timestamps.push_back(e.timestamp);
  }
  if (!entries.empty()) state.model_checkpoint_path = checkpoint_prefix_for(entries.back().file);
  state.last_preserved_timestamp = last_preserved_timestamp;
  return state;
}

}  // namespace

bool CheckpointManager::owns(const std::filesystem::path& file) const {
  const auto step = checkpoint_step(file.filename().string(), options_.basename);
  if (!step || file.filename() != file_for_step(*step).filename()) return false;
  return normal_dir(file.parent_path()) == normal_dir(options_.logdir);
}

CheckpointManager::CheckpointManager(CheckpointManagerOptions options)
    : options_(std::move(options)) {
  if (options_.logdir.empty()) throw InvalidArgument("CheckpointManager needs a logdir");
  if (options_.basename.empty()) throw InvalidArgument("checkpoint basename must not be empty");
  if (options_.max_to_keep < 0) throw InvalidArgument("max_to_keep must be >= 0");
  if (options_.remove_temp_files) {
    file::ensure_writable_directory(options_.logdir, "logdir");
    remove_temp_files();
  }
  load_state();
}

std::filesystem::path CheckpointManager::file_for_step(int64_t step) const {
  return options_.logdir /
         (options_.basename + "-" + std::to_string(step) + std::string(kCheckpointExtension));
}

void CheckpointManager::remove_temp_files() {
  std::error_code ec;
  std::string ckpt_prefix = options_.basename + "-";
  std::string state_prefix = std::string(kCheckpointStateFile) + ".tmp.";
  bool removed = false;
  for (const auto& de : std::filesystem::directory_iterator(options_.logdir, ec)) {
    std::string name = de.path().filename().string();
    bool ckpt_tmp = name.starts_with(ckpt_prefix) &&
                    name.find(std::string(kCheckpointExtension) + ".tmp.") != std::string::npos;
    if (ckpt_tmp || name.starts_with(state_prefix)) {
      LH_LOG(INFO) << "removing temp file left by an interrupted checkpoint"
                   << kv("file", de.path().string());
      std::filesystem::remove(de.path(), ec);
      removed = true;
    }
  }
  if (removed) file::fsync_directory(options_.logdir);
}

void CheckpointManager::warn_foreign(std::string_view prefix,
                                     const std::filesystem::path& file) const {
  LH_LOG(WARNING) << "the checkpoint state file names a file outside the logdir or not named like "
                     "this run's checkpoints; it is left alone (never deleted) and dropped from "
                     "the rotation"
                  << kv("entry", std::string(prefix)) << kv("file", file.string())
                  << kv("logdir", options_.logdir.string());
}

std::vector<CheckpointEntry> CheckpointManager::scan_directory() const {
  std::vector<CheckpointEntry> found;
  std::error_code ec;
  for (const auto& de : std::filesystem::directory_iterator(options_.logdir, ec)) {
    std::string name = de.path().filename().string();
    if (!name.ends_with(kCheckpointExtension)) continue;
    auto step = checkpoint_step(name, options_.basename);
    if (!step) continue;
    std::error_code type_ec;
    if (!de.is_regular_file(type_ec)) {  // a folder or FIFO named like a checkpoint is not one
      LH_LOG(WARNING) << "ignoring an entry named like a checkpoint that is not a regular file"
                      << kv("path", de.path().string());
      continue;
    }
    found.push_back(CheckpointEntry{de.path(), *step, mtime_seconds(de.path())});
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  return found;
}

void CheckpointManager::load_state() {
  const std::optional<CheckpointState> state =
      read_state_or_warn(options_.logdir, "rebuilding it from a directory scan");
  MutexLock lock(mu_);
  entries_.clear();
  if (state) {
    last_preserved_timestamp_ = state->last_preserved_timestamp;
    for (size_t i = 0; i < state->all_model_checkpoint_paths.size(); ++i) {
      const auto& prefix = state->all_model_checkpoint_paths[i];
      auto file = checkpoint_file_for(options_.logdir, prefix);
      if (!owns(file)) {
        warn_foreign(prefix, file);
        continue;
      }
      double ts = i < state->all_model_checkpoint_timestamps.size()
                      ? state->all_model_checkpoint_timestamps[i]
                      : mtime_seconds(file);
      entries_.push_back(
          CheckpointEntry{file, checkpoint_step(prefix, options_.basename).value_or(-1), ts});
    }
    // model_checkpoint_path is the latest even if a hand-edited file lists it elsewhere.
    if (!state->model_checkpoint_path.empty() &&
        owns(checkpoint_file_for(options_.logdir, state->model_checkpoint_path))) {
      auto latest = checkpoint_file_for(options_.logdir, state->model_checkpoint_path);
      auto it = std::find_if(entries_.begin(), entries_.end(),
                             [&](const auto& e) { return e.file == latest; });
      CheckpointEntry e{
          latest, checkpoint_step(state->model_checkpoint_path, options_.basename).value_or(-1),
          mtime_seconds(latest)};
      if (it != entries_.end()) {
        e = *it;
        entries_.erase(it);
      }
      entries_.push_back(e);
    }
    return;
  }
  // No usable state file: list what is on disk. Only the newest max_to_keep join the rotation;
  // older files are left alone (they may be preserved checkpoints we can no longer tell apart).
  last_preserved_timestamp_ = now_seconds();
  auto found = scan_directory();
  size_t keep = options_.max_to_keep == 0 ? found.size()
                                          : std::min(found.size(), size_t(options_.max_to_keep));
  entries_.assign(found.end() - static_cast<std::ptrdiff_t>(keep), found.end());
  if (!found.empty()) {
    LH_LOG(INFO) << "no usable checkpoint state file; found checkpoints by directory scan"
                 << kv("logdir", options_.logdir.string()) << kv("count", found.size());
  }
}

std::filesystem::path CheckpointManager::save(const Snapshot& snapshot, double wall_time,
                                              SaveTimes* times) {
  const auto started = std::chrono::steady_clock::now();
  if (wall_time < 0) wall_time = now_seconds();
  auto path = file_for_step(snapshot.step);
  SafetensorsWriteTimes data_times;
  write_safetensors(path, snapshot, options_.fence,
                    &data_times);  // fsynced, fenced, renamed, dir fsynced

  // The new list is worked out on a copy and published only once the state file naming it is
  // committed: readers see the previous list meanwhile, and keep it if the write fails.
  MutexLock saving(save_mu_);
  std::vector<CheckpointEntry> entries;
  double last_preserved = 0;
  {
    MutexLock lock(mu_);
    entries = entries_;
    last_preserved = last_preserved_timestamp_;
  }
  entries.erase(
      std::remove_if(entries.begin(), entries.end(), [&](const auto& e) { return e.file == path; }),
      entries.end());
  entries.push_back(CheckpointEntry{path, snapshot.step, wall_time});
  // Retention: TF's CheckpointManager._sweep.
  std::vector<std::filesystem::path> to_delete;
  if (options_.max_to_keep > 0) {
    while (entries.size() > static_cast<size_t>(options_.max_to_keep)) {
      CheckpointEntry oldest = entries.front();
      entries.erase(entries.begin());
      double n_hours = options_.keep_checkpoint_every_n_hours;
      if (n_hours > 0 && oldest.timestamp - n_hours * 3600.0 >= last_preserved) {
        last_preserved = oldest.timestamp;
        LH_LOG(INFO) << "preserving checkpoint (keep_checkpoint_every_n_hours)"
                     << kv("file", oldest.file.string());
        continue;
      }
      to_delete.push_back(oldest.file);
    }
  }
  const CheckpointState state = state_of(entries, last_preserved);
  const auto state_started = std::chrono::steady_clock::now();
  if (options_.state_writer) {
    if (options_.fence) options_.fence();
    options_.state_writer(options_.logdir, state);
  } else {
    write_checkpoint_state(options_.logdir, state, options_.fence);
  }
  {
    MutexLock lock(mu_);
    entries_ = std::move(entries);
    last_preserved_timestamp_ = last_preserved;
  }
  // Delete only after the state file stopped naming them, and only our own files (load_state
  // keeps foreign ones out of the rotation; this is the last line of defence).
  const auto committed = std::chrono::steady_clock::now();
  // A writer whose lease was taken over must not delete what the new writer's state file lists.
  if (!to_delete.empty() && options_.fence) options_.fence();
  std::error_code ec;
  for (const auto& f : to_delete) {
    if (f == path || !owns(f)) continue;
    std::filesystem::remove(f, ec);
    if (ec) {
      LH_LOG(WARNING) << "cannot delete old checkpoint" << kv("file", f.string())
                      << kv("error", ec.message());
    }
  }
  if (!to_delete.empty()) file::fsync_directory(options_.logdir);
  if (times != nullptr) {
    times->commit_seconds = std::chrono::duration<double>(committed - started).count();
    times->data = data_times;
    times->state_file_seconds = std::chrono::duration<double>(committed - state_started).count();
    times->retention_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - committed).count();
  }
  return path;
}

std::optional<std::filesystem::path> CheckpointManager::latest() const {
  MutexLock lock(mu_);
  if (entries_.empty()) return std::nullopt;
  return entries_.back().file;
}

std::vector<CheckpointEntry> CheckpointManager::checkpoints() const {
  MutexLock lock(mu_);
  return entries_;
}

CheckpointState CheckpointManager::state() const {
  MutexLock lock(mu_);
  return state_of(entries_, last_preserved_timestamp_);
}

std::unique_ptr<SafetensorsReader> CheckpointManager::latest_valid(
    std::vector<std::filesystem::path>* skipped) const {
  // Re-read the state file: another process (the chief) may have written it since.
  std::vector<std::filesystem::path> candidates;
  const std::optional<CheckpointState> state =
      read_state_or_warn(options_.logdir, "looking for checkpoints by directory scan");
  std::set<std::filesystem::path> seen;
  auto add = [&](const std::filesystem::path& p) {
    if (seen.insert(p).second) candidates.push_back(p);
  };
  if (state) {
    if (!state->model_checkpoint_path.empty()) {
      add(checkpoint_file_for(options_.logdir, state->model_checkpoint_path));
    }
    for (auto it = state->all_model_checkpoint_paths.rbegin();
         it != state->all_model_checkpoint_paths.rend(); ++it) {
      add(checkpoint_file_for(options_.logdir, *it));
    }
  }
  auto found = scan_directory();
  for (auto it = found.rbegin(); it != found.rend(); ++it) add(it->file);

  for (const auto& file : candidates) {
    try {
      auto reader = std::make_unique<SafetensorsReader>(
          file, SafetensorsReader::Options{.require_checksums = true});
      reader->verify_all();
      return reader;
    } catch (const Error& e) {
      LH_LOG(WARNING) << "skipping checkpoint that cannot be restored; trying an older one"
                      << kv("file", file.string()) << kv("error", e.what());
      if (skipped != nullptr) skipped->push_back(file);
    }
  }
  return nullptr;
}

}  // namespace longhaul::supervisor
