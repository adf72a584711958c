// Loading pre-trained weights (e.g. Hugging Face GPT-2's model.safetensors) into a
// LanguageModel, through a small reader interface so the model library does not depend on any
// file format: the trainer adapts its safetensors TensorSource to PretrainedTensorReader.
//
// Name resolution, for each tensor name the reader offers:
//   1. if options.name_map has the name, it is replaced by the mapped name;
//   2. buffers and tied weights are ignored: names ending in "attn.bias" or "attn.masked_bias"
//      (HF's causal-mask buffers, never parameters here because c_attn's bias is
//      "attn.c_attn.bias") and "lm_head.weight" (tied to wte);
//   3. the name matches a parameter with or without the "transformer." prefix.
// Every matched tensor must have exactly the parameter's shape, else FailedPrecondition naming
// the tensor and both shapes (nothing is half-loaded: shapes are checked before any copy).
// Parameters with no source tensor keep their current values and are reported as missing.
//
// Thread-safety: the reader is used from the calling thread only.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::model {

class PretrainedTensorReader {
 public:
  virtual ~PretrainedTensorReader() = default;
  virtual std::vector<std::string> tensor_names() const = 0;
  // Row-major shape of a tensor named by tensor_names().
  virtual std::vector<int64_t> shape(std::string_view name) const = 0;
  // Copies the tensor as fp32 into `out` (out.size() == product of shape()); converts from the
  // stored dtype if needed.
  virtual void read(std::string_view name, std::span<float> out) const = 0;
};

// A reader over tensors held in memory, for tests and for callers that already have the data.
class InMemoryTensorReader : public PretrainedTensorReader {
 public:
  void add(std::string name, std::vector<int64_t> shape, std::vector<float> values);
  std::vector<std::string> tensor_names() const override;
  std::vector<int64_t> shape(std::string_view name) const override;
  void read(std::string_view name, std::span<float> out) const override;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::map<std::string, Entry, std::less<>> tensors_;
};

struct PretrainedLoadOptions {
  // Source name -> model parameter name (with or without "transformer."), applied first.
  std::map<std::string, std::string> name_map;
  // When true, a parameter with no source tensor is an error (NotFound naming it).
  bool require_all = false;
  // When true, a source tensor that matches no parameter (and is not an ignored buffer) is an
  // error (InvalidArgument naming it); otherwise it is reported in `unmatched`.
  bool reject_unmatched = false;
};

struct PretrainedLoadReport {
  std::vector<std::string> loaded;     // model parameter names that were filled
  std::vector<std::string> missing;    // model parameter names that kept their values
  std::vector<std::string> ignored;    // source names skipped as buffers / tied weights
  std::vector<std::string> unmatched;  // source names that matched no parameter
};

}  // namespace longhaul::model
