// LanguageModel::load_pretrained and the in-memory reader: name resolution and shape checks
// shared by every backend (a backend only provides upload).
#include "longhaul/model/pretrained.h"

#include <cstring>
#include <map>

#include <longhaul/base/error.h>
#include <longhaul/model/language_model.h>

namespace longhaul::model {
namespace {

constexpr std::string_view kPrefix = "transformer.";

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// HF GPT-2's causal-mask buffers and the tied classifier: never parameters here.
bool is_ignored_name(std::string_view name) {
  return name == "attn.bias" || name == "attn.masked_bias" || ends_with(name, ".attn.bias") ||
         ends_with(name, ".attn.masked_bias") || name == "lm_head.weight";
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

int64_t NamedTensor::numel() const { return product(shape); }

bool is_weight_decayed(std::span<const int64_t> shape) { return shape.size() == 2; }

bool is_weight_decayed(const NamedTensor& parameter) { return is_weight_decayed(parameter.shape); }

void InMemoryTensorReader::add(std::string name, std::vector<int64_t> shape,
                               std::vector<float> values) {
  if (product(shape) != static_cast<int64_t>(values.size())) {
    throw InvalidArgument("tensor '" + name + "' of shape " + shape_string(shape) + " given " +
                          std::to_string(values.size()) + " values");
  }
  tensors_[std::move(name)] = Entry{std::move(shape), std::move(values)};
}

std::vector<std::string> InMemoryTensorReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

std::vector<int64_t> InMemoryTensorReader::shape(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw NotFound("no tensor named '" + std::string(name) + "'");
  return it->second.shape;
}

void InMemoryTensorReader::read(std::string_view name, std::span<float> out) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw NotFound("no tensor named '" + std::string(name) + "'");
  if (out.size() != it->second.values.size()) {
    throw InvalidArgument("reading tensor '" + std::string(name) + "' into a buffer of " +
                          std::to_string(out.size()) + " floats; it has " +
                          std::to_string(it->second.values.size()));
  }
  std::memcpy(out.data(), it->second.values.data(), out.size() * sizeof(float));
}

PretrainedLoadReport LanguageModel::load_pretrained(const PretrainedTensorReader& reader,
                                                    const PretrainedLoadOptions& options) {
  const std::vector<NamedTensor> params = named_parameters();
  std::map<std::string, size_t, std::less<>> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i].name] = i;

  PretrainedLoadReport report;
  std::map<size_t, std::string> plan;  // parameter index -> source name (ordered by parameter)
  for (const std::string& source : reader.tensor_names()) {
    auto mapped = options.name_map.find(source);
    const std::string name = mapped != options.name_map.end() ? mapped->second : source;
    if (is_ignored_name(name)) {
      report.ignored.push_back(source);
      continue;
    }
    auto it = index.find(name);
    if (it == index.end() && !name.starts_with(kPrefix))
      it = index.find(std::string(kPrefix) + name);
    if (it == index.end()) {
      if (options.reject_unmatched) {
        throw InvalidArgument("pre-trained tensor '" + source +
                              "' matches no model parameter: map it with a name mapping or "
                              "remove it from the source");
      }
      report.unmatched.push_back(source);
      continue;
    }
    const NamedTensor& param = params[it->second];
    if (auto [prev, inserted] = plan.emplace(it->second, source); !inserted) {
      throw InvalidArgument("pre-trained tensors '" + prev->second + "' and '" + source +
                            "' both map to parameter '" + param.name + "': keep only one");
    }
    const std::vector<int64_t> shape = reader.shape(source);
    if (shape != param.shape) {
      throw FailedPrecondition(
          "pre-trained tensor '" + source + "' has shape " + shape_string(shape) +
          " but model parameter '" + param.name + "' has shape " + shape_string(param.shape) +
          ": the checkpoint is for another model configuration (" + config().to_string() + ")");
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!plan.contains(i)) report.missing.push_back(params[i].name);
  }
  if (options.require_all && !report.missing.empty()) {
    throw NotFound("pre-trained weights have no tensor for parameter '" + report.missing.front() +
                   "' (" + std::to_string(report.missing.size()) + " missing in all)");
  }
  std::vector<float> buffer;
  for (const auto& [param_index, source] : plan) {
    const NamedTensor& param = params[param_index];
    buffer.resize(static_cast<size_t>(param.numel()));
    reader.read(source, buffer);
    upload(buffer, std::span<float>(param.data, buffer.size()));
    report.loaded.push_back(param.name);
  }
  return report;
}

}  // namespace longhaul::model
