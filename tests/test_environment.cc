// Linked into every GoogleTest binary by longhaul_add_test: makes LONGHAUL_SOURCE_DIR and
// LONGHAUL_BINARY_DIR available to tests run outside ctest too (a test binary started by hand or
// under a debugger). ctest cannot pass two variables through gtest_discover_tests (it splits the
// ENVIRONMENT list), so the paths are compiled in; a value already in the environment wins.
#include <cstdlib>

namespace {

struct TestEnvironment {
  TestEnvironment() {
    setenv("LONGHAUL_SOURCE_DIR", LONGHAUL_TEST_SOURCE_DIR, /*overwrite=*/0);
    setenv("LONGHAUL_BINARY_DIR", LONGHAUL_TEST_BINARY_DIR, /*overwrite=*/0);
  }
};

const TestEnvironment test_environment;

}  // namespace
