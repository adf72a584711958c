#include "selector.h"

#include <algorithm>
#include <cctype>

namespace longhaul::fakeapi {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_selector(std::string_view what, std::string_view text) {
  throw StatusError(
      400, "BadRequest",
      "unable to parse requirement: " + std::string(what) + ": \"" + std::string(text) + "\"");
}

bool valid_label_key(std::string_view key) {
  if (key.empty() || key.size() > 316) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == '/';
  });
}

bool valid_label_value(std::string_view value) {
  if (value.size() > 63) return false;
  return std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// Splits at commas that are not inside parentheses.
std::vector<std::string_view> split_requirements(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      std::string_view part = trim(text.substr(start, i - start));
      if (!part.empty()) parts.push_back(part);
      start = i + 1;
    } else if (text[i] == '(') {
      ++depth;
    } else if (text[i] == ')') {
      --depth;
    }
  }
  return parts;
}

// Finds " in " / " notin " set operators (the operator word is delimited by whitespace).
size_t find_word(std::string_view text, std::string_view word) {
  size_t pos = 0;
  while ((pos = text.find(word, pos)) != std::string_view::npos) {
    bool left = pos > 0 && std::isspace(static_cast<unsigned char>(text[pos - 1]));
    size_t end = pos + word.size();
    bool right = end < text.size() &&
                 (std::isspace(static_cast<unsigned char>(text[end])) || text[end] == '(');
    if (left && right) return pos;
    pos = end;
  }
  return std::string_view::npos;
}

std::string label_value(const json& labels, const std::string& key, bool* present) {
  *present = false;
  if (!labels.is_object()) return {};
  auto it = labels.find(key);
  if (it == labels.end() || !it->is_string()) return {};
  *present = true;
  return it->get<std::string>();
}

}  // namespace

LabelSelector LabelSelector::parse(std::string_view text) {
  LabelSelector selector;
  for (std::string_view part : split_requirements(text)) {
    Requirement req;
    size_t in_pos = find_word(part, "in");
    size_t notin_pos = find_word(part, "notin");
    if (in_pos != std::string_view::npos || notin_pos != std::string_view::npos) {
      bool notin = notin_pos != std::string_view::npos &&
                   (in_pos == std::string_view::npos || notin_pos < in_pos);
      size_t op_pos = notin ? notin_pos : in_pos;
      req.key = std::string(trim(part.substr(0, op_pos)));
      req.op = notin ? Op::kNotIn : Op::kIn;
      std::string_view rest = trim(part.substr(op_pos + (notin ? 5 : 2)));
      if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')') {
        bad_selector("expected a parenthesised value list", part);
      }
      rest = rest.substr(1, rest.size() - 2);
      size_t start = 0;
      for (size_t i = 0; i <= rest.size(); ++i) {
        if (i == rest.size() || rest[i] == ',') {
          std::string_view v = trim(rest.substr(start, i - start));
          if (!valid_label_value(v)) bad_selector("invalid label value", v);
          req.values.emplace_back(v);
          start = i + 1;
        }
      }
    } else if (part.front() == '!') {
      req.key = std::string(trim(part.substr(1)));
      req.op = Op::kDoesNotExist;
    } else if (size_t p = part.find("!="); p != std::string_view::npos) {
      req.key = std::string(trim(part.substr(0, p)));
      req.op = Op::kNotEquals;
      req.values.emplace_back(trim(part.substr(p + 2)));
    } else if (size_t q = part.find("=="); q != std::string_view::npos) {
      req.key = std::string(trim(part.substr(0, q)));
      req.op = Op::kEquals;
      req.values.emplace_back(trim(part.substr(q + 2)));
    } else if (size_t e = part.find('='); e != std::string_view::npos) {
      req.key = std::string(trim(part.substr(0, e)));
      req.op = Op::kEquals;
      req.values.emplace_back(trim(part.substr(e + 1)));
    } else if (part.find_first_of("<>") != std::string_view::npos) {
      bad_selector("the fake API server does not support the gt/lt operators", part);
    } else {
      req.key = std::string(part);
      req.op = Op::kExists;
    }
    if (!valid_label_key(req.key)) bad_selector("invalid label key", req.key);
    for (const std::string& v : req.values) {
      if (!valid_label_value(v)) bad_selector("invalid label value", v);
    }
    selector.requirements_.push_back(std::move(req));
  }
  return selector;
}

bool LabelSelector::matches(const json& labels) const {
  for (const Requirement& req : requirements_) {
    bool present = false;
    std::string value = label_value(labels, req.key, &present);
    bool in_values =
        present && std::find(req.values.begin(), req.values.end(), value) != req.values.end();
    switch (req.op) {
      case Op::kEquals:
      case Op::kIn:
        if (!in_values) return false;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        if (in_values) return false;
        break;
      case Op::kExists:
        if (!present) return false;
        break;
      case Op::kDoesNotExist:
        if (present) return false;
        break;
    }
  }
  return true;
}

namespace {

std::vector<std::string> supported_fields(const ResourceType& type) {
  std::vector<std::string> fields = {"metadata.name"};
  if (type.namespaced) fields.push_back("metadata.namespace");
  if (type.group.empty() && type.plural == "pods") {
    for (const char* f :
         {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
          "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"}) {
      fields.push_back(f);
    }
  }
  if (type.plural == "events") {
    for (const char* f :
         {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
          "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
          "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}) {
      fields.push_back(f);
    }
  }
  if (type.group.empty() && type.plural == "secrets") fields.push_back("type");
  if (type.group.empty() && type.plural == "nodes") fields.push_back("spec.unschedulable");
  if (type.group.empty() && type.plural == "namespaces") fields.push_back("status.phase");
  return fields;
}

std::string field_value(const json& object, const std::string& field) {
  if (field == "source" && object.contains("source")) {
    return object["source"].value("component", "");
  }
  const json* node = &object;
  size_t start = 0;
  while (start <= field.size()) {
    size_t dot = field.find('.', start);
    std::string part =
        field.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return {};
    auto it = node->find(part);
    if (it == node->end()) return {};
    node = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (node->is_string()) return node->get<std::string>();
  if (node->is_boolean()) return node->get<bool>() ? "true" : "false";
  if (node->is_null()) return {};
  return node->dump();
}

}  // namespace

FieldSelector FieldSelector::parse(std::string_view text, const ResourceType& type) {
  FieldSelector selector;
  std::vector<std::string> supported = supported_fields(type);
  for (std::string_view part : split_requirements(text)) {
    Requirement req;
    size_t op_len = 1;
    size_t p = part.find("!=");
    if (p != std::string_view::npos) {
      req.negated = true;
      op_len = 2;
    } else {
      req.negated = false;
      p = part.find("==");
      if (p != std::string_view::npos) {
        op_len = 2;
      } else {
        p = part.find('=');
      }
    }
    if (p == std::string_view::npos) {
      throw StatusError(400, "BadRequest",
                        "invalid selector: '" + std::string(text) + "'; can't understand '" +
                            std::string(part) + "'");
    }
    req.field = std::string(trim(part.substr(0, p)));
    req.value = std::string(trim(part.substr(p + op_len)));
    if (std::find(supported.begin(), supported.end(), req.field) == supported.end()) {
      throw StatusError(400, "BadRequest", "field label not supported: " + req.field);
    }
    selector.requirements_.push_back(std::move(req));
  }
  return selector;
}

bool FieldSelector::matches(const json& object) const {
  for (const Requirement& req : requirements_) {
    bool equal = field_value(object, req.field) == req.value;
    if (equal == req.negated) return false;
  }
  return true;
}

}  // namespace longhaul::fakeapi
