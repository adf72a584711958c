// `longhaul-worker inspect LOGDIR`: checkpoints (step, size, validity), the state file's latest,
// events files, and what a restart would restore. Reads only; never modifies the logdir.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <regex>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/supervisor/async_checkpointer.h"
#include "longhaul/supervisor/checkpoint_state.h"
#include "longhaul/supervisor/safetensors.h"

namespace longhaul::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

json tensor_list(const supervisor::SafetensorsReader& r) {
  json tensors = json::array();
  for (const auto& spec : r.specs()) {
    tensors.push_back({{"name", spec.name},
                       {"dtype", std::string(supervisor::dtype_name(spec.dtype))},
                       {"shape", spec.shape}});
  }
  return tensors;
}

// The state file: whether it exists, what it names (or why it could not be read). `listed`
// receives every checkpoint it lists.
json read_state_file(const fs::path& logdir, std::vector<std::string>& listed) {
  json state = {{"exists", fs::exists(logdir / supervisor::kCheckpointStateFile)}};
  try {
    if (auto st = supervisor::read_checkpoint_state(logdir)) {
      state["latest"] = st->model_checkpoint_path;
      state["all"] = st->all_model_checkpoint_paths;
      listed = st->all_model_checkpoint_paths;
    }
  } catch (const Error& e) {
    state["error"] = e.what();
  }
  return state;
}

// One checkpoint file, verified (structure and every checksum).
json checkpoint_entry(const fs::path& path, int64_t step, const std::vector<std::string>& listed) {
  std::error_code ec;
  json c = {{"file", path.filename().string()},
            {"step", step},
            {"bytes", fs::file_size(path, ec)},
            {"listed", std::find(listed.begin(), listed.end(),
                                 supervisor::checkpoint_prefix_for(path)) != listed.end()}};
  try {
    supervisor::SafetensorsReader r(
        path, supervisor::SafetensorsReader::Options{.require_checksums = true});
    r.verify_all();
    c["valid"] = true;
    c["tensors"] = r.specs().size();
  } catch (const Error& e) {
    c["valid"] = false;
    c["error"] = e.what();
  }
  return c;
}

// out["checkpoints"] (every checkpoint file, verified, by step) and out["events_files"].
void list_files(const fs::path& logdir, const std::vector<std::string>& listed, json& out) {
  const std::regex ckpt_re(R"(model\.ckpt-(\d+)\.safetensors)");
  const std::regex events_re(R"(events\.out\.tfevents\..*)");
  json checkpoints = json::array();
  json events = json::array();
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(logdir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::error_code ec;
  for (const auto& path : files) {
    const std::string name = path.filename().string();
    std::smatch m;
    if (std::regex_match(name, m, ckpt_re)) {
      checkpoints.push_back(checkpoint_entry(path, std::stoll(m[1].str()), listed));
    } else if (std::regex_match(name, events_re)) {
      events.push_back({{"file", name}, {"bytes", fs::file_size(path, ec)}});
    }
  }
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const json& a, const json& b) { return a["step"] < b["step"]; });
  out["checkpoints"] = checkpoints;
  out["events_files"] = events;
}

// What a restart would restore, by the supervisor's own rule: out["latest_step"], "restore",
// "skipped", and "restart" (what `train` would do, as Supervisor::prepare_chief: restore, start
// from scratch, or refuse).
void plan_restart(const fs::path& logdir, bool with_tensors, json& out) {
  supervisor::CheckpointManagerOptions mo;
  mo.logdir = logdir;
  mo.remove_temp_files = false;
  supervisor::CheckpointManager manager(mo);
  if (auto latest = manager.latest()) {
    out["latest_step"] = supervisor::checkpoint_step(latest->filename().string()).value_or(-1);
  }
  std::vector<fs::path> skipped;
  if (auto reader = manager.latest_valid(&skipped)) {
    json restore = {{"file", fs::path(reader->path()).filename().string()},
                    {"step", reader->global_step()}};
    json md = json::object();
    for (const auto& [k, v] : reader->metadata()) {
      if (k != supervisor::kCrc32cMetadataKey && k != supervisor::kMetadataCrc32cKey) md[k] = v;
    }
    restore["metadata"] = md;
    if (with_tensors) restore["tensors"] = tensor_list(*reader);
    out["restore"] = restore;
  } else {
    out["restore"] = nullptr;
  }
  json skipped_names = json::array();
  for (const auto& s : skipped) skipped_names.push_back(s.filename().string());
  out["skipped"] = skipped_names;
  out["restart"] = !out["restore"].is_null() ? "restore" : skipped.empty() ? "scratch" : "fail";
}

