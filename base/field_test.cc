#include "longhaul/base/field.h"

#include <array>
#include <vector>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"

namespace longhaul::field {
namespace {

TEST(FieldTest, PathsNameNestedFieldsAndListElements) {
  EXPECT_EQ(path("spec.runPolicy", "backoffLimit"), "spec.runPolicy.backoffLimit");
  EXPECT_EQ(path("", "training"), "training");
  EXPECT_EQ(element(path("spec.logdir", "accessModes"), 2), "spec.logdir.accessModes[2]");
}

TEST(FieldTest, OneOfListsTheValuesInTheOrderGiven) {
  EXPECT_EQ(one_of(std::vector<std::string>{"tiny", "small-4x256", "gpt2-124m"}),
            "tiny, small-4x256, gpt2-124m");
  EXPECT_EQ(one_of(std::array<const char*, 2>{"Retain", "Delete"}), "Retain, Delete");
  EXPECT_EQ(one_of(std::vector<std::string>{}), "");
}

TEST(FieldTest, FailThrowsInvalidArgumentNamingTheField) {
  try {
    fail("spec.replicaSpecs.Worker.replicas", "must be >= 0");
    FAIL() << "fail() returned";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "spec.replicaSpecs.Worker.replicas: must be >= 0");
  }
}

}  // namespace
}  // namespace longhaul::field
