// Strict YAML config loading: schema table, unknown-key suggestions, --set overrides.
#include "longhaul/trainer/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>

#include <yaml-cpp/yaml.h>

#include "longhaul/base/error.h"
#include "longhaul/base/field.h"
#include "longhaul/base/file.h"

namespace longhaul::trainer {
namespace {

enum class Kind { kScalar, kMap };

// One key of the schema. parse() returns an error text (without the key) or "".
struct Field {
  std::string key;
  Kind kind = Kind::kScalar;
  std::function<std::string(const YAML::Node&, WorkerConfig&)> parse;
  std::function<YAML::Node(const WorkerConfig&)> dump;
};

template <typename T>
using Ref = std::function<T&(WorkerConfig&)>;

std::string scalar_of(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

template <typename Int>
std::string parse_int(const YAML::Node& n, Int& out, long double min, long double max) {
  const std::string s = scalar_of(n);
  Int v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    if (!s.empty() && s[0] == '-' && min >= 0) {
      return "must be a non-negative integer, got '" + s + "'";
    }
    if (ec == std::errc::result_out_of_range) {
      return "must be an integer in [" + std::to_string(static_cast<long long>(min)) + ", " +
             std::to_string(static_cast<unsigned long long>(max)) + "], got '" + s + "'";
    }
    return "must be an integer, got '" + s + "'";
  }
  if (static_cast<long double>(v) < min || static_cast<long double>(v) > max) {
    std::string range = "must be >= " + std::to_string(static_cast<long long>(min));
    if (max < static_cast<long double>(std::numeric_limits<int64_t>::max())) {
      range = "must be in [" + std::to_string(static_cast<long long>(min)) + ", " +
              std::to_string(static_cast<long long>(max)) + "]";
    }
    return range + ", got " + s;
  }
  out = v;
  return "";
}

std::string parse_double(const YAML::Node& n, double& out, double min, double max,
                         bool min_exclusive) {
  const std::string s = scalar_of(n);
  char* end = nullptr;
  errno = 0;
  const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) {
    return "must be a number, got '" + s + "'";
  }
  if ((min_exclusive ? v <= min : v < min) || v > max) {
    std::string lo = (min_exclusive ? "(" : "[") + YAML::Node(min).Scalar();
    std::string hi =
        max == std::numeric_limits<double>::max() ? "inf)" : YAML::Node(max).Scalar() + "]";
    return "must be in " + lo + ", " + hi + ", got " + s;
  }
  out = v;
  return "";
}

Field int_field(std::string key, Ref<int64_t> ref, int64_t min,
                int64_t max = std::numeric_limits<int64_t>::max()) {
  return Field{
      std::move(key), Kind::kScalar,
      [=](const YAML::Node& n, WorkerConfig& c) {
        return parse_int(n, ref(c), static_cast<long double>(min), static_cast<long double>(max));
      },
      [=](const WorkerConfig& c) { return YAML::Node(ref(const_cast<WorkerConfig&>(c))); }};
}

Field small_int_field(std::string key, Ref<int> ref, int min, int max) {
  return Field{
      std::move(key), Kind::kScalar,
      [=](const YAML::Node& n, WorkerConfig& c) { return parse_int(n, ref(c), min, max); },
      [=](const WorkerConfig& c) { return YAML::Node(ref(const_cast<WorkerConfig&>(c))); }};
}

Field optional_int_field(std::string key, Ref<std::optional<int>> ref, int min, int max) {
  return Field{std::move(key), Kind::kScalar,
               [=](const YAML::Node& n, WorkerConfig& c) {
                 int v = 0;
                 std::string err = parse_int(n, v, min, max);
                 if (err.empty()) ref(c) = v;
                 return err;
               },
               [=](const WorkerConfig& c) {
                 const auto& v = ref(const_cast<WorkerConfig&>(c));
                 return v ? YAML::Node(*v) : YAML::Node(YAML::NodeType::Null);
               }};
}

Field uint_field(std::string key, Ref<uint64_t> ref) {
  return Field{
      std::move(key), Kind::kScalar,
      [=](const YAML::Node& n, WorkerConfig& c) {
        return parse_int(n, ref(c), 0,
                         static_cast<long double>(std::numeric_limits<uint64_t>::max()));
      },
      [=](const WorkerConfig& c) { return YAML::Node(ref(const_cast<WorkerConfig&>(c))); }};
}

Field double_field(std::string key, Ref<double> ref, double min,
                   double max = std::numeric_limits<double>::max(), bool min_exclusive = false) {
  return Field{
      std::move(key), Kind::kScalar,
      [=](const YAML::Node& n, WorkerConfig& c) {
        return parse_double(n, ref(c), min, max, min_exclusive);
      },
      [=](const WorkerConfig& c) { return YAML::Node(ref(const_cast<WorkerConfig&>(c))); }};
}

Field bool_field(std::string key, Ref<bool> ref) {
  return Field{
      std::move(key), Kind::kScalar,
      [=](const YAML::Node& n, WorkerConfig& c) -> std::string {
        std::string s = scalar_of(n);
        std::transform(s.begin(), s.end(), s.begin(), ::tolower);
        if (s == "true" || s == "yes" || s == "on") {
          ref(c) = true;
        } else if (s == "false" || s == "no" || s == "off") {
          ref(c) = false;
        } else {
          return "must be true or false, got '" + scalar_of(n) + "'";
        }
        return "";
      },
      [=](const WorkerConfig& c) { return YAML::Node(ref(const_cast<WorkerConfig&>(c))); }};
}

Field string_field(std::string key, Ref<std::string> ref, std::vector<std::string> choices = {}) {
  return Field{
      std::move(key), Kind::kScalar,
      [=](const YAML::Node& n, WorkerConfig& c) -> std::string {
        const std::string s = scalar_of(n);
        if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
          return "must be one of " + field::one_of(choices) + ", got '" + s + "'";
        }
        ref(c) = s;
        return "";
      },
      [=](const WorkerConfig& c) { return YAML::Node(ref(const_cast<WorkerConfig&>(c))); }};
}

