// Kubernetes manifests as JSON, for the test tools that apply them: the local cluster
// (tests/e2e) and the real-API-server harness (tests/envtest). YAML with one or more documents,
// anchors resolved, plain scalars typed the way Kubernetes reads them. Header-only; a target that
// includes it links yaml-cpp and longhaul::base.
//
//   for (const json& object : longhaul::testing::load_manifests("examples/x.yaml")) apply(object);
#pragma once

#include <filesystem>
#include <regex>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"

namespace longhaul::testing {

// YAML -> JSON: plain scalars that read as null, bool, a YAML 1.2 integer (no leading zeros) or
// float become those; quoted scalars and everything else stay strings.
inline nlohmann::json yaml_to_json(const YAML::Node& node) {
  using json = nlohmann::json;
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : node) o[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : node) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!") return s;  // quoted: always a string
      static const std::regex int_re(R"([-+]?(0|[1-9][0-9]*))");
      static const std::regex float_re(
          R"([-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+)");
      if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (std::regex_match(s, int_re)) return std::stoll(s);
      if (std::regex_match(s, float_re)) return std::stod(s);
      return s;
    }
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
  }
  return nullptr;
}

// Every non-empty document of `yaml_text`. Throws InvalidArgument naming `origin` (a file name,
// or where the text came from) on a parse error.
inline std::vector<nlohmann::json> parse_manifests(const std::string& yaml_text,
                                                   const std::string& origin) {
  std::vector<nlohmann::json> out;
  try {
    for (const YAML::Node& doc : YAML::LoadAll(yaml_text)) {
      nlohmann::json j = yaml_to_json(doc);
      if (j.is_object() && !j.empty()) out.push_back(std::move(j));
    }
  } catch (const YAML::Exception& e) {
    throw InvalidArgument("manifest " + origin + ": " + e.what());
  }
  return out;
}

// Every non-empty document of the file at `path`. Throws NotFound when it is missing,
// InvalidArgument naming it on a parse error.
inline std::vector<nlohmann::json> load_manifests(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw NotFound("manifest " + path.string() + " does not exist");
  }
  return parse_manifests(file::read_file(path), path.string());
}

}  // namespace longhaul::testing
