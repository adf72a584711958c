// Kubeconfig and in-cluster configuration (see config.h).
#include "longhaul/kube/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include "longhaul/base/error.h"
#include "longhaul/base/field.h"
#include "longhaul/base/strings.h"

namespace longhaul::kube {

namespace fs = std::filesystem;

namespace {

std::string getenv_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// Reads a whole file; nullopt when it cannot be opened.
std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Standard base64 (RFC 4648) with whitespace ignored; nullopt on an invalid character.
std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (c == '=') break;
    int v = value(c);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

class KubeconfigReader {
 public:
  KubeconfigReader(std::string path, YAML::Node root) : path_(std::move(path)), root_(root) {}

  [[noreturn]] void fail(const std::string& what) const {
    field::fail("kubeconfig " + path_, what);
  }

  std::string string_field(const YAML::Node& node, const char* key) const {
    const YAML::Node value = node[key];
    if (!value || value.IsNull()) return "";
    if (!value.IsScalar()) fail(std::string("field '") + key + "' must be a string");
    return value.as<std::string>();
  }

  // The entry of list `list` ("clusters", "contexts", "users") with `name`, returning its
  // `inner` map ("cluster", "context", "user").
  YAML::Node named_entry(const char* list, const char* inner, const std::string& name,
                         const std::string& referrer) const {
    const YAML::Node entries = root_[list];
    if (entries && !entries.IsSequence()) fail(std::string("'") + list + "' must be a list");
    if (entries) {
      for (const auto& entry : entries) {
        if (string_field(entry, "name") == name) {
          YAML::Node body = entry[inner];
          if (!body || !body.IsMap()) {
            fail(std::string(inner) + " '" + name + "' has no '" + inner + "' map");
          }
          return body;
        }
      }
    }
    throw NotFound("kubeconfig " + path_ + ": " + referrer + " names " + inner + " '" + name +
                   "' but '" + list + "' has no entry with that name");
  }

  // Resolves a file reference relative to the kubeconfig's folder and checks it exists.
  std::string file_field(const YAML::Node& node, const char* key, const std::string& where) const {
    std::string value = string_field(node, key);
    if (value.empty()) return "";
    fs::path p(value);
    if (p.is_relative()) p = fs::path(path_).parent_path() / p;
    if (!fs::exists(p)) {
      throw NotFound("kubeconfig " + path_ + ": " + where + " field '" + key + "' names " +
                     p.string() + " which does not exist");
    }
    return p.string();
  }

  std::string data_field(const YAML::Node& node, const char* key, const std::string& where) const {
    std::string value = string_field(node, key);
    if (value.empty()) return "";
    auto decoded = base64_decode(value);
    if (!decoded) fail(where + " field '" + key + "' is not valid base64");
    return *decoded;
  }

  const std::string& path() const { return path_; }
  const YAML::Node& root() const { return root_; }

