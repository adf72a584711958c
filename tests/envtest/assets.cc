// Finding, checking and unpacking the control plane's binaries (see control_plane.h).
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/envtest/control_plane.h"

namespace longhaul::envtest {
namespace {

bool is_executable_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

std::string sha256_hex(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound("envtest: cannot read " + path.string());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, digest, &n);
  EVP_MD_CTX_free(ctx);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

// The checksum SHA256SUMS (in `folder`) lists for `file_name`; "" when not listed or no file.
std::string listed_checksum(const fs::path& folder, const std::string& file_name) {
  std::ifstream sums(folder / "SHA256SUMS");
  std::string line;
  while (std::getline(sums, line)) {
    std::istringstream fields(line);
    std::string sum, name;
    fields >> sum >> name;
    if (!name.empty() && name[0] == '*') name.erase(0, 1);  // binary-mode marker
    if (name == file_name) return sum;
  }
  return "";
}

fs::path cache_root() {
  if (const char* dir = std::getenv("LONGHAUL_BINARY_DIR"); dir != nullptr && *dir != '\0') {
    return fs::path(dir) / "envtest-assets";
  }
  return fs::path(LONGHAUL_ENVTEST_BUILD_DIR) / "envtest-assets";
}

// `xz -dc compressed > target`, written to a temporary file and renamed into place under a lock
// on the cache folder, so that concurrent test binaries unpack once and never see half a file.
fs::path unpack(const fs::path& compressed, const std::string& name, const std::string& sha) {
  const fs::path folder = cache_root() / sha.substr(0, 16);
  const fs::path target = folder / name;
  if (is_executable_file(target)) return target;
  fs::create_directories(folder);
  const fs::path lock_path = folder / ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) throw_errno("envtest: cannot create the unpack lock", lock_path.string(), errno);
  ::flock(lock_fd, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() {
      ::flock(fd, LOCK_UN);
      ::close(fd);
    }
  } unlock{lock_fd};
  if (is_executable_file(target)) return target;  // another process unpacked it meanwhile

  const fs::path temp = folder / (name + ".tmp." + std::to_string(::getpid()));
  const int out = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (out < 0) throw_errno("envtest: cannot write", temp.string(), errno);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::execlp("xz", "xz", "-dc", compressed.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out);
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::error_code ec;
    fs::remove(temp, ec);
    throw Internal("envtest: `xz -dc " + compressed.string() + "` failed (exit " +
                   std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                   "); install xz-utils (scripts/install-deps.sh) or unpack it yourself into " +
                   "$LONGHAUL_KUBE_ASSETS");
  }
  ::chmod(temp.c_str(), 0755);
  fs::rename(temp, target);
  return target;
}

// `name` in `folder`, plain and executable or compressed (name.xz, verified and unpacked).
std::optional<fs::path> resolve(const fs::path& folder, const std::string& name) {
  if (is_executable_file(folder / name)) return folder / name;
  const fs::path compressed = folder / (name + ".xz");
  std::error_code ec;
  if (!fs::is_regular_file(compressed, ec)) return std::nullopt;
  const std::string sha = sha256_hex(compressed);
  const std::string expected = listed_checksum(folder, name + ".xz");
  if (!expected.empty() && expected != sha) {
    throw DataLoss("envtest: " + compressed.string() + " has SHA-256 " + sha + " but " +
                   (folder / "SHA256SUMS").string() + " lists " + expected +
                   "; the file is corrupt or was replaced: fetch it again");
  }
  return unpack(compressed, name, sha);
}

// The folders searched when LONGHAUL_KUBE_ASSETS is unset: <dir>/shared/kube for the source
// tree's parent and each of its ancestors (CI runs a fresh clone with shared/ beside it; a git
// worktree sits one level deeper).
std::vector<fs::path> default_folders() {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(source_dir(), ec).parent_path();
  while (true) {
    out.push_back(dir / "shared" / "kube");
    if (dir == dir.root_path() || dir.empty()) break;
    dir = dir.parent_path();
  }
  return out;
}

std::optional<fs::path> etcd_on_path() {
  if (is_executable_file("/usr/bin/etcd")) return fs::path("/usr/bin/etcd");
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path == nullptr ? "" : path);
  for (std::string d; std::getline(dirs, d, ':');) {
    if (!d.empty() && is_executable_file(fs::path(d) / "etcd")) return fs::path(d) / "etcd";
  }
  return std::nullopt;
}

}  // namespace

fs::path source_dir() {
  if (const char* dir = std::getenv("LONGHAUL_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return LONGHAUL_ENVTEST_SOURCE_DIR;
}

std::string assets_help() {
  return "the real-API-server tests need kube-apiserver and kube-controller-manager (v1.26 or "
         "later; plain or .xz) and etcd: set LONGHAUL_KUBE_ASSETS to a folder holding them (e.g. "
         "the official binaries from https://dl.k8s.io/v1.26.4/bin/linux/amd64/ plus etcd), or "
         "place this project's shared/kube folder beside the source tree; etcd may also come "
         "from Debian (`apt-get install etcd-server`, scripts/install-deps.sh)";
}

std::optional<Assets> find_assets(std::string* why) {
  std::vector<fs::path> folders;
  if (const char* env = std::getenv("LONGHAUL_KUBE_ASSETS"); env != nullptr && *env != '\0') {
    folders.push_back(env);
  } else {
    folders = default_folders();
  }
  for (const fs::path& folder : folders) {
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) continue;
    auto apiserver = resolve(folder, "kube-apiserver");
    if (!apiserver) continue;
    auto controller_manager = resolve(folder, "kube-controller-manager");
    if (!controller_manager) {
      if (why != nullptr) {
        *why = "kube-controller-manager is missing in " + folder.string() + ": " + assets_help();
      }
      return std::nullopt;
    }
    auto etcd = resolve(folder, "etcd");
    if (!etcd) etcd = etcd_on_path();
    if (!etcd) {
      if (why != nullptr) {
        *why = "no etcd (neither in " + folder.string() +
               " nor /usr/bin/etcd nor on PATH): " + assets_help();
      }
      return std::nullopt;
    }
    return Assets{*apiserver, *controller_manager, *etcd, folder};
  }
  if (why != nullptr) {
    std::string searched;
    for (const fs::path& f : folders) searched += (searched.empty() ? "" : ", ") + f.string();
    *why = "no kube-apiserver found (searched " + searched + "): " + assets_help();
  }
  return std::nullopt;
}

}  // namespace longhaul::envtest
