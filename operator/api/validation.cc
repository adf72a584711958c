// Kubernetes' syntax rules for pod templates (see validation.h).
#include "longhaul/api/validation.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "longhaul/api/trainingjob.h"
#include "longhaul/base/error.h"

namespace longhaul::api {

using json = nlohmann::json;

namespace {

bool lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool alnum(char c) { return lower_alnum(c) || (c >= 'A' && c <= 'Z'); }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InvalidArgument(path + ": " + what);
}

std::string quoted(const json& v) {
  return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump();
}

constexpr const char* kDnsLabelRule =
    "must be a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting and ending "
    "with a letter or digit (e.g. \"trainer\")";
constexpr const char* kPortNameRule =
    "must be an IANA service name: at most 15 lower-case letters, digits or '-', with at least "
    "one letter, no '-' at either end and no \"--\" (e.g. \"metrics\")";
constexpr const char* kEnvNameRule =
    "must consist of letters, digits, '_', '-' or '.', and must not start with a digit (e.g. "
    "\"MY_VAR\")";
constexpr const char* kLabelValueRule =
    "must be at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with "
    "a letter or digit (or be empty)";
constexpr const char* kQualifiedNameRule =
    "must be a qualified name: an optional DNS subdomain prefix and '/', then at most 63 letters, "
    "digits, '-', '_' or '.', starting and ending with a letter or digit (e.g. "
    "\"example.com/team\")";
constexpr const char* kQuantityRule =
    "must be a Kubernetes quantity: a number with an optional suffix (m, k, M, G, T, P, E, Ki, "
    "Mi, Gi, Ti, Pi, Ei, or an exponent), e.g. \"500m\", \"2\", \"16Gi\"";

const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& array_at(const json& obj, const char* key, const std::string& path) {
  static const json kEmpty = json::array();
  const json* v = field(obj, key);
  if (v == nullptr) return kEmpty;
  if (!v->is_array()) fail(path + "." + key, "must be a list");
  return *v;
}

std::string string_at(const json& obj, const char* key, const std::string& path, bool required) {
  const json* v = field(obj, key);
  if (v == nullptr) {
    if (required) fail(path + "." + key, "is required");
    return "";
  }
  if (!v->is_string()) fail(path + "." + key, "must be a string");
  return v->get<std::string>();
}

void check_string_map(const json& obj, const char* key, const std::string& path,
                      bool values_are_labels) {
  const json* m = field(obj, key);
  if (m == nullptr) return;
  const std::string p = path + "." + key;
  if (!m->is_object()) fail(p, "must be a map of strings");
  for (const auto& [k, v] : m->items()) {
    if (!is_qualified_name(k)) fail(p, "key \"" + k + "\" " + kQualifiedNameRule);
    if (!v.is_string()) fail(p + "[" + k + "]", "must be a string");
    if (values_are_labels && !is_label_value(v.get<std::string>())) {
      fail(p + "[" + k + "]", "invalid value " + quoted(v) + ": " + kLabelValueRule);
    }
  }
}

bool is_standard_resource(const std::string& name) {
  static const std::set<std::string> kNames = {"cpu", "memory", "ephemeral-storage", "storage"};
  return kNames.contains(name) || name.rfind("hugepages-", 0) == 0 ||
         name.rfind("requests.", 0) == 0 || name.rfind("limits.", 0) == 0;
}

// Extended resources (nvidia.com/gpu): a domain outside kubernetes.io.
bool is_extended_resource(const std::string& name) {
  const auto slash = name.find('/');
  if (slash == std::string::npos) return false;
  const std::string domain = name.substr(0, slash);
  return domain != "kubernetes.io" &&
         (domain.size() < 14 || domain.substr(domain.size() - 14) != ".kubernetes.io");
}

std::map<std::string, long double> check_resource_list(const json& resources, const char* key,
                                                       const std::string& path) {
  std::map<std::string, long double> out;
  const json* list = field(resources, key);
  if (list == nullptr) return out;
  const std::string p = path + "." + key;
  if (!list->is_object()) fail(p, "must be a map of resource name to quantity");
  for (const auto& [name, value] : list->items()) {
    const std::string rp = p + "[" + name + "]";
    if (!is_standard_resource(name) &&
        !(name.find('/') != std::string::npos && is_qualified_name(name))) {
      fail(rp, "unknown resource name \"" + name +
                   "\": use cpu, memory, ephemeral-storage, hugepages-<size>, or a "
                   "domain-prefixed extended resource such as nvidia.com/gpu");
    }
    std::optional<long double> q;
    if (value.is_string()) q = parse_quantity(value.get<std::string>());
    if (value.is_number()) q = value.get<long double>();
    if (!q) fail(rp, "invalid quantity " + quoted(value) + ": " + kQuantityRule);
    if (*q < 0) fail(rp, "invalid quantity " + quoted(value) + ": must be >= 0");
    if (is_extended_resource(name) && std::floor(*q) != *q) {
      fail(rp, "invalid quantity " + quoted(value) + ": extended resources must be whole numbers");
    }
    out[name] = *q;
  }
  return out;
}

// containers[].ports: names unique in the pod (`port_names`), valid port numbers and protocols.
void check_ports(const json& c, const std::string& path, std::set<std::string>& port_names) {
  const json& ports = array_at(c, "ports", path);
  for (size_t i = 0; i < ports.size(); ++i) {
    const json& port = ports[i];
    const std::string pp = path + ".ports[" + std::to_string(i) + "]";
    if (!port.is_object()) fail(pp, "must be an object");
    const std::string pname = string_at(port, "name", pp, false);
    if (!pname.empty()) {
      if (!is_iana_svc_name(pname))
        fail(pp + ".name", "invalid port name \"" + pname + "\": " + kPortNameRule);
      if (!port_names.insert(pname).second) {
        fail(pp + ".name",
             "duplicate port name \"" + pname + "\": port names must be unique in the pod");
      }
    }
    const json* cp = field(port, "containerPort");
    if (cp == nullptr) fail(pp + ".containerPort", "is required");
    if (!cp->is_number_integer() || cp->get<int64_t>() < 1 || cp->get<int64_t>() > 65535) {
      fail(pp + ".containerPort", "invalid value " + cp->dump() + ": must be between 1 and 65535");
    }
    if (const json* hp = field(port, "hostPort")) {
      if (!hp->is_number_integer() || hp->get<int64_t>() < 0 || hp->get<int64_t>() > 65535) {
        fail(pp + ".hostPort", "invalid value " + hp->dump() + ": must be between 0 and 65535");
      }
    }
    if (const std::string proto = string_at(port, "protocol", pp, false);
        !proto.empty() && proto != "TCP" && proto != "UDP" && proto != "SCTP") {
      fail(pp + ".protocol", "unsupported value \"" + proto + "\": must be TCP, UDP or SCTP");
    }
  }
}

// containers[].env: valid names, string values.
void check_env(const json& c, const std::string& path) {
  const json& env = array_at(c, "env", path);
  for (size_t i = 0; i < env.size(); ++i) {
    const std::string ep = path + ".env[" + std::to_string(i) + "]";
    if (!env[i].is_object()) fail(ep, "must be an object");
    const std::string ename = string_at(env[i], "name", ep, true);
    if (!is_env_var_name(ename))
      fail(ep + ".name", "invalid environment variable name \"" + ename + "\": " + kEnvNameRule);
    if (const json* v = field(env[i], "value"); v != nullptr && !v->is_string()) {
      fail(ep + ".value", "must be a string (quote numbers and booleans in YAML: \"1\")");
    }
  }
}

// containers[].resources: valid quantities; requests within limits; extended resources whole
// and not overcommitted.
void check_resources(const json& c, const std::string& path) {
  if (const json* res = field(c, "resources")) {
    const std::string rp = path + ".resources";
    if (!res->is_object()) fail(rp, "must be an object");
    const auto limits = check_resource_list(*res, "limits", rp);
    const auto requests = check_resource_list(*res, "requests", rp);
    for (const auto& [name, request] : requests) {
      auto limit = limits.find(name);
      if (is_extended_resource(name)) {
        if (limit == limits.end()) {
          fail(rp + ".limits[" + name + "]",
               "is required: extended resources need a limit equal to the request");
        }
        if (limit->second != request) {
          fail(rp + ".requests[" + name + "]",
               "must equal limits[" + name + "]: extended resources cannot be overcommitted");
        }
      } else if (limit != limits.end() && request > limit->second) {
        fail(rp + ".requests[" + name + "]", "must be less than or equal to limits[" + name + "]");
      }
    }
  }
}

// containers[].volumeMounts: each names a volume of the pod (`volumes`), paths unique.
void check_volume_mounts(const json& c, const std::string& path,
                         const std::set<std::string>& volumes) {
  std::set<std::string> mount_paths;
  const json& mounts = array_at(c, "volumeMounts", path);
  for (size_t i = 0; i < mounts.size(); ++i) {
    const std::string mp = path + ".volumeMounts[" + std::to_string(i) + "]";
    if (!mounts[i].is_object()) fail(mp, "must be an object");
    const std::string vname = string_at(mounts[i], "name", mp, true);
    if (!volumes.contains(vname)) {
      fail(mp + ".name", "volume \"" + vname +
                             "\" is not in template.spec.volumes: add it there or fix the name");
    }
    const std::string mount_path = string_at(mounts[i], "mountPath", mp, true);
    if (mount_path.empty()) fail(mp + ".mountPath", "is required");
    if (!mount_paths.insert(mount_path).second) {
      fail(mp + ".mountPath",
           "\"" + mount_path + "\" is mounted twice in this container: mount paths must be unique");
    }
  }
}

void check_container(const json& c, const std::string& path, const std::set<std::string>& volumes,
                     std::set<std::string>& container_names, std::set<std::string>& port_names) {
  if (!c.is_object()) fail(path, "must be an object");
  const std::string name = string_at(c, "name", path, true);
  if (!is_dns1123_label(name))
    fail(path + ".name", "invalid container name \"" + name + "\": " + kDnsLabelRule);
  if (!container_names.insert(name).second) {
    fail(path + ".name",
         "duplicate container name \"" + name + "\": give every container its own name");
  }
  const std::string image = string_at(c, "image", path, false);
  if (image.empty()) fail(path + ".image", "is required");
  if (image.find_first_of(" \t\r\n") == 0 || image.find_last_of(" \t\r\n") == image.size() - 1) {
    fail(path + ".image", "must not have leading or trailing whitespace");
  }
  if (const std::string policy = string_at(c, "imagePullPolicy", path, false);
      !policy.empty() && policy != "Always" && policy != "IfNotPresent" && policy != "Never") {
    fail(path + ".imagePullPolicy",
         "unsupported value \"" + policy + "\": must be Always, IfNotPresent or Never");
  }
  check_ports(c, path, port_names);
  check_env(c, path);
  check_resources(c, path);
  check_volume_mounts(c, path, volumes);
}

}  // namespace

