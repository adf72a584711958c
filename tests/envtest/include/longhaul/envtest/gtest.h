// GoogleTest glue for suites that run against the real API server: a fixture base that gets the
// process-wide control plane (skipping the test, with the reason and how to provide the
// binaries, when they are missing) and hands each test a fresh namespace; fresh_namespace() is
// also there for fixtures that hold the plane themselves (tests/operator's scenario backends).
//
// Register such a suite with longhaul_add_real_server_test (tests/envtest/CMakeLists.txt): the
// whole binary is one ctest test labelled `real`, so it starts one control plane, not one per
// test case.
//
// Thread-safety: used from the test thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <string>

#include <gtest/gtest.h>

#include "longhaul/envtest/control_plane.h"

namespace longhaul::envtest {

// A new namespace (with its default ServiceAccount) on `plane`, named after the running test:
// "<test>-<n>", lower-cased and cut to a valid DNS label.
inline std::string fresh_namespace(ControlPlane& plane) {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string base = info == nullptr ? "test" : info->name();
  std::string ns;
  for (char c : base) {
    const unsigned char u = static_cast<unsigned char>(c);
    ns += std::isalnum(u) ? static_cast<char>(std::tolower(u)) : '-';
  }
  ns = ns.substr(0, 50);
  while (!ns.empty() && ns.back() == '-') ns.pop_back();
  if (ns.empty() || !std::isalpha(static_cast<unsigned char>(ns[0]))) ns = "t" + ns;
  ns += "-" + std::to_string(++counter);
  plane.ensure_namespace(ns);
  return ns;
}

class RealServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    plane_ = shared_control_plane(&why);
    if (plane_ == nullptr) GTEST_SKIP() << why;
  }
  ControlPlane& plane() const { return *plane_; }
  std::string fresh_namespace() { return envtest::fresh_namespace(*plane_); }

 private:
  ControlPlane* plane_ = nullptr;
};

}  // namespace longhaul::envtest