 private:
  std::string path_;
  YAML::Node root_;
};

// The server and TLS settings of `cluster` (named `cluster_where` in errors) into `config`.
void read_cluster(const KubeconfigReader& reader, const YAML::Node& cluster,
                  const std::string& cluster_where, ClusterConfig& config) {
  config.server = reader.string_field(cluster, "server");
  if (config.server.empty()) reader.fail(cluster_where + " has no 'server'");
  config.tls.ca_file = reader.file_field(cluster, "certificate-authority", cluster_where);
  config.tls.ca_pem = reader.data_field(cluster, "certificate-authority-data", cluster_where);
  if (YAML::Node skip = cluster["insecure-skip-tls-verify"]; skip && skip.IsScalar()) {
    try {
      config.tls.insecure_skip_tls_verify = skip.as<bool>();
    } catch (const YAML::Exception&) {
      reader.fail(cluster_where + " field 'insecure-skip-tls-verify' must be true or false");
    }
  }
}

// The credentials of user `user_name` into `config`; refuses a certificate without its key (or
// the reverse) and the authentication kinds longhaul does not support, naming what works.
void read_user(const KubeconfigReader& reader, const std::string& user_name,
               const std::string& context_where, ClusterConfig& config) {
  YAML::Node user = reader.named_entry("users", "user", user_name, context_where);
  const std::string user_where = "user '" + user_name + "'";
  config.token = reader.string_field(user, "token");
  config.token_file = reader.file_field(user, "tokenFile", user_where);
  config.tls.client_cert_file = reader.file_field(user, "client-certificate", user_where);
  config.tls.client_cert_pem = reader.data_field(user, "client-certificate-data", user_where);
  config.tls.client_key_file = reader.file_field(user, "client-key", user_where);
  config.tls.client_key_pem = reader.data_field(user, "client-key-data", user_where);
  const bool has_cert = !config.tls.client_cert_file.empty() || !config.tls.client_cert_pem.empty();
  const bool has_key = !config.tls.client_key_file.empty() || !config.tls.client_key_pem.empty();
  if (has_cert != has_key) {
    reader.fail(user_where + " has a client " + (has_cert ? "certificate" : "key") +
                " but no client " +
                (has_cert ? "key ('client-key' or 'client-key-data')"
                          : "certificate ('client-certificate' or "
                            "'client-certificate-data')"));
  }
  if (config.token.empty() && config.token_file.empty() && !has_cert) {
    if (user["exec"] || user["auth-provider"]) {
      reader.fail(user_where +
                  " authenticates with an exec or auth-provider plugin, which longhaul does not "
                  "run: use a 'token', 'tokenFile' or client certificate");
    }
    if (user["username"]) {
      reader.fail(user_where +
                  " uses basic auth, which longhaul does not support: use a "
                  "'token', 'tokenFile' or client certificate");
    }
  }
}

std::string default_kubeconfig_path() {
  std::string env = getenv_or_empty("KUBECONFIG");
  if (!env.empty()) {
    // A colon-separated list: the first existing file wins (merging is not supported).
    std::stringstream list(env);
    std::string entry;
    std::string first;
    while (std::getline(list, entry, ':')) {
      if (entry.empty()) continue;
      if (first.empty()) first = entry;
      if (fs::exists(entry)) return entry;
    }
    if (!first.empty()) return first;
  }
  std::string home = getenv_or_empty("HOME");
  if (home.empty()) {
    throw NotFound("no kubeconfig: KUBECONFIG and HOME are unset (pass --kubeconfig)");
  }
  return home + "/.kube/config";
}

}  // namespace

bool running_in_cluster() {
  return !getenv_or_empty("KUBERNETES_SERVICE_HOST").empty() &&
         !getenv_or_empty("KUBERNETES_SERVICE_PORT").empty();
}

ClusterConfig load_in_cluster_config(const InClusterPaths& paths) {
  std::string host = getenv_or_empty("KUBERNETES_SERVICE_HOST");
  std::string port = getenv_or_empty("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    throw FailedPrecondition(
        "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (run "
        "inside a pod, or pass a kubeconfig)");
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";  // IPv6 literal
  ClusterConfig config;
  config.server = "https://" + host + ":" + port;
  config.source = "in-cluster";
  if (!fs::exists(paths.token_file)) {
    throw NotFound("in-cluster config: service-account token " + paths.token_file +
                   " does not exist (is automountServiceAccountToken disabled?)");
  }
  config.token_file = paths.token_file;
  if (!fs::exists(paths.ca_file)) {
    throw NotFound("in-cluster config: cluster CA " + paths.ca_file + " does not exist");
  }
  config.tls.ca_file = paths.ca_file;
  if (auto ns = read_file(paths.namespace_file)) {
    std::string trimmed(trim(*ns));
    if (!trimmed.empty()) config.default_namespace = trimmed;
  }
  return config;
}

ClusterConfig load_kubeconfig(const std::string& path_arg, const std::string& context_arg) {
  const std::string path = path_arg.empty() ? default_kubeconfig_path() : path_arg;
  auto text = read_file(path);
  if (!text) throw NotFound("kubeconfig " + path + " cannot be read (does it exist?)");
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    throw InvalidArgument("kubeconfig " + path + " is not valid YAML: " + e.what());
  }
  if (!root.IsMap()) throw InvalidArgument("kubeconfig " + path + " is not a YAML map");
  KubeconfigReader reader(path, root);

  std::string context_name = context_arg;
  if (context_name.empty()) {
    context_name = reader.string_field(root, "current-context");
    if (context_name.empty()) {
      reader.fail("no 'current-context' is set and no context was requested (pass --context)");
    }
  }
  const std::string context_where = "context '" + context_name + "'";
  YAML::Node context = reader.named_entry("contexts", "context", context_name,
                                          context_arg.empty() ? "current-context" : "--context");
  const std::string cluster_name = reader.string_field(context, "cluster");
  if (cluster_name.empty()) reader.fail(context_where + " has no 'cluster'");
  YAML::Node cluster = reader.named_entry("clusters", "cluster", cluster_name, context_where);
  const std::string cluster_where = "cluster '" + cluster_name + "'";

  ClusterConfig config;
  config.source = "kubeconfig " + path + " context " + context_name;
  read_cluster(reader, cluster, cluster_where, config);
  if (std::string ns = reader.string_field(context, "namespace"); !ns.empty()) {
    config.default_namespace = ns;
  }

  const std::string user_name = reader.string_field(context, "user");
  if (!user_name.empty()) read_user(reader, user_name, context_where, config);
  return config;
}

ClusterConfig load_default_config(const std::string& kubeconfig_path, const std::string& context) {
  if (kubeconfig_path.empty() && context.empty() && running_in_cluster()) {
    return load_in_cluster_config();
  }
  return load_kubeconfig(kubeconfig_path, context);
}

CpprestTransportOptions transport_options(const ClusterConfig& config) {
  CpprestTransportOptions options;
  options.server = config.server;
  options.tls = config.tls;
  return options;
}

TokenSource::TokenSource(std::string fixed_token, std::string token_file)
    : fixed_token_(std::move(fixed_token)), token_file_(std::move(token_file)) {}

std::string TokenSource::token() {
  if (token_file_.empty()) return fixed_token_;
  MutexLock lock(mu_);
  struct stat st {};
  if (::stat(token_file_.c_str(), &st) != 0) {
    if (!cached_.empty()) return cached_;  // mid-rotation: keep using the last token
    throw NotFound("bearer token file " + token_file_ + " does not exist");
  }
  FileStamp now{st.st_ino,
                static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
                static_cast<long long>(st.st_size)};
  if (now == stamp_ && !cached_.empty()) return cached_;
  auto text = read_file(token_file_);
  if (!text) {
    if (!cached_.empty()) return cached_;
    throw NotFound("bearer token file " + token_file_ + " cannot be read");
  }
  cached_ = std::string(trim(*text));
  stamp_ = now;
  return cached_;
}

void TokenSource::invalidate() {
  MutexLock lock(mu_);
  stamp_ = FileStamp{};
}

}  // namespace longhaul::kube