Field string_map_field(std::string key, Ref<std::map<std::string, std::string>> ref) {
  return Field{std::move(key), Kind::kMap,
               [=](const YAML::Node& n, WorkerConfig& c) -> std::string {
                 std::map<std::string, std::string> m;
                 for (const auto& kv : n) {
                   if (!kv.second.IsScalar()) {
                     return "entry '" + kv.first.as<std::string>() + "' must map to a name";
                   }
                   m[kv.first.as<std::string>()] = kv.second.Scalar();
                 }
                 ref(c) = std::move(m);
                 return "";
               },
               [=](const WorkerConfig& c) {
                 YAML::Node n(YAML::NodeType::Map);
                 for (const auto& [k, v] : ref(const_cast<WorkerConfig&>(c))) n[k] = v;
                 return n;
               }};
}

// Every key of the config with its type and bounds, in the order to_yaml writes them. A table of
// data, one entry per key: it grows with the config and is read as a list, so it stays one
// function (longer than the others on purpose).
const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    constexpr int kMaxDim = 1 << 20;
    // Intervals and waits: 0 disables; more than ~31 years is a typo (and overflows timers).
    constexpr double kMaxSecs = 1e9;
    std::vector<Field> f;
    f.push_back(string_field("model.preset",
                             [](WorkerConfig & c) -> auto& { return c.model.preset; },
                             {"tiny", "small-4x256", "gpt2-124m"}));
    f.push_back(optional_int_field(
        "model.n_layer", [](WorkerConfig & c) -> auto& { return c.model.n_layer; }, 1, 1024));
    f.push_back(optional_int_field(
        "model.n_head", [](WorkerConfig & c) -> auto& { return c.model.n_head; }, 1, 1024));
    f.push_back(optional_int_field(
        "model.n_embd", [](WorkerConfig & c) -> auto& { return c.model.n_embd; }, 1, kMaxDim));
    f.push_back(optional_int_field(
        "model.context_length", [](WorkerConfig & c) -> auto& { return c.model.context_length; }, 1,
        kMaxDim));
    f.push_back(optional_int_field(
        "model.vocab_size", [](WorkerConfig & c) -> auto& { return c.model.vocab_size; }, 2,
        65536));
    f.push_back(string_field(
        "data.train", [](WorkerConfig & c) -> auto& { return c.data.train; }));
    f.push_back(string_field(
        "data.val", [](WorkerConfig & c) -> auto& { return c.data.val; }));
    f.push_back(bool_field(
        "data.shuffle", [](WorkerConfig & c) -> auto& { return c.data.shuffle; }));
    f.push_back(int_field(
        "training.batch_size", [](WorkerConfig & c) -> auto& { return c.training.batch_size; }, 1,
        1 << 20));
    f.push_back(int_field(
        "training.seq_len", [](WorkerConfig & c) -> auto& { return c.training.seq_len; }, 1,
        kMaxDim));
    f.push_back(int_field(
        "training.total_batch_tokens",
        [](WorkerConfig & c) -> auto& { return c.training.total_batch_tokens; }, 0));
    f.push_back(int_field(
        "training.max_steps", [](WorkerConfig & c) -> auto& { return c.training.max_steps; }, 1));
    f.push_back(double_field(
        "training.learning_rate",
        [](WorkerConfig & c) -> auto& { return c.training.learning_rate; }, 0, 10, true));
    f.push_back(double_field(
        "training.min_lr_ratio", [](WorkerConfig & c) -> auto& { return c.training.min_lr_ratio; },
        0, 1));
    f.push_back(int_field(
        "training.warmup_steps", [](WorkerConfig & c) -> auto& { return c.training.warmup_steps; },
        0));
    f.push_back(double_field(
        "training.weight_decay", [](WorkerConfig & c) -> auto& { return c.training.weight_decay; },
        0));
    f.push_back(double_field(
        "training.beta1", [](WorkerConfig & c) -> auto& { return c.training.beta1; }, 0, 0.999999));
    f.push_back(double_field(
        "training.beta2", [](WorkerConfig & c) -> auto& { return c.training.beta2; }, 0, 0.999999));
    f.push_back(double_field(
        "training.eps", [](WorkerConfig & c) -> auto& { return c.training.eps; }, 0, 1, true));
    f.push_back(double_field(
        "training.grad_clip", [](WorkerConfig & c) -> auto& { return c.training.grad_clip; }, 0));
    f.push_back(uint_field(
        "training.seed", [](WorkerConfig & c) -> auto& { return c.training.seed; }));
    f.push_back(string_field("training.on_nonfinite",
                             [](WorkerConfig & c) -> auto& { return c.training.on_nonfinite; },
                             {"stop", "skip_step"}));
    f.push_back(double_field(
        "training.loss_spike_mads",
        [](WorkerConfig & c) -> auto& { return c.training.loss_spike_mads; }, 0));
    f.push_back(int_field(
        "training.loss_spike_window",
        [](WorkerConfig & c) -> auto& { return c.training.loss_spike_window; }, 5, 1 << 20));
    f.push_back(int_field(
        "training.loss_spike_after_steps",
        [](WorkerConfig & c) -> auto& { return c.training.loss_spike_after_steps; }, 0));
    f.push_back(int_field(
        "training.max_consecutive_skips",
        [](WorkerConfig & c) -> auto& { return c.training.max_consecutive_skips; }, 1));
    f.push_back(double_field(
        "checkpoint.save_model_secs",
        [](WorkerConfig & c) -> auto& { return c.checkpoint.save_model_secs; }, 0, kMaxSecs));
    f.push_back(int_field(
        "checkpoint.save_model_steps",
        [](WorkerConfig & c) -> auto& { return c.checkpoint.save_model_steps; }, 0));
    f.push_back(small_int_field(
        "checkpoint.max_to_keep",
        [](WorkerConfig & c) -> auto& { return c.checkpoint.max_to_keep; }, 0, 1 << 20));
    f.push_back(double_field(
        "checkpoint.keep_checkpoint_every_n_hours",
        [](WorkerConfig & c) -> auto& { return c.checkpoint.keep_checkpoint_every_n_hours; }, 0,
        kMaxSecs));
    f.push_back(string_field(
        "checkpoint.init_from", [](WorkerConfig & c) -> auto& { return c.checkpoint.init_from; }));
    f.push_back(string_map_field(
        "checkpoint.init_name_map",
        [](WorkerConfig & c) -> auto& { return c.checkpoint.init_name_map; }));
    f.push_back(double_field(
        "summaries.save_summaries_secs",
        [](WorkerConfig & c) -> auto& { return c.summaries.save_summaries_secs; }, 0, kMaxSecs));
    f.push_back(int_field(
        "summaries.every_steps", [](WorkerConfig & c) -> auto& { return c.summaries.every_steps; },
        0));
    f.push_back(int_field(
        "log.every_steps", [](WorkerConfig & c) -> auto& { return c.log.every_steps; }, 1));
    f.push_back(int_field(
        "eval.every_steps", [](WorkerConfig & c) -> auto& { return c.eval.every_steps; }, 0));
    f.push_back(int_field(
        "eval.batches", [](WorkerConfig & c) -> auto& { return c.eval.batches; }, 0));
    f.push_back(int_field(
        "eval.sample_tokens", [](WorkerConfig & c) -> auto& { return c.eval.sample_tokens; }, 0));
    f.push_back(string_field(
        "eval.sample_prompt", [](WorkerConfig & c) -> auto& { return c.eval.sample_prompt; }));
    f.push_back(double_field(
        "supervisor.recovery_wait_secs",
        [](WorkerConfig & c) -> auto& { return c.supervisor.recovery_wait_secs; }, 0, kMaxSecs));
    f.push_back(double_field(
        "supervisor.max_wait_secs",
        [](WorkerConfig & c) -> auto& { return c.supervisor.max_wait_secs; }, 0, kMaxSecs));
    f.push_back(double_field(
        "supervisor.stop_grace_secs",
        [](WorkerConfig & c) -> auto& { return c.supervisor.stop_grace_secs; }, 0, kMaxSecs));
    f.push_back(string_field("supervisor.on_peer_loss",
                             [](WorkerConfig & c) -> auto& { return c.supervisor.on_peer_loss; },
                             {"regroup", "exit"}));
    f.push_back(double_field(
        "supervisor.regroup_timeout_secs",
        [](WorkerConfig & c) -> auto& { return c.supervisor.regroup_timeout_secs; }, 0, kMaxSecs,
        true));
    f.push_back(double_field(
        "supervisor.lock_lease_secs",
        [](WorkerConfig & c) -> auto& { return c.supervisor.lock_lease_secs; }, 0, kMaxSecs));
    f.push_back(bool_field(
        "cuda.self_check", [](WorkerConfig & c) -> auto& { return c.cuda.self_check; }));
    f.push_back(string_field(
        "logdir", [](WorkerConfig & c) -> auto& { return c.logdir; }));
    f.push_back(string_field("device", [](WorkerConfig & c) -> auto& { return c.device; },
                             {"auto", "cpu", "cuda"}));
    f.push_back(small_int_field(
        "metrics_port", [](WorkerConfig & c) -> auto& { return c.metrics_port; }, 0, 65535));
    f.push_back(double_field(
        "grace_period_secs", [](WorkerConfig & c) -> auto& { return c.grace_period_secs; }, 0, 1e9,
        true));
    return f;
  }();
  return fields;
}

