// Pod -> local process translation (see pod_command.h).
#include "longhaul/kubelet/pod_command.h"

#include <algorithm>
#include <cstdlib>

#include <unistd.h>

#include <longhaul/base/error.h>

#include "longhaul/testing/loopback.h"

namespace longhaul::kubelet {
namespace {

namespace fs = std::filesystem;

std::string str(const json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

bool is_path_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
         c == '/' || c == '~';
}

// A free TCP port of 127.0.0.1, from below the ephemeral range (see free_loopback_port): the
// pod binds it later, and no outgoing connection can take it meanwhile.
int free_local_port() {
  const int port = testing::free_loopback_port();
  if (port <= 0)
    throw Unavailable("local kubelet: cannot bind a socket on 127.0.0.1 to pick a port");
  return port;
}

// metadata.labels['a.b/c'] -> the label's value.
std::string field_ref(const json& pod, const std::string& path, const std::string& pod_ip,
                      bool* known) {
  *known = true;
  const json meta = pod.value("metadata", json::object());
  const json spec = pod.value("spec", json::object());
  if (path == "metadata.name") return str(meta, "name");
  if (path == "metadata.namespace") return str(meta, "namespace");
  if (path == "metadata.uid") return str(meta, "uid");
  if (path == "spec.nodeName") return str(spec, "nodeName");
  if (path == "spec.serviceAccountName") return str(spec, "serviceAccountName");
  if (path == "status.podIP" || path == "status.hostIP") return pod_ip;
  for (const char* map : {"labels", "annotations"}) {
    const std::string prefix = std::string("metadata.") + map + "['";
    if (path.rfind(prefix, 0) == 0 && path.size() > prefix.size() + 2 &&
        path.substr(path.size() - 2) == "']") {
      const std::string key = path.substr(prefix.size(), path.size() - prefix.size() - 2);
      return str(meta.value(map, json::object()), key.c_str());
    }
  }
  *known = false;
  return "";
}

fs::path find_program(const std::string& name, const std::vector<fs::path>& bin_dirs) {
  if (name.find('/') != std::string::npos) return name;
  std::vector<fs::path> dirs = bin_dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      if (end > start) dirs.emplace_back(p.substr(start, end - start));
      start = end + 1;
    }
  }
  for (const fs::path& dir : dirs) {
    fs::path candidate = dir / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

}  // namespace

int PortMap::port_for(const std::string& address) {
  longhaul::MutexLock lock(mu_);
  auto it = ports_.find(address);
  if (it != ports_.end()) return it->second;
  int port = 0;
  if (next_ > 0) {
    port = next_++;
  } else {
    // A free port that no other address of this map holds.
    do {
      port = free_local_port();
    } while (std::any_of(ports_.begin(), ports_.end(),
                         [&](const auto& kv) { return kv.second == port; }));
  }
  ports_[address] = port;
  return port;
}

std::string PortMap::local_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return address;
  return "127.0.0.1:" + std::to_string(port_for(address));
}

std::string image_basename(const std::string& image) {
  std::string s = image;
  if (size_t at = s.find('@'); at != std::string::npos) s = s.substr(0, at);
  if (size_t slash = s.rfind('/'); slash != std::string::npos) s = s.substr(slash + 1);
  if (size_t colon = s.find(':'); colon != std::string::npos) s = s.substr(0, colon);
  return s;
}

std::string replace_mount_path(const std::string& text, const std::string& mount_path,
                               const std::string& local) {
  std::string m = mount_path;
  while (m.size() > 1 && m.back() == '/') m.pop_back();
  if (m.empty() || m == "/") return text;
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t hit = text.find(m, pos);
    if (hit == std::string::npos) break;
    const size_t end = hit + m.size();
    const bool starts_path = hit == 0 || !is_path_char(text[hit - 1]);
    const bool ends_path = end == text.size() || text[end] == '/' || !is_path_char(text[end]);
    out.append(text, pos, hit - pos);
    out += (starts_path && ends_path) ? local : m;
    pos = end;
  }
  out.append(text, pos, std::string::npos);
  return out;
}

