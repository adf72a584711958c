// Label and field selectors in the API server's query syntax.
//   labels: "a=b,c==d,e!=f,g in (h,i),j notin (k),l,!m"
//   fields: "metadata.name=x,status.phase!=Running" (=, ==, != only; the fields a type supports)
// Parsing errors throw StatusError 400 BadRequest with the API server's wording.
//
// Deliberately written apart from the operator's parser (operator/kube/selector.h), helpers
// included: the fake server judges the selectors the operator sends, so a shared bug would pass.
//
// Thread-safety: immutable after parsing; matches() is const and safe from many threads.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "longhaul/fakeapi/server.h"

namespace longhaul::fakeapi {

class LabelSelector {
 public:
  LabelSelector() = default;
  static LabelSelector parse(std::string_view text);
  // `labels` is metadata.labels (may be null).
  bool matches(const json& labels) const;
  bool empty() const { return requirements_.empty(); }

 private:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  FieldSelector() = default;
  // Throws 400 "field label not supported: <f>" for fields `type` does not index.
  static FieldSelector parse(std::string_view text, const ResourceType& type);
  bool matches(const json& object) const;
  bool empty() const { return requirements_.empty(); }

 private:
  struct Requirement {
    std::string field;
    bool negated;
    std::string value;
  };
  std::vector<Requirement> requirements_;
};

}  // namespace longhaul::fakeapi
