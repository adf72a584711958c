// A fresh directory for one test (or one fixture), removed with everything in it when the object
// goes away. Header-only; every test built with longhaul_add_test has tests/support on its
// include path.
//
//   longhaul::testing::TempDir dir("kube_config_test");
//   std::string kubeconfig = dir.file("config", text);   // writes it, returns its path
//   load(dir / "config");
//
// A TempDir converts to the path it names, so it can be handed straight to anything that takes
// a `const std::filesystem::path&`. A fixture that wants the files of a failed test kept for a
// look calls `keep()` from its TearDown when `HasFailure()`.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include <stdlib.h>

namespace longhaul::testing {

class TempDir {
 public:
  // Under $TMPDIR (else /tmp), named `<prefix>.XXXXXX` by mkdtemp(3), so tests running in
  // parallel, or the same test twice, never share one.
  explicit TempDir(std::string_view prefix = "longhaul-test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + ".XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  ~TempDir() {
    if (keep_) {
      std::cerr << "kept for inspection: " << path_.string() << "\n";
      return;
    }
    // A test may have taken away write permission to check a refusal: give it back first.
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec)) {
        std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
        ec.clear();
      }
    }
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  operator const std::filesystem::path&() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

  // Writes `content` to `name` inside the directory (replacing it) and returns its path.
  std::string file(std::string_view name, std::string_view content) const {
    const std::filesystem::path p = path_ / name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out.flush()) throw std::runtime_error("cannot write " + p.string());
    return p.string();
  }

  // Leaves the directory and its files on disk when the object goes away (and says where).
  void keep() { keep_ = true; }

 private:
  std::filesystem::path path_;
  bool keep_ = false;
};

// Points $TMPDIR into `dir` while it lives (restoring the previous value after), so that every
// TempDir a child process makes lies inside `dir` and is removed with it. For death tests in the
// "threadsafe" style: the child re-runs the whole test body, and exits without running
// destructors, so a TempDir of its own would stay behind.
//
//   TempDir dir;
//   const ChildTempDirsInside children(dir);
//   EXPECT_EXIT(...);
class ChildTempDirsInside {
 public:
  explicit ChildTempDirsInside(const TempDir& dir) {
    if (const char* old = std::getenv("TMPDIR")) previous_ = old;
    ::setenv("TMPDIR", dir.path().c_str(), 1);
  }
  ~ChildTempDirsInside() {
    if (previous_) {
      ::setenv("TMPDIR", previous_->c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }
  ChildTempDirsInside(const ChildTempDirsInside&) = delete;
  ChildTempDirsInside& operator=(const ChildTempDirsInside&) = delete;

 private:
  std::optional<std::string> previous_;
};

}  // namespace longhaul::testing
