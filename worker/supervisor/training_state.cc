// Out-of-line parts of the TrainingState contract: dtype names and sizes, TensorSpec::numel,
// Snapshot buffer management.
#include "longhaul/supervisor/training_state.h"

#include <limits>

#include "longhaul/base/error.h"

namespace longhaul::supervisor {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kBF16, "BF16", 2},
    {DType::kF16, "F16", 2},   {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU64, "U64", 8},
    {DType::kU32, "U32", 4},   {DType::kU16, "U16", 2}, {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& i : kDTypes) {
    if (i.dtype == dtype) return i;
  }
  throw Internal("unknown DType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }

std::string_view dtype_name(DType dtype) { return info(dtype).name; }

DType dtype_from_name(std::string_view name) {
  for (const auto& i : kDTypes) {
    if (i.name == name) return i.dtype;
  }
  throw InvalidArgument("unknown safetensors dtype \"" + std::string(name) +
                        "\"; supported: F64 F32 BF16 F16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL");
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InvalidArgument("tensor " + name + " has a negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      throw InvalidArgument("tensor " + name + " has more elements than fit in 64 bits");
    }
    n *= d;
  }
  return n;
}

void Snapshot::reshape(const std::vector<TensorSpec>& wanted) {
  buffers.resize(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    size_t n = wanted[i].nbytes();
    if (buffers[i].size() != n) {
      // Replace rather than resize: a resize would copy the old contents for nothing.
      buffers[i] = std::vector<std::byte>(n);
    }
  }
  specs = wanted;
}

std::span<std::byte> Snapshot::buffer(std::string_view name) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) return buffers[i];
  }
  throw NotFound("snapshot has no tensor named " + std::string(name));
}

}  // namespace longhaul::supervisor