bool is_dns1123_label(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!lower_alnum(c) && c != '-') return false;
  }
  return s.front() != '-' && s.back() != '-';
}

bool is_dns1123_subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  for (;;) {
    const size_t dot = s.find('.', start);
    const std::string_view part =
        s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
    if (part.empty()) return false;
    for (char c : part) {
      if (!lower_alnum(c) && c != '-') return false;
    }
    if (part.front() == '-' || part.back() == '-') return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

bool is_iana_svc_name(std::string_view s) {
  if (s.empty() || s.size() > 15) return false;
  bool letter = false;
  for (char c : s) {
    if (!lower_alnum(c) && c != '-') return false;
    letter |= c >= 'a' && c <= 'z';
  }
  return letter && s.front() != '-' && s.back() != '-' && s.find("--") == std::string_view::npos;
}

bool is_env_var_name(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = alnum(c) || c == '_' || c == '-' || c == '.';
    if (!ok || (i == 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool is_label_value(std::string_view s) {
  if (s.empty()) return true;
  if (s.size() > 63) return false;
  for (char c : s) {
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return alnum(s.front()) && alnum(s.back());
}

bool is_qualified_name(std::string_view s) {
  std::string_view name = s;
  if (const size_t slash = s.find('/'); slash != std::string_view::npos) {
    if (!is_dns1123_subdomain(s.substr(0, slash))) return false;
    name = s.substr(slash + 1);
  }
  return !name.empty() && is_label_value(name);
}

std::optional<long double> parse_quantity(std::string_view s) {
  // <quantity> ::= <signedNumber><suffix>; <number> ::= <digits> | <digits>.<digits> |
  // <digits>. | .<digits>; <suffix> ::= binarySI | decimalSI | e<signedNumber> | E<signedNumber>
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  const size_t digits_start = i;
  long double value = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') value = value * 10 + (s[i++] - '0');
  bool any = i > digits_start;
  if (i < s.size() && s[i] == '.') {
    ++i;
    long double scale = 0.1L;
    const size_t frac_start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      value += (s[i++] - '0') * scale;
      scale /= 10;
    }
    any |= i > frac_start;
  }
  if (!any) return std::nullopt;
  const std::string_view suffix = s.substr(i);
  static const std::map<std::string_view, long double> kSuffixes = {{"", 1},
                                                                    {"m", 1e-3L},
                                                                    {"k", 1e3L},
                                                                    {"M", 1e6L},
                                                                    {"G", 1e9L},
                                                                    {"T", 1e12L},
                                                                    {"P", 1e15L},
                                                                    {"E", 1e18L},
                                                                    {"Ki", 1024.0L},
                                                                    {"Mi", 1048576.0L},
                                                                    {"Gi", 1073741824.0L},
                                                                    {"Ti", 1099511627776.0L},
                                                                    {"Pi", 1125899906842624.0L},
                                                                    {"Ei", 1152921504606846976.0L}};
  long double factor = 0;
  if (auto it = kSuffixes.find(suffix); it != kSuffixes.end()) {
    factor = it->second;
  } else if (suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    size_t j = 1;
    bool neg_exp = false;
    if (suffix[j] == '+' || suffix[j] == '-') neg_exp = suffix[j++] == '-';
    if (j >= suffix.size()) return std::nullopt;
    int exp = 0;
    for (; j < suffix.size(); ++j) {
      if (suffix[j] < '0' || suffix[j] > '9' || exp > 1000) return std::nullopt;
      exp = exp * 10 + (suffix[j] - '0');
    }
    factor = std::pow(10.0L, neg_exp ? -exp : exp);
  } else {
    return std::nullopt;
  }
  return (negative ? -value : value) * factor;
}

void validate_pod_template(const json& tmpl, const std::string& path, const LogdirSpec& logdir) {
  (void)logdir;  // the operator skips its logdir mount where the template mounts that path
  if (!tmpl.is_object()) fail(path, "must be an object");
  if (const json* md = field(tmpl, "metadata")) {
    const std::string mp = path + ".metadata";
    if (!md->is_object()) fail(mp, "must be an object");
    check_string_map(*md, "labels", mp, true);
    check_string_map(*md, "annotations", mp, false);
  }
  const json* spec = field(tmpl, "spec");
  const std::string sp = path + ".spec";
  if (spec == nullptr || !spec->is_object())
    fail(sp + ".containers", "must list at least one container");

  std::set<std::string> volumes = {"longhaul-logdir"};  // added by the operator
  const json& vols = array_at(*spec, "volumes", sp);
  std::set<std::string> user_volumes;
  for (size_t i = 0; i < vols.size(); ++i) {
    const std::string vp = sp + ".volumes[" + std::to_string(i) + "]";
    if (!vols[i].is_object()) fail(vp, "must be an object");
    const std::string vname = string_at(vols[i], "name", vp, true);
    if (!is_dns1123_label(vname))
      fail(vp + ".name", "invalid volume name \"" + vname + "\": " + kDnsLabelRule);
    if (!user_volumes.insert(vname).second)
      fail(vp + ".name", "duplicate volume name \"" + vname + "\"");
    volumes.insert(vname);
  }

  const json& containers = array_at(*spec, "containers", sp);
  if (containers.empty()) fail(sp + ".containers", "must list at least one container");
  std::set<std::string> container_names, port_names;
  const json& init = array_at(*spec, "initContainers", sp);
  for (size_t i = 0; i < init.size(); ++i) {
    check_container(init[i], sp + ".initContainers[" + std::to_string(i) + "]", volumes,
                    container_names, port_names);
  }
  for (size_t i = 0; i < containers.size(); ++i) {
    check_container(containers[i], sp + ".containers[" + std::to_string(i) + "]", volumes,
                    container_names, port_names);
  }

  if (const json* ns = field(*spec, "nodeSelector")) {
    if (!ns->is_object()) fail(sp + ".nodeSelector", "must be a map of strings");
    check_string_map(*spec, "nodeSelector", sp, true);
  }
  if (const std::string sa = string_at(*spec, "serviceAccountName", sp, false);
      !sa.empty() && !is_dns1123_subdomain(sa)) {
    fail(sp + ".serviceAccountName",
         "invalid name \"" + sa +
             "\": must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')");
  }
  if (const json* grace = field(*spec, "terminationGracePeriodSeconds")) {
    if (!grace->is_number_integer() || grace->get<int64_t>() < 0) {
      fail(sp + ".terminationGracePeriodSeconds", "must be a whole number of seconds >= 0");
    }
  }
}

void validate_grace_period(const json& tmpl, const std::string& path) {
  constexpr std::string_view kKey = "grace_period_secs=";
  const json* spec = tmpl.is_object() ? field(tmpl, "spec") : nullptr;
  if (spec == nullptr || !spec->is_object()) return;
  int64_t pod_grace = 30;  // Kubernetes' default
  if (const json* g = field(*spec, "terminationGracePeriodSeconds"); g && g->is_number_integer()) {
    pod_grace = g->get<int64_t>();
  }
  const json* containers = field(*spec, "containers");
  if (containers == nullptr || !containers->is_array()) return;
  for (size_t i = 0; i < containers->size(); ++i) {
    const json& c = (*containers)[i];
    if (!c.is_object()) continue;
    for (const char* list : {"command", "args"}) {
      const json* words = field(c, list);
      if (words == nullptr || !words->is_array()) continue;
      for (size_t w = 0; w < words->size(); ++w) {
        if (!(*words)[w].is_string()) continue;
        std::string setting = (*words)[w].get<std::string>();
        if (setting.rfind("--set=", 0) == 0) {
          setting.erase(0, 6);
        } else if (setting == "--set" && w + 1 < words->size() && (*words)[w + 1].is_string()) {
          setting = (*words)[++w].get<std::string>();
        } else {
          continue;
        }
        if (setting.rfind(kKey, 0) != 0) continue;
        const std::string value = setting.substr(kKey.size());
        char* end = nullptr;
        const double secs = std::strtod(value.c_str(), &end);
        // Not a number: the worker's own config check refuses it, naming the key.
        if (end == value.c_str() || *end != '\0' || !std::isfinite(secs)) continue;
        if (secs < static_cast<double>(pod_grace)) continue;
        fail(path + ".spec.containers[" + std::to_string(i) + "]." + list + "[" +
                 std::to_string(w) + "]",
             "grace_period_secs=" + value + " is not below " + path +
                 ".spec.terminationGracePeriodSeconds (" + std::to_string(pod_grace) +
                 "): the kubelet kills the container that long after SIGTERM, before the "
                 "worker's final checkpoint is written; set terminationGracePeriodSeconds above "
                 "grace_period_secs (e.g. " +
                 std::to_string(static_cast<int64_t>(std::ceil(secs)) + 5) +
                 ") or lower grace_period_secs");
      }
    }
  }
}

}  // namespace longhaul::api