const Field* find_field(std::string_view key) {
  for (const auto& f : schema()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

bool is_section(std::string_view key) {
  for (const auto& f : schema()) {
    if (f.key.size() > key.size() && f.key.compare(0, key.size(), key) == 0 &&
        f.key[key.size()] == '.') {
      return true;
    }
  }
  return false;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string last_part(std::string_view key) {
  auto dot = key.rfind('.');
  return std::string(dot == std::string_view::npos ? key : key.substr(dot + 1));
}

// " (did you mean 'x'?)" or "".
std::string suggestion(const std::string& key) {
  std::set<std::string> candidates;
  for (const auto& f : schema()) {
    candidates.insert(f.key);
    for (size_t dot = f.key.find('.'); dot != std::string::npos; dot = f.key.find('.', dot + 1)) {
      candidates.insert(f.key.substr(0, dot));
    }
  }
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 4) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best.empty()) {  // the right leaf name in the wrong section: "batch_size" at the top
    const std::string leaf = last_part(key);
    for (const auto& f : schema()) {
      if (last_part(f.key) == leaf || edit_distance(last_part(f.key), leaf) <= 1) {
        if (!best.empty()) return "";  // ambiguous
        best = f.key;
      }
    }
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// Checks the structure of `node` (at `prefix`) against the schema: unknown keys, sections that
// are not mappings, values that are not scalars.
void check_structure(const YAML::Node& node, const std::string& prefix, const std::string& where,
                     std::vector<std::string>& errors) {
  for (const auto& kv : node) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : "<non-scalar key>";
    const std::string key = field::path(prefix, name);
    if (const Field* f = find_field(key)) {
      if (f->kind == Kind::kMap && !kv.second.IsMap() && !kv.second.IsNull()) {
        errors.push_back(where + ": " + key + " must be a mapping of names");
      } else if (f->kind == Kind::kScalar && !kv.second.IsScalar()) {
        errors.push_back(where + ": " + key +
                         (kv.second.IsNull() ? " has no value: give one or remove the key"
                                             : " must be a single value, not a list or mapping"));
      }
    } else if (is_section(key)) {
      if (kv.second.IsMap()) {
        check_structure(kv.second, key, where, errors);
      } else if (!kv.second.IsNull()) {
        errors.push_back(where + ": " + key + " must be a mapping (a section of keys)");
      }
    } else {
      errors.push_back(where + ": unknown key '" + key + "'" + suggestion(key));
    }
  }
}

// Duplicate keys in any mapping of the file: yaml-cpp keeps the first silently, PyYAML and Helm
// the last, so a repeated key (or section) is refused, naming both lines.
void check_duplicates(const YAML::Node& node, const std::string& prefix, const std::string& where,
                      std::vector<std::string>& errors) {
  if (!node.IsMap()) return;
  std::map<std::string, int> first_line;
  for (const auto& kv : node) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : "<non-scalar key>";
    const std::string key = field::path(prefix, name);
    const int line = kv.first.Mark().line + 1;
    auto [it, inserted] = first_line.emplace(name, line);
    if (!inserted) {
      errors.push_back(where + ": " + key + " is given twice (lines " + std::to_string(it->second) +
                       " and " + std::to_string(line) +
                       "); YAML tools disagree on which wins: keep one");
      continue;
    }
    check_duplicates(kv.second, key, where, errors);
  }
}

// The node at dotted `key`, created on demand (yaml-cpp: reset() rebinds, = would assign).
YAML::Node node_at(YAML::Node root, const std::vector<std::string>& parts) {
  YAML::Node cur = root;
  for (const auto& part : parts) {
    YAML::Node child = cur[part];
    cur.reset(child);
  }
  return cur;
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', begin)) {
    parts.push_back(key.substr(begin, dot - begin));
    begin = dot + 1;
  }
  parts.push_back(key.substr(begin));
  return parts;
}

