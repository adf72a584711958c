// A TempDir for the running GoogleTest test: named after it, and left on disk (with its path on
// stderr) when the test failed, so a failing test's logdirs, configs and outputs can be read.
//
//   class WorkerCliTest : public ::testing::Test {
//    protected:
//     longhaul::testing::TestTempDir dir_{"worker_cli"};   // worker_cli_<TestName>.XXXXXX
//   };
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "longhaul/testing/temp_dir.h"

namespace longhaul::testing {

class TestTempDir : public TempDir {
 public:
  explicit TestTempDir(std::string_view prefix) : TempDir(name_for_current_test(prefix)) {}
  ~TestTempDir() {
    if (::testing::Test::HasFailure()) keep();
  }

 private:
  static std::string name_for_current_test(std::string_view prefix) {
    std::string name(prefix);
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
      name += std::string("_") + info->name();
    }
    // A parameterized test's name has a '/' (Suite/Test/0): keep it one folder.
    std::replace(name.begin(), name.end(), '/', '_');
    return name;
  }
};

}  // namespace longhaul::testing
