// Tests of the operator's metrics as a scrape shows them: the per-job failure budget series
// appear with the job's namespace and name, follow its failures, and vanish with the job.
#include "metrics.h"

#include <string>

#include <gtest/gtest.h>

namespace longhaul::operator_cli {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(OperatorMetricsTest, ARestartingJobShowsTheFailuresItSpentAgainstItsBackoffLimit) {
  OperatorMetrics metrics("127.0.0.1", 0, "test");
  metrics.job_failure_budget("team-a/llm", 0, 6);
  metrics.job_failure_budget("team-b/llm", 1, 3);
  metrics.job_failure_budget("team-a/llm", 5, 6);
  const std::string text = metrics.text();
  EXPECT_TRUE(has_line(text, R"(longhaul_operator_job_failures{name="llm",namespace="team-a"} 5)"))
      << text;
  EXPECT_TRUE(
      has_line(text, R"(longhaul_operator_job_backoff_limit{name="llm",namespace="team-a"} 6)"))
      << text;
  EXPECT_TRUE(has_line(text, R"(longhaul_operator_job_failures{name="llm",namespace="team-b"} 1)"))
      << text;
  EXPECT_TRUE(
      has_line(text, R"(longhaul_operator_job_backoff_limit{name="llm",namespace="team-b"} 3)"))
      << text;
}

TEST(OperatorMetricsTest, ADeletedJobsSeriesAreGoneFromTheScrape) {
  OperatorMetrics metrics("127.0.0.1", 0, "test");
  metrics.job_failure_budget("team-a/llm", 2, 6);
  metrics.job_failure_budget("team-a/other", 1, 6);
  metrics.drop_job_failure_budget("team-a/llm");
  metrics.drop_job_failure_budget("team-a/never-seen");  // no-op
  const std::string text = metrics.text();
  EXPECT_EQ(text.find(R"(name="llm")"), std::string::npos) << text;
  EXPECT_TRUE(
      has_line(text, R"(longhaul_operator_job_failures{name="other",namespace="team-a"} 1)"))
      << text;
  // A job of the same name made again starts from its own status, not the old series.
  metrics.job_failure_budget("team-a/llm", 0, 2);
  EXPECT_TRUE(has_line(metrics.text(),
                       R"(longhaul_operator_job_failures{name="llm",namespace="team-a"} 0)"));
}

TEST(OperatorMetricsTest, AReplicaThatStopsLeadingExportsNoJobsBudget) {
  OperatorMetrics metrics("127.0.0.1", 0, "test");
  metrics.job_failure_budget("team-a/llm", 2, 6);
  metrics.job_failure_budget("team-b/llm", 1, 3);
  metrics.drop_job_failure_budgets();
  const std::string text = metrics.text();
  EXPECT_EQ(text.find("longhaul_operator_job_failures{"), std::string::npos) << text;
  EXPECT_EQ(text.find("longhaul_operator_job_backoff_limit{"), std::string::npos) << text;
}

}  // namespace
}  // namespace longhaul::operator_cli