void reject(const std::vector<std::string>& errors) {
  if (errors.empty()) return;
  std::string msg = errors.size() == 1 ? errors[0] : "invalid configuration:";
  if (errors.size() > 1) {
    for (const auto& e : errors) msg += "\n  " + e;
  }
  throw InvalidArgument(msg);
}

// The YAML file at `path` (described as `where` in errors), as a mapping of sections, with no
// duplicate keys and the schema's shape. An empty path is the empty mapping (the defaults).
YAML::Node read_yaml(const std::filesystem::path& path, const std::string& where) {
  YAML::Node root(YAML::NodeType::Map);
  if (path.empty()) return root;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InvalidArgument(where + " is a directory; --config takes a YAML file");
  }
  const std::string text = file::read_file(path);  // NotFound / PermissionDenied name it
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw InvalidArgument(where + " is not valid YAML (line " + std::to_string(e.mark.line + 1) +
                          ", column " + std::to_string(e.mark.column + 1) + "): " + e.msg);
  }
  if (root.IsNull()) {
    root = YAML::Node(YAML::NodeType::Map);
  } else if (!root.IsMap()) {
    throw InvalidArgument(where +
                          " must be a YAML mapping of sections (model:, data:, "
                          "training:, ...); see examples/worker-tiny.yaml");
  }
  std::vector<std::string> errors;
  check_duplicates(root, "", where, errors);
  reject(errors);
  check_structure(root, "", where, errors);
  reject(errors);
  return root;
}