std::string expand_references(const std::string& text,
                              const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    if (text[i + 1] == '$') {  // $$ -> $
      out += '$';
      ++i;
      continue;
    }
    if (text[i + 1] == '(') {
      const size_t close = text.find(')', i + 2);
      if (close != std::string::npos) {
        const std::string name = text.substr(i + 2, close - i - 2);
        auto it = vars.find(name);
        if (it != vars.end()) {
          out += it->second;
        } else {
          out.append(text, i, close - i + 1);
        }
        i = close;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

std::string rewrite_tf_config(const std::string& tf_config, PortMap& ports) {
  json config = json::parse(tf_config, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object() || !config.contains("cluster") ||
      !config["cluster"].is_object()) {
    return tf_config;
  }
  for (auto& [type, addresses] : config["cluster"].items()) {
    if (!addresses.is_array()) continue;
    for (json& a : addresses) {
      if (a.is_string()) a = ports.local_address(a.get<std::string>());
    }
  }
  return config.dump();
}

fs::path claim_directory(const fs::path& root, const std::string& ns, const std::string& claim) {
  return root / "pvc" / ns / claim;
}

std::vector<std::pair<std::string, std::string>> passed_host_environment(
    const CommandOptions& options) {
  std::vector<std::pair<std::string, std::string>> env;
  for (const std::string& k : options.pass_env) {
    const char* v = std::getenv(k.c_str());
    if (k == "PATH") {
      std::string path;
      for (const fs::path& d : options.bin_dirs) path += d.string() + ":";
      path += v ? v : "/usr/local/bin:/usr/bin:/bin";
      env.emplace_back("PATH", path);
    } else if (v != nullptr) {
      env.emplace_back(k, v);
    }
  }
  return env;
}

PodCommand build_pod_command(const json& pod, const CommandOptions& options) {
  const json meta = pod.value("metadata", json::object());
  const json spec = pod.value("spec", json::object());
  const std::string ns = str(meta, "namespace").empty() ? "default" : str(meta, "namespace");
  const std::string name = str(meta, "name");
  const std::string ref = "pod " + ns + "/" + name;
  const json containers = spec.value("containers", json::array());
  if (!containers.is_array() || containers.empty() || !containers[0].is_object()) {
    throw InvalidArgument(ref +
                          ": spec.containers is empty: the local kubelet runs the first "
                          "container's command");
  }
  const json& c = containers[0];
  PodCommand cmd;
  cmd.container = str(c, "name");

  // Volumes: the mount paths of this container and their local directories.
  std::map<std::string, json> volumes;
  for (const json& v : spec.value("volumes", json::array())) {
    if (v.is_object()) volumes[str(v, "name")] = v;
  }
  for (const json& m : c.value("volumeMounts", json::array())) {
    const std::string vname = str(m, "name"), mount = str(m, "mountPath");
    auto it = volumes.find(vname);
    if (it == volumes.end() || mount.empty()) {
      cmd.warnings.push_back("volumeMount " + vname + " at " + mount + " names no volume");
      continue;
    }
    const json& v = it->second;
    fs::path local;
    if (v.contains("persistentVolumeClaim")) {
      local = claim_directory(options.root, ns, str(v["persistentVolumeClaim"], "claimName"));
    } else if (v.contains("emptyDir")) {
      local = options.pod_dir / "volumes" / vname;
    } else if (v.contains("hostPath")) {
      local = str(v["hostPath"], "path");
    } else {
      cmd.warnings.push_back("volume " + vname + " (mounted at " + mount +
                             ") is of a type the local kubelet does not map; the path is left "
                             "as written");
      continue;
    }
    std::string sub = str(m, "subPath");
    if (!sub.empty()) local /= sub;
    cmd.volumes.push_back({vname, mount, local});
  }
  // Longest mount path first, so /data/x wins over /data.
  std::vector<VolumeMapping> by_length = cmd.volumes;
  std::sort(by_length.begin(), by_length.end(),
            [](const auto& a, const auto& b) { return a.mount_path.size() > b.mount_path.size(); });
  auto map_paths = [&](std::string s) {
    for (const VolumeMapping& v : by_length) s = replace_mount_path(s, v.mount_path, v.local);
    return s;
  };

  // Environment: passed-through host variables, then the container's env.
  std::map<std::string, std::string> vars;
  auto set = [&](const std::string& k, const std::string& v) {
    vars[k] = v;
    cmd.env.emplace_back(k, v);
  };
  for (const auto& [k, v] : passed_host_environment(options)) set(k, v);
  set("HOSTNAME", str(spec, "hostname").empty() ? name : str(spec, "hostname"));
  // longhaul-worker binds its collectives to this host instead of its TF_CONFIG host name
  // (worker/distributed cluster.h); the addresses are rewritten to it as well, for other programs.
  if (options.ports != nullptr) set("LONGHAUL_HOST_OVERRIDE", options.pod_ip);
  for (const json& e : c.value("env", json::array())) {
    const std::string k = str(e, "name");
    if (k.empty()) continue;
    std::string value;
    if (e.contains("valueFrom")) {
      const json& from = e["valueFrom"];
      bool known = false;
      if (from.contains("fieldRef")) {
        value = field_ref(pod, str(from["fieldRef"], "fieldPath"), options.pod_ip, &known);
      }
      if (!known) {
        cmd.warnings.push_back("env " + k + ": valueFrom " + from.dump() +
                               " is not supported by the local kubelet; set to \"\"");
      }
    } else {
      value = expand_references(str(e, "value"), vars);
    }
    value = map_paths(value);
    if (options.ports != nullptr && k == "TF_CONFIG") {
      value = rewrite_tf_config(value, *options.ports);
    } else if (options.ports != nullptr && k == "LONGHAUL_CHIEF_ADDRESS") {
      value = options.ports->local_address(value);
    }
    set(k, value);
  }

  // Program and arguments.
  std::vector<std::string> words;
  for (const char* key : {"command", "args"}) {
    for (const json& w : c.value(key, json::array())) {
      if (w.is_string()) words.push_back(map_paths(expand_references(w.get<std::string>(), vars)));
    }
  }
  const bool has_command =
      c.contains("command") && c["command"].is_array() && !c["command"].empty();
  if (!has_command) {
    const std::string image = str(c, "image");
    if (image.empty()) {
      throw InvalidArgument(ref + ": container " + cmd.container +
                            " has neither a command nor an image: nothing to run");
    }
    std::string entry = image_basename(image);
    if (auto it = options.entrypoints.find(image); it != options.entrypoints.end()) {
      entry = it->second;
    } else if (auto it2 = options.entrypoints.find(entry); it2 != options.entrypoints.end()) {
      entry = it2->second;
    }
    words.insert(words.begin(), entry);
  }
  words[0] = find_program(words[0], options.bin_dirs).string();
  cmd.argv = std::move(words);

  const std::string wd = str(c, "workingDir");
  cmd.working_dir = wd.empty() ? options.pod_dir : fs::path(map_paths(wd));
  return cmd;
}

}  // namespace longhaul::kubelet
