// Kubernetes label selectors in their string form ("a=b,c!=d,e in (f,g),h notin (i),j,!k"),
// matched against an object's metadata.labels. Used by the informer store and by fakes.
//
// Thread-safety: immutable after parse(); safe to share.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace longhaul::kube {

class LabelSelector {
 public:
  LabelSelector() = default;  // matches everything
  // Throws InvalidArgument naming the selector and the bad requirement.
  static LabelSelector parse(std::string_view text);
  // From a metav1.LabelSelector JSON object (matchLabels / matchExpressions).
  static LabelSelector from_json(const nlohmann::json& selector);

  // `labels` is metadata.labels (an object, or null/absent meaning no labels).
  bool matches(const nlohmann::json& labels) const;
  // Convenience: matches(object["metadata"]["labels"]).
  bool matches_object(const nlohmann::json& object) const;
  bool empty() const { return requirements_.empty(); }
  // The one value label `key` must have for a match (key=v, key==v, key in (v)), if the
  // selector requires one; for index lookups.
  const std::string* required_value(std::string_view key) const;

 private:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

}  // namespace longhaul::kube
