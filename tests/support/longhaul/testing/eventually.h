// Waiting on a condition with a deadline, for tests whose state has no change notification to
// wait on (another process, files, ports): polls `condition` every `poll` until it holds or
// `timeout` passes, and returns its last value. Header-only; every test built with
// longhaul_add_test has tests/support on its include path.
//
//   ASSERT_TRUE(longhaul::testing::eventually([&] { return fs::exists(marker); }, 30s));
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace longhaul::testing {

inline bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
                       std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(poll);
  }
  return condition();
}

}  // namespace longhaul::testing
