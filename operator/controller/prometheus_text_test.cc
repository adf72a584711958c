// The Prometheus text format reader: sample lines as exporters write them (labels with escaped
// quotes and braces, exponents, timestamps, CRLF), and what is skipped.
#include "longhaul/controller/prometheus_text.h"

#include <cmath>

#include <gtest/gtest.h>

namespace longhaul::controller {
namespace {

struct LineCase {
  std::string name;
  std::string line;
  std::optional<std::tuple<std::string, std::string, double>> want;  // name, labels, value
};
void PrintTo(const LineCase& c, std::ostream* os) { *os << c.name; }

class PrometheusLineTest : public ::testing::TestWithParam<LineCase> {};

TEST_P(PrometheusLineTest, ReadsASampleOrSkipsTheLine) {
  const LineCase& c = GetParam();
  const auto got = parse_prometheus_line(c.line);
  ASSERT_EQ(got.has_value(), c.want.has_value()) << c.line;
  if (!got) return;
  EXPECT_EQ(got->name, std::get<0>(*c.want));
  EXPECT_EQ(got->labels, std::get<1>(*c.want));
  EXPECT_EQ(got->value, std::get<2>(*c.want));
}

INSTANTIATE_TEST_SUITE_P(
    Table, PrometheusLineTest,
    ::testing::Values(
        LineCase{"Plain", "up 1", std::make_tuple("up", "", 1.0)},
        LineCase{"Labels", "longhaul_train_global_step{rank=\"0\"} 1200",
                 std::make_tuple("longhaul_train_global_step", "rank=\"0\"", 1200.0)},
        LineCase{"ExponentAndTimestamp", "a_b:c{x=\"1\"} 1.2e+06 1763730000000",
                 std::make_tuple("a_b:c", "x=\"1\"", 1.2e6)},
        LineCase{"CrLf", "a 2e6\r", std::make_tuple("a", "", 2e6)},
        LineCase{"LabelValuesWithBracesQuotesAndSpaces", "m{note=\"a } \\\" b\",r=\"0\"} 9",
                 std::make_tuple("m", "note=\"a } \\\" b\",r=\"0\"", 9.0)},
        LineCase{"Tabs", "m\t7", std::make_tuple("m", "", 7.0)},
        LineCase{"Help", "# HELP m Something.", std::nullopt},
        LineCase{"Type", "# TYPE m gauge", std::nullopt}, LineCase{"Blank", "", std::nullopt},
        LineCase{"UnclosedLabels", "m{rank=\"0\" 17", std::nullopt},
        LineCase{"NoValue", "m", std::nullopt}, LineCase{"NotANumber", "m abc", std::nullopt},
        LineCase{"NoName", "{} 3", std::nullopt},
        LineCase{"TrailingGarbage", "m 3x", std::nullopt}));

TEST(PrometheusLineTest, SpecialValuesAreNumbers) {
  EXPECT_TRUE(std::isnan(parse_prometheus_line("m NaN")->value));
  EXPECT_EQ(parse_prometheus_line("m +Inf")->value, HUGE_VAL);
  EXPECT_EQ(parse_prometheus_line("m -Inf")->value, -HUGE_VAL);
}

TEST(FirstSamplesTest, TheFirstWellFormedSampleOfEachNamedMetric) {
  const std::string exposition =
      "# TYPE a gauge\n"
      "a_extra 99\n"       // another metric whose name starts the same
      "a{rank=\"0\" 17\n"  // malformed: skipped
      "a{rank=\"0\"} 5\n"  // the first series wins
      "a{rank=\"1\"} 6\r\n"
      "b 8";  // no final newline
  const auto got = first_samples(exposition, {"a", "b", "c"});
  EXPECT_EQ(got, (std::map<std::string, double, std::less<>>{{"a", 5}, {"b", 8}}));
  EXPECT_TRUE(first_samples("", {"a"}).empty());
}

}  // namespace
}  // namespace longhaul::controller
