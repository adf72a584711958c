// Label selector parsing and matching (see selector.h).
#include "longhaul/kube/selector.h"

#include <algorithm>
#include <cctype>

#include "longhaul/base/error.h"
#include "longhaul/base/strings.h"

namespace longhaul::kube {

namespace {

bool valid_key(std::string_view key) {
  if (key.empty()) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
           c == '/';
  });
}

// Splits at commas outside parentheses.
std::vector<std::string> split_requirements(std::string_view text) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      out.push_back(std::string(trim(text.substr(start, i - start))));
      start = i + 1;
    } else if (text[i] == '(') {
      ++depth;
    } else if (text[i] == ')') {
      --depth;
    }
  }
  return out;
}

}  // namespace

LabelSelector LabelSelector::parse(std::string_view text) {
  LabelSelector selector;
  if (trim(text).empty()) return selector;
  auto fail = [&](const std::string& part, const std::string& why) {
    throw InvalidArgument("label selector '" + std::string(text) + "': requirement '" + part +
                          "' " + why);
  };
  for (const std::string& part : split_requirements(text)) {
    if (part.empty()) fail(part, "is empty");
    Requirement req;
    if (part[0] == '!') {
      req.key = std::string(trim(std::string_view(part).substr(1)));
      req.op = Op::kDoesNotExist;
    } else if (auto paren = part.find('('); paren != std::string::npos) {
      if (part.back() != ')') fail(part, "has no closing ')'");
      std::string head(trim(std::string_view(part).substr(0, paren)));
      auto space = head.find_last_of(" \t");
      if (space == std::string::npos) fail(part, "needs 'in' or 'notin' before '('");
      std::string op = head.substr(space + 1);
      req.key = std::string(trim(std::string_view(head).substr(0, space)));
      if (op == "in") {
        req.op = Op::kIn;
      } else if (op == "notin") {
        req.op = Op::kNotIn;
      } else {
        fail(part, "has operator '" + op + "' (expected in or notin)");
      }
      std::string inner = part.substr(paren + 1, part.size() - paren - 2);
      size_t start = 0;
      for (size_t i = 0; i <= inner.size(); ++i) {
        if (i == inner.size() || inner[i] == ',') {
          std::string value(trim(std::string_view(inner).substr(start, i - start)));
          if (!value.empty()) req.values.push_back(value);
          start = i + 1;
        }
      }
      if (req.values.empty()) fail(part, "has an empty value set");
    } else if (auto ne = part.find("!="); ne != std::string::npos) {
      req.key = std::string(trim(std::string_view(part).substr(0, ne)));
      req.op = Op::kNotEquals;
      req.values.push_back(std::string(trim(std::string_view(part).substr(ne + 2))));
    } else if (auto eq = part.find('='); eq != std::string::npos) {
      size_t value_start = eq + 1;
      if (value_start < part.size() && part[value_start] == '=') ++value_start;
      req.key = std::string(trim(std::string_view(part).substr(0, eq)));
      req.op = Op::kEquals;
      req.values.push_back(std::string(trim(std::string_view(part).substr(value_start))));
    } else {
      req.key = part;
      req.op = Op::kExists;
    }
    if (!valid_key(req.key)) fail(part, "has an invalid label key '" + req.key + "'");
    selector.requirements_.push_back(std::move(req));
  }
  return selector;
}

LabelSelector LabelSelector::from_json(const nlohmann::json& json_selector) {
  LabelSelector selector;
  if (!json_selector.is_object()) return selector;
  if (auto it = json_selector.find("matchLabels"); it != json_selector.end() && it->is_object()) {
    for (const auto& [key, value] : it->items()) {
      selector.requirements_.push_back({key, Op::kEquals, {value.get<std::string>()}});
    }
  }
  if (auto it = json_selector.find("matchExpressions");
      it != json_selector.end() && it->is_array()) {
    for (const auto& expr : *it) {
      Requirement req;
      req.key = expr.value("key", "");
      const std::string op = expr.value("operator", "");
      if (op == "In") {
        req.op = Op::kIn;
      } else if (op == "NotIn") {
        req.op = Op::kNotIn;
      } else if (op == "Exists") {
        req.op = Op::kExists;
      } else if (op == "DoesNotExist") {
        req.op = Op::kDoesNotExist;
      } else {
        throw InvalidArgument("label selector: matchExpressions operator '" + op +
                              "' is not In, NotIn, Exists or DoesNotExist");
      }
      if (expr.contains("values") && expr["values"].is_array()) {
        for (const auto& v : expr["values"]) req.values.push_back(v.get<std::string>());
      }
      selector.requirements_.push_back(std::move(req));
    }
  }
  return selector;
}

bool LabelSelector::matches(const nlohmann::json& labels) const {
  for (const Requirement& req : requirements_) {
    const std::string* value = nullptr;
    std::string holder;
    if (labels.is_object()) {
      auto it = labels.find(req.key);
      if (it != labels.end() && it->is_string()) {
        holder = it->get<std::string>();
        value = &holder;
      }
    }
    const bool in_set =
        value && std::find(req.values.begin(), req.values.end(), *value) != req.values.end();
    switch (req.op) {
      case Op::kEquals:
      case Op::kIn:
        if (!in_set) return false;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        if (in_set) return false;  // a missing label satisfies != and notin
        break;
      case Op::kExists:
        if (!value) return false;
        break;
      case Op::kDoesNotExist:
        if (value) return false;
        break;
    }
  }
  return true;
}

const std::string* LabelSelector::required_value(std::string_view key) const {
  for (const Requirement& r : requirements_) {
    if (r.key == key && (r.op == Op::kEquals || r.op == Op::kIn) && r.values.size() == 1) {
      return &r.values.front();
    }
  }
  return nullptr;
}

bool LabelSelector::matches_object(const nlohmann::json& object) const {
  static const nlohmann::json kNone;
  if (!object.is_object()) return matches(kNone);
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return matches(kNone);
  auto labels = metadata->find("labels");
  return matches(labels == metadata->end() ? kNone : *labels);
}

}  // namespace longhaul::kube
