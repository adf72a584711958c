// Naming a field of a configuration in its error. The readers of the worker's YAML config
// (worker/trainer/config.cc), the kubeconfig (operator/kube/config.cc) and the TrainingJob
// (operator/api/trainingjob.cc) each read typed fields of their own format; they share how a
// nested field's path is written ("spec.runPolicy.backoffLimit", "spec.logdir.accessModes[0]"),
// how the values a field takes are listed, and the error itself: InvalidArgument
// "<where>: <what is wrong>". What is wrong is each reader's own wording.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace longhaul::field {

// "parent.key"; just "key" when `parent` is empty (a top-level field).
std::string path(std::string_view parent, std::string_view key);
// "parent[index]": an element of a list field.
std::string element(std::string_view parent, size_t index);

// "a, b, c": the values a field takes, in the order given.
template <typename Names>
std::string one_of(const Names& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += std::string_view(name);
  }
  return out;
}

// Throws InvalidArgument("<where>: <what>"); `where` is a field path or names the file.
[[noreturn]] void fail(std::string_view where, std::string_view what);

}  // namespace longhaul::field
