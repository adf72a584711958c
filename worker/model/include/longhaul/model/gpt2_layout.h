// The GPT-2 parameter layout and initialisation that every backend shares, so that names,
// order, offsets and the initial weights of a seed are the same on CPU and CUDA by construction
// (a checkpoint written by one backend loads into the other; "same seed, same weights" holds).
//
// ParameterLayout describes the flat fp32 buffers of language_model.h's memory contract: one
// TensorLayout per parameter, in named_parameters() order (wte, wpe, block 0..L-1, ln_f), each
// with its Hugging Face name, shape, element offset and GPT-2 initialisation rule. Offsets are
// contiguous from 0 with no padding; a backend that keeps another layout (the CUDA backend's
// padded bf16 working copy) derives it from these offsets.
//
// Thread-safety: a ParameterLayout is immutable after construction; const use from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <longhaul/model/config.h>
#include <longhaul/model/language_model.h>

namespace longhaul::model {

// Indices of one transformer block's tensors, in Hugging Face order.
enum BlockTensor {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttProjW,
  kAttProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kBlockTensors
};
// Name of each block tensor after the "transformer.h.{i}." prefix.
inline constexpr std::array<const char*, kBlockTensors> kBlockTensorNames = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

// GPT-2's initialisation rule for one tensor (language_model.h, init_weights).
enum class ParameterInit {
  kNormal,          // N(0, 0.02)
  kResidualNormal,  // N(0, 0.02 / sqrt(2 n_layer)): attn.c_proj.weight, mlp.c_proj.weight
  kZero,            // biases, layernorm biases
  kOne,             // layernorm weights
};

struct TensorLayout {
  std::string name;            // "transformer.h.0.ln_1.weight"
  std::vector<int64_t> shape;  // row-major
  size_t offset = 0;           // first element in the flat fp32 buffers
  size_t numel = 0;            // product of shape
  ParameterInit init = ParameterInit::kNormal;
};

class ParameterLayout {
 public:
  // Validates `config` (InvalidArgument naming the bad field) and lays out its parameters.
  explicit ParameterLayout(const GPT2Config& config);

  const GPT2Config& config() const { return config_; }
  // Total elements of the flat buffer; equals config().num_parameters().
  size_t num_parameters() const { return num_parameters_; }

  // Every tensor, in named_parameters() order.
  const std::vector<TensorLayout>& tensors() const { return tensors_; }
  std::vector<TensorLayout>::const_iterator begin() const { return tensors_.begin(); }
  std::vector<TensorLayout>::const_iterator end() const { return tensors_.end(); }
  size_t size() const { return tensors_.size(); }
  const TensorLayout& operator[](size_t index) const { return tensors_[index]; }

  const TensorLayout& wte() const { return tensors_.front(); }
  const TensorLayout& wpe() const { return tensors_[1]; }
  // Tensor `index` of block `layer`, 0 <= layer < n_layer (unchecked).
  const TensorLayout& block(int layer, BlockTensor index) const {
    return tensors_[2 + static_cast<size_t>(layer) * kBlockTensors + index];
  }
  const TensorLayout& lnf_weight() const { return tensors_[tensors_.size() - 2]; }
  const TensorLayout& lnf_bias() const { return tensors_.back(); }

  // The tensors of `buffer`, a flat buffer in this layout, as NamedTensors named `prefix` +
  // the parameter's name; only pointers are formed, so `buffer` may be device memory.
  // named(params) is named_parameters().
  std::vector<NamedTensor> named(float* buffer, std::string_view prefix = "") const;
  // named_optimizer_state(): the exp_avg tensors, then the exp_avg_sq tensors, named
  // "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>" (torch.optim.AdamW's keys).
  std::vector<NamedTensor> named_optimizer_state(float* exp_avg, float* exp_avg_sq) const;

  // Writes GPT-2's initial weights for `seed` into `params` (the flat fp32 buffer, host memory,
  // num_parameters() elements; InvalidArgument otherwise). The Gaussian stream is a 64-bit
  // Mersenne Twister with an explicit Box-Muller transform, drawn tensor by tensor in layout
  // order, so the result is bit-identical for a seed with every standard library and backend.
  void init_weights(uint64_t seed, std::span<float> params) const;

 private:
  GPT2Config config_;
  std::vector<TensorLayout> tensors_;
  size_t num_parameters_ = 0;
};

}  // namespace longhaul::model