// The human table of the state file, the checkpoints and the events files.
void print_files(const json& out) {
  const json& state = out["state_file"];
  std::cout << "logdir " << out["logdir"].get<std::string>() << "\n";
  if (!state["exists"].get<bool>()) {
    std::cout << "state file: none\n";
  } else if (state.contains("error")) {
    std::cout << "state file: GARBLED (" << state["error"].get<std::string>() << ")\n";
  } else {
    std::cout << "state file: latest " << state.value("latest", std::string("<none>")) << ", "
              << state.value("all", json::array()).size() << " listed\n";
  }
  const json& checkpoints = out["checkpoints"];
  std::cout << "checkpoints (" << checkpoints.size() << "):\n";
  std::printf("  %10s  %10s  %-6s  %-5s  %s\n", "STEP", "SIZE", "LISTED", "VALID", "FILE");
  for (const auto& c : checkpoints) {
    std::printf("  %10lld  %10s  %-6s  %-5s  %s%s\n", c["step"].get<long long>(),
                human_bytes(c["bytes"].get<uint64_t>()).c_str(),
                c["listed"].get<bool>() ? "yes" : "no", c["valid"].get<bool>() ? "ok" : "NO",
                c["file"].get<std::string>().c_str(),
                c.contains("error") ? ("  (" + c["error"].get<std::string>() + ")").c_str() : "");
  }
  if (out.contains("latest_step")) std::cout << "latest step: " << out["latest_step"] << "\n";
  std::cout << "events files (" << out["events_files"].size() << "):\n";
  for (const auto& e : out["events_files"]) {
    std::printf("  %10s  %s\n", human_bytes(e["bytes"].get<uint64_t>()).c_str(),
                e["file"].get<std::string>().c_str());
  }
}

// The human sentence of what a restart would do, with the metadata (and tensors) it would
// restore.
void print_restart(const json& out, bool with_tensors) {
  const json& skipped = out["skipped"];
  if (out["restore"].is_null() && !skipped.empty()) {
    std::cout << "a restart would FAIL (exit 4): every checkpoint is corrupt or truncated ("
              << skipped.dump()
              << "); move them away to start from scratch, or restore one from a copy\n";
    return;
  }
  if (out["restore"].is_null()) {
    std::cout << "a restart would start from scratch (no valid checkpoint)\n";
    return;
  }
  const auto& r = out["restore"];
  std::cout << "a restart would restore " << r["file"].get<std::string>() << " (step " << r["step"]
            << ")";
  if (!skipped.empty()) std::cout << ", skipping " << skipped.dump();
  std::cout << "\n";
  for (const auto& [k, v] : r["metadata"].items()) {
    std::cout << "  " << k << ": " << v.get<std::string>() << "\n";
  }
  if (with_tensors) {
    for (const auto& t : r["tensors"]) {
      std::cout << "  tensor " << t["name"].get<std::string>() << " "
                << t["dtype"].get<std::string>() << " " << t["shape"].dump() << "\n";
    }
  }
}

}  // namespace

int run_inspect(const InspectArgs& args) {
  const fs::path logdir = args.logdir;
  std::error_code ec;
  if (!fs::is_directory(logdir, ec)) {
    throw InvalidArgument("logdir " + logdir.string() + " does not exist or is not a directory");
  }
  json out;
  out["logdir"] = logdir.string();
  std::vector<std::string> listed;
  out["state_file"] = read_state_file(logdir, listed);
  list_files(logdir, listed, out);
  plan_restart(logdir, args.tensors, out);

  if (args.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    print_files(out);
    print_restart(out, args.tensors);
  }
  return kExitFinished;
}

}  // namespace longhaul::cli
