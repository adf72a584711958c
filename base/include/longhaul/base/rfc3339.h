// RFC 3339 timestamps in UTC as the Kubernetes API writes them: metav1.Time
// ("2026-11-21T13:20:39Z", whole seconds) and metav1.MicroTime ("2026-11-21T13:20:39.000007Z").
// The one formatter of the operator, its test servers, kubelets and benchmarks. Parsing stays
// with the TrainingJob API (longhaul/api/trainingjob.h: parse_time), which accepts offsets too.
//
// Thread-safety: pure functions (gmtime_r).
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace longhaul {

// `t` rounded down to the second: "2026-11-21T13:20:39Z".
inline std::string format_rfc3339(std::chrono::system_clock::time_point t) {
  const auto secs = std::chrono::floor<std::chrono::seconds>(t);
  const std::time_t tt = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buf, n);
}

// `t` rounded down to the microsecond: "2026-11-21T13:20:39.000007Z".
inline std::string format_rfc3339_micro(std::chrono::system_clock::time_point t) {
  const auto secs = std::chrono::floor<std::chrono::seconds>(t);
  const auto micros = std::chrono::floor<std::chrono::microseconds>(t - secs).count();
  std::string out = format_rfc3339(secs);
  char frac[32];
  std::snprintf(frac, sizeof frac, ".%06lldZ", static_cast<long long>(micros));
  out.pop_back();  // the "Z"
  return out + frac;
}

}  // namespace longhaul
