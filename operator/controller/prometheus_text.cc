// The Prometheus text format reader (see prometheus_text.h).
#include "longhaul/controller/prometheus_text.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace longhaul::controller {

std::optional<PrometheusSample> parse_prometheus_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty() || line[0] == '#') return std::nullopt;
  size_t i = 0;
  while (i < line.size() &&
         (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_' || line[i] == ':')) {
    ++i;
  }
  if (i == 0) return std::nullopt;
  PrometheusSample sample;
  sample.name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    const size_t open = i;
    bool quoted = false;
    for (++i; i < line.size(); ++i) {
      if (quoted && line[i] == '\\') {
        ++i;  // an escaped character inside a label value
      } else if (line[i] == '"') {
        quoted = !quoted;
      } else if (!quoted && line[i] == '}') {
        break;
      }
    }
    if (i >= line.size()) return std::nullopt;
    sample.labels = line.substr(open + 1, i - open - 1);
    ++i;
  }
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  const std::string value(line.substr(i, line.find_first_of(" \t", i) - i));
  if (value.empty()) return std::nullopt;
  char* end = nullptr;
  sample.value = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size()) return std::nullopt;
  return sample;
}

std::map<std::string, double, std::less<>> first_samples(
    std::string_view exposition, const std::vector<std::string_view>& names) {
  std::map<std::string, double, std::less<>> first;
  size_t pos = 0;
  while (pos < exposition.size() && first.size() < names.size()) {
    size_t eol = exposition.find('\n', pos);
    if (eol == std::string_view::npos) eol = exposition.size();
    const auto sample = parse_prometheus_line(exposition.substr(pos, eol - pos));
    pos = eol + 1;
    if (sample && std::find(names.begin(), names.end(), sample->name) != names.end()) {
      first.emplace(std::string(sample->name), sample->value);
    }
  }
  return first;
}

}  // namespace longhaul::controller
