#include "longhaul/supervisor/checkpoint_state.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/strings.h"

namespace longhaul::supervisor {
namespace {

// A state file lists paths and timestamps: even 100,000 checkpoints fit in 16 MiB.
constexpr uint64_t kMaxStateFileBytes = uint64_t{16} << 20;

// A text-format string literal (C escapes, octal for control bytes), as TensorFlow writes it.
std::string escape(std::string_view s) {
  std::string out;
  append_quoted(out, s, ControlEscape::kOctal);
  return out;
}

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

[[noreturn]] void garbled(std::string_view source, int line, const std::string& what) {
  throw DataLoss("checkpoint state file " + std::string(source) + " is garbled at line " +
                 std::to_string(line) + ": " + what +
                 "; it will be rebuilt from the checkpoints in the directory");
}

// Parses a text-format string literal (double or single quoted, C escapes incl. octal/hex).
bool parse_string(std::string_view v, std::string& out) {
  if (v.size() < 2) return false;
  char q = v.front();
  if ((q != '"' && q != '\'') || v.back() != q) return false;
  out.clear();
  for (size_t i = 1; i + 1 < v.size(); ++i) {
    char c = v[i];
    if (c == q) return false;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i + 1 > v.size() - 1) return false;
    char e = v[i];
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case '\\':
        out += '\\';
        break;
      case '"':
        out += '"';
        break;
      case '\'':
        out += '\'';
        break;
      case 'x': {
        int val = 0, digits = 0;
        while (digits < 2 && i + 1 < v.size() - 1 &&
               std::isxdigit(static_cast<unsigned char>(v[i + 1]))) {
          char h = v[++i];
          val = val * 16 + (std::isdigit(static_cast<unsigned char>(h))
                                ? h - '0'
                                : (std::tolower(h) - 'a' + 10));
          ++digits;
        }
        if (digits == 0) return false;
        out += static_cast<char>(val);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int val = e - '0', digits = 1;
          while (digits < 3 && i + 1 < v.size() - 1 && v[i + 1] >= '0' && v[i + 1] <= '7') {
            val = val * 8 + (v[++i] - '0');
            ++digits;
          }
          out += static_cast<char>(val);
        } else {
          return false;
        }
    }
  }
  return true;
}

bool parse_double(std::string_view v, double& out) {
  if (v.empty()) return false;
  if (v == "inf" || v == "infinity") {
    out = INFINITY;
    return true;
  }
  auto r = std::from_chars(v.data(), v.data() + v.size(), out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

}  // namespace

std::string CheckpointState::to_text() const {
  std::string out;
  out += "model_checkpoint_path: " + escape(model_checkpoint_path) + "\n";
  for (const auto& p : all_model_checkpoint_paths) {
    out += "all_model_checkpoint_paths: " + escape(p) + "\n";
  }
  for (double t : all_model_checkpoint_timestamps) {
    out += "all_model_checkpoint_timestamps: " + format_double(t) + "\n";
  }
  out += "last_preserved_timestamp: " + format_double(last_preserved_timestamp) + "\n";
  return out;
}

CheckpointState CheckpointState::parse(std::string_view text, std::string_view source) {
  CheckpointState state;
  int line_no = 0;
  bool any_field = false;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) garbled(source, line_no, "expected `field: value`");
    std::string_view key = trim(line.substr(0, colon));
    std::string_view value = trim(line.substr(colon + 1));
    for (char c : key) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
        // Quote at most 40 printable characters: the file may be binary garbage.
        std::string shown;
        for (char k : key.substr(0, 40)) {
          shown += std::isprint(static_cast<unsigned char>(k)) ? k : '?';
        }
        garbled(source, line_no,
                "\"" + shown + (key.size() > 40 ? "..." : "") + "\" is not a field name");
      }
    }
    any_field = true;
    if (key == "model_checkpoint_path" || key == "all_model_checkpoint_paths") {
      std::string s;
      if (!parse_string(value, s)) garbled(source, line_no, "bad string for " + std::string(key));
      if (key == "model_checkpoint_path") {
        state.model_checkpoint_path = s;
      } else {
        state.all_model_checkpoint_paths.push_back(s);
      }
    } else if (key == "all_model_checkpoint_timestamps" || key == "last_preserved_timestamp") {
      double d = 0;
      if (!parse_double(value, d)) garbled(source, line_no, "bad number for " + std::string(key));
      if (key == "last_preserved_timestamp") {
        state.last_preserved_timestamp = d;
      } else {
        state.all_model_checkpoint_timestamps.push_back(d);
      }
    }
    // Unknown fields are tolerated (newer TF versions add some).
  }
  if (!any_field) garbled(source, line_no, "the file holds no fields");
  if (!state.all_model_checkpoint_timestamps.empty() &&
      state.all_model_checkpoint_timestamps.size() != state.all_model_checkpoint_paths.size()) {
    garbled(source, line_no,
            std::to_string(state.all_model_checkpoint_paths.size()) + " paths but " +
                std::to_string(state.all_model_checkpoint_timestamps.size()) + " timestamps");
  }
  return state;
}

std::optional<CheckpointState> read_checkpoint_state(const std::filesystem::path& logdir) {
  auto path = logdir / kCheckpointStateFile;
  std::string text;
  try {
    text = file::read_file(path, kMaxStateFileBytes);
  } catch (const NotFound&) {
    return std::nullopt;
  } catch (const InvalidArgument& e) {  // not a regular file, or absurdly large
    throw DataLoss("checkpoint state file " + path.string() + " cannot be used: " + e.what() +
                   "; it will be rebuilt from the checkpoints in the directory");
  }
  return CheckpointState::parse(text, path.string());
}

void write_checkpoint_state(const std::filesystem::path& logdir, const CheckpointState& state,
                            const std::function<void()>& before_rename) {
  file::write_atomically(logdir / kCheckpointStateFile, state.to_text(), before_rename);
}

std::filesystem::path checkpoint_file_for(const std::filesystem::path& logdir,
                                          std::string_view prefix) {
  std::filesystem::path p(prefix);
  if (p.is_relative()) p = logdir / p;
  if (!std::string_view(prefix).ends_with(kCheckpointExtension))
    p += std::string(kCheckpointExtension);
  return p;
}

std::string checkpoint_prefix_for(const std::filesystem::path& file) {
  std::string name = file.filename().string();
  if (std::string_view(name).ends_with(kCheckpointExtension)) {
    name.resize(name.size() - kCheckpointExtension.size());
  }
  return name;
}

std::optional<int64_t> checkpoint_step(std::string_view name, std::string_view basename) {
  auto slash = name.find_last_of('/');
  if (slash != std::string_view::npos) name.remove_prefix(slash + 1);
  if (name.ends_with(kCheckpointExtension)) name.remove_suffix(kCheckpointExtension.size());
  if (!name.starts_with(basename) || name.size() <= basename.size() + 1 ||
      name[basename.size()] != '-') {
    return std::nullopt;
  }
  name.remove_prefix(basename.size() + 1);
  int64_t step = 0;
  auto r = std::from_chars(name.data(), name.data() + name.size(), step);
  if (r.ec != std::errc() || r.ptr != name.data() + name.size() || step < 0) return std::nullopt;
  return step;
}

}  // namespace longhaul::supervisor
