// Reading the Prometheus text exposition format (version 0.0.4, what longhaul-worker's /metrics
// serves): the operator reads a few gauges of the chief this way (progress.h).
//
// A line is a comment ("# HELP", "# TYPE", any "#"), blank, or a sample:
//   name{label="value",...} value [timestamp]
// with label values that may hold escaped quotes, braces and spaces; values in Go's float syntax
// (1200, 1.2e+06, NaN, +Inf). Lines end in "\n" (a "\r" before it is tolerated). Malformed lines
// are skipped, never an error: an exposition is read for what it says, whatever else it holds.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::controller {

struct PrometheusSample {
  std::string_view name;    // the metric name
  std::string_view labels;  // the text between the braces, as written ("" when none)
  double value = 0;         // timestamps are ignored
};

// One line; nullopt for a comment, a blank line or a malformed sample. The views point into
// `line`.
std::optional<PrometheusSample> parse_prometheus_line(std::string_view line);

// The value of the first sample of each metric named in `names` (whatever its labels), keyed by
// name; a metric without a well-formed sample is absent.
std::map<std::string, double, std::less<>> first_samples(
    std::string_view exposition, const std::vector<std::string_view>& names);

}  // namespace longhaul::controller