// Why `--set key=...` names nothing that can be set: a mapping (whose entries can), a section,
// or an unknown key (with the nearest known one).
std::string why_not_settable(const std::string& key, const Field* field) {
  if (field != nullptr) return key + " is a mapping; set its entries as " + key + ".NAME=VALUE";
  if (is_section(key)) {
    std::string some;
    for (const auto& f : schema()) {
      if (f.key.rfind(key + ".", 0) == 0) {
        some = f.key;
        break;
      }
    }
    return key + " is a section, not a key: set one of its keys, e.g. --set " + some + "=...";
  }
  return "unknown key '" + key + "'" + suggestion(key);
}

// Sets one `key=value` of --set in `root`: a scalar key, or an entry of a map field
// (checkpoint.init_name_map.<our name with dots>=<their name>). Returns the schema keys it set
// (none when `key` names nothing settable).
std::vector<std::string> set_override(YAML::Node& root, const std::string& key,
                                      const std::string& value) {
  const Field* field = find_field(key);
  if (field != nullptr && field->kind == Kind::kScalar) {
    node_at(root, split_key(key)) = YAML::Node(value);
    return {key};
  }
  std::vector<std::string> set;
  for (const auto& f : schema()) {
    if (f.kind == Kind::kMap && key.size() > f.key.size() + 1 &&
        key.compare(0, f.key.size() + 1, f.key + ".") == 0) {
      YAML::Node map = node_at(root, split_key(f.key));
      if (!map.IsMap()) map = YAML::Node(YAML::NodeType::Map);
      map[key.substr(f.key.size() + 1)] = value;
      set.push_back(f.key);
    }
  }
  return set;
}

