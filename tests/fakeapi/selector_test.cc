// Label and field selector parsing and matching (table-driven).
#include "selector.h"

#include <gtest/gtest.h>

namespace longhaul::fakeapi {
namespace {

struct LabelCase {
  std::string selector;
  json labels;
  bool matches;
};

class LabelSelectorTest : public ::testing::TestWithParam<LabelCase> {};

TEST_P(LabelSelectorTest, Matches) {
  const LabelCase& c = GetParam();
  EXPECT_EQ(LabelSelector::parse(c.selector).matches(c.labels), c.matches)
      << c.selector << " on " << c.labels.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LabelSelectorTest,
    ::testing::Values(
        LabelCase{"a=b", {{"a", "b"}}, true}, LabelCase{"a=b", {{"a", "c"}}, false},
        LabelCase{"a==b", {{"a", "b"}}, true}, LabelCase{"a!=b", json::object(), true},
        LabelCase{"a!=b", {{"a", "b"}}, false}, LabelCase{"a in (b, c)", {{"a", "c"}}, true},
        LabelCase{"a in (b,c)", json::object(), false},
        LabelCase{"a notin (b,c)", json::object(), true},
        LabelCase{"a notin (b,c)", {{"a", "b"}}, false}, LabelCase{"a", {{"a", ""}}, true},
        LabelCase{"a", json::object(), false}, LabelCase{"!a", json::object(), true},
        LabelCase{"!a", {{"a", "x"}}, false},
        LabelCase{"longhaul.dev/job-name=j,longhaul.dev/role=chief",
                  {{"longhaul.dev/job-name", "j"}, {"longhaul.dev/role", "chief"}},
                  true},
        LabelCase{" a = b , c ", {{"a", "b"}, {"c", "1"}}, true}, LabelCase{"", nullptr, true}));

TEST(LabelSelectorErrors, MalformedSelectorsAreBadRequests) {
  for (const char* bad : {"a in b", "a in (b", "a=b c", "a>1", "=b", "a=(b)"}) {
    try {
      LabelSelector::parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const StatusError& e) {
      EXPECT_EQ(e.http_status(), 400) << bad;
    }
  }
}

TEST(FieldSelector, SupportsPodFieldsAndRejectsOthers) {
  ResourceType pods{"", "v1", "pods", "pod", "Pod", true, true, false};
  json pod = {{"metadata", {{"name", "p"}, {"namespace", "ns"}}},
              {"spec", {{"nodeName", "n1"}}},
              {"status", {{"phase", "Running"}}}};
  EXPECT_TRUE(FieldSelector::parse("spec.nodeName=n1,status.phase==Running", pods).matches(pod));
  EXPECT_FALSE(FieldSelector::parse("status.phase!=Running", pods).matches(pod));
  EXPECT_TRUE(FieldSelector::parse("metadata.namespace=ns", pods).matches(pod));
  EXPECT_THROW(FieldSelector::parse("spec.containers=x", pods), StatusError);
  ResourceType jobs{"longhaul.dev", "v1alpha1", "trainingjobs", "trainingjob",
                    "TrainingJob",  true,       true,           true};
  EXPECT_THROW(FieldSelector::parse("status.phase=Running", jobs), StatusError);
  EXPECT_TRUE(FieldSelector::parse("metadata.name=p", jobs).matches(pod));
}

}  // namespace
}  // namespace longhaul::fakeapi
