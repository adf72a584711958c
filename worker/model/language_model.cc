// LanguageModel's shared parts: the argument checks every backend applies and the host
// defaults of the state transfers.
#include "longhaul/model/language_model.h"

#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "longhaul/base/error.h"

namespace longhaul::model {

void LanguageModel::check_batch(const int32_t* inputs, const int32_t* targets, int B, int T) const {
  if (B < 1 || B > max_batch_size()) {
    throw InvalidArgument("batch size B = " + std::to_string(B) + " is outside [1, " +
                          std::to_string(max_batch_size()) + "] (the model's max_batch_size)");
  }
  if (T < 1 || T > max_seq_len()) {
    throw InvalidArgument("sequence length T = " + std::to_string(T) + " is outside [1, " +
                          std::to_string(max_seq_len()) + "] (the model's max_seq_len)");
  }
  const int V = config().vocab_size;
  for (const auto& [tokens, what] : {std::pair{inputs, "input"}, std::pair{targets, "target"}}) {
    for (int i = 0; i < B * T; ++i) {
      if (tokens[i] < 0 || tokens[i] >= V) {
        throw InvalidArgument(std::string(what) + " token id " + std::to_string(tokens[i]) +
                              " at (b=" + std::to_string(i / T) + ", t=" + std::to_string(i % T) +
                              ") is outside [0, " + std::to_string(V) +
                              "): the data's vocabulary does not match the model's vocab_size");
      }
    }
  }
}

bool LanguageModel::in_model_buffers(const float* p, size_t n) {
  const size_t total = static_cast<size_t>(num_parameters());
  const std::vector<NamedTensor> state = named_optimizer_state();
  const std::array<const float*, 4> buffers = {
      parameters_flat().data(), gradients_flat().data(),
      state.empty() ? nullptr : state.front().data,             // exp_avg
      state.empty() ? nullptr : state[state.size() / 2].data};  // exp_avg_sq
  for (const float* base : buffers) {
    if (base != nullptr && p >= base && n <= total && p <= base + (total - n)) return true;
  }
  return false;
}

namespace {

void check_transfer(bool owned, size_t model_size, size_t host_size, const char* what) {
  if (!owned || model_size != host_size) {
    throw InvalidArgument(std::string(what) +
                          ": the model side must be a span of the model's parameter, gradient "
                          "or moment buffers and the host side the same size (got " +
                          std::to_string(model_size) + " and " + std::to_string(host_size) +
                          " floats)");
  }
}

}  // namespace

void LanguageModel::download(std::span<const float> model_span, std::span<float> host) {
  check_transfer(in_model_buffers(model_span.data(), model_span.size()), model_span.size(),
                 host.size(), "download");
  std::memcpy(host.data(), model_span.data(), model_span.size_bytes());
}

void LanguageModel::upload(std::span<const float> host, std::span<float> model_span) {
  check_transfer(in_model_buffers(model_span.data(), model_span.size()), model_span.size(),
                 host.size(), "upload");
  std::memcpy(model_span.data(), host.data(), host.size_bytes());
}

void LanguageModel::snapshot_to_host(std::span<const HostCopy> copies) {
  for (const HostCopy& c : copies) {
    if (c.model_src == nullptr || c.host_dst.size() % sizeof(float) != 0 ||
        !in_model_buffers(c.model_src, c.host_dst.size() / sizeof(float))) {
      throw InvalidArgument(
          "snapshot: each copy must read a span of the model's buffers into a host buffer of a "
          "whole number of floats (got " +
          std::to_string(c.host_dst.size()) + " bytes)");
    }
  }
  for (const HostCopy& c : copies) {
    std::memcpy(c.host_dst.data(), c.model_src, c.host_dst.size());
  }
}

}  // namespace longhaul::model