// Applies --set `overrides` to `root`; returns the schema keys they set. A malformed or unknown
// override is an error in `errors`.
std::set<std::string> apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides,
                                      std::vector<std::string>& errors) {
  std::set<std::string> overridden;
  for (const auto& item : overrides) {
    const auto eq = item.find('=');
    const std::string origin = "--set " + item;
    if (eq == std::string::npos || eq == 0) {
      errors.push_back(origin + ": expected key.sub=value");
      continue;
    }
    const std::string key = item.substr(0, eq);
    const std::vector<std::string> set = set_override(root, key, item.substr(eq + 1));
    if (set.empty()) errors.push_back(origin + ": " + why_not_settable(key, find_field(key)));
    overridden.insert(set.begin(), set.end());
  }
  return overridden;
}

// Every schema key present in `root`, parsed into `config`; a bad value is an error naming where
// it came from (the file, or the --set that gave it).
void parse_values(const YAML::Node& root, const std::set<std::string>& overridden,
                  const std::string& where, WorkerConfig& config,
                  std::vector<std::string>& errors) {
  for (const auto& f : schema()) {
    YAML::Node n = root;
    bool present = true;
    for (const auto& part : split_key(f.key)) {
      if (!n.IsMap() || !n[part]) {
        present = false;
        break;
      }
      YAML::Node child = n[part];
      n.reset(child);
    }
    if (!present || (f.kind == Kind::kMap && n.IsNull())) continue;
    std::string err = f.parse(n, config);
    if (!err.empty()) {
      errors.push_back((overridden.count(f.key) ? "--set " + f.key : where) + ": " + f.key + " " +
                       err);
    }
  }
}

// Relations between keys that each parsed on its own.
void check_relations(const WorkerConfig& config, const std::string& where,
                     std::vector<std::string>& errors) {
  const auto& t = config.training;
  const int64_t micro = t.batch_size * t.seq_len;
  if (t.total_batch_tokens != 0 && t.total_batch_tokens % micro != 0) {
    errors.push_back(
        where + ": training.total_batch_tokens " + std::to_string(t.total_batch_tokens) +
        " must be a multiple of training.batch_size * training.seq_len = " + std::to_string(micro) +
        " (times the number of replicas)");
  }
  if (!config.checkpoint.init_name_map.empty() && config.checkpoint.init_from.empty()) {
    errors.push_back(where + ": checkpoint.init_name_map is set but checkpoint.init_from is not");
  }
  if (config.model.n_head && config.model.n_embd &&
      *config.model.n_embd % *config.model.n_head != 0) {
    errors.push_back(where + ": model.n_embd " + std::to_string(*config.model.n_embd) +
                     " must be a multiple of model.n_head " + std::to_string(*config.model.n_head));
  }
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& f : schema()) keys.push_back(f.key);
  return keys;
}

WorkerConfig load_config(const std::filesystem::path& path,
                         const std::vector<std::string>& overrides) {
  WorkerConfig config;
  config.source = path;
  const std::string where = path.empty() ? "default config" : "config " + path.string();
  YAML::Node root = read_yaml(path, where);
  std::vector<std::string> errors;
  const std::set<std::string> overridden = apply_overrides(root, overrides, errors);
  reject(errors);
  parse_values(root, overridden, where, config, errors);
  reject(errors);
  check_relations(config, where, errors);
  reject(errors);
  return config;
}

std::string to_yaml(const WorkerConfig& config) {
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& f : schema()) {
    YAML::Node value = f.dump(config);
    if (value.IsNull()) continue;
    node_at(root, split_key(f.key)) = value;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace longhaul::trainer
