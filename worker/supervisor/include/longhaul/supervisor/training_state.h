// The boundary between the supervisor and whatever it supervises. A training program (the
// longhaul worker, or a user's own loop) implements TrainingState; the supervisor decides when
// to initialise, restore and snapshot it, and owns everything that touches the logdir.
//
// Thread-safety: initialize(), restore() and snapshot() are called on the training thread
// (inside managed_session, at step boundaries), never concurrently with a training step.
// global_step() may be called from service threads and must be safe to call concurrently
// (an atomic read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::supervisor {

// Element types a checkpoint can hold, named as in the safetensors format.
enum class DType { kF64, kF32, kBF16, kF16, kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "F32", "BF16", ...
// Parses a safetensors dtype name; throws InvalidArgument naming the unknown dtype.
DType dtype_from_name(std::string_view name);

struct TensorSpec {
  std::string name;  // e.g. "transformer.h.0.attn.c_attn.weight"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

// A host-side copy of the whole training state taken at one step boundary. The supervisor keeps
// Snapshot objects and hands them back for reuse, so buffers are allocated once (pinned host
// memory on GPU backends may be used by a TrainingState through `buffers` ownership of its own).
struct Snapshot {
  int64_t step = 0;
  std::vector<TensorSpec> specs;                // parallel to `buffers`
  std::vector<std::vector<std::byte>> buffers;  // buffers[i].size() == specs[i].nbytes()
  std::map<std::string, std::string> metadata;  // RNG state, data position, model config, ...

  // Makes `specs`/`buffers` match `wanted`, reallocating only buffers whose size changed.
  void reshape(const std::vector<TensorSpec>& wanted);
  std::span<std::byte> buffer(std::string_view name);  // throws NotFound naming the tensor
};

// Read access to one checkpoint (a verified safetensors file). Implemented by the supervisor's
// checkpoint reader; also used for pre-trained initialisation.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::string& path() const = 0;
  virtual bool contains(std::string_view name) const = 0;
  virtual std::vector<std::string> tensor_names() const = 0;
  // Throws NotFound naming the tensor and the file when absent.
  virtual const TensorSpec& spec(std::string_view name) const = 0;
  // The tensor's bytes, CRC32C-verified (DataLoss naming tensor and file when corrupt).
  virtual std::span<const std::byte> data(std::string_view name) const = 0;
  virtual const std::map<std::string, std::string>& metadata() const = 0;
};

class TrainingState {
 public:
  virtual ~TrainingState() = default;

  // Every tensor a checkpoint holds (parameters, optimizer moments, ...). The same list on every
  // call for the life of the object.
  virtual std::vector<TensorSpec> tensor_specs() const = 0;

  // Initialises from scratch (random init, step 0). Called only when the logdir has no valid
  // checkpoint; the supervisor then calls init_fn (pre-trained weights) if one was given.
  virtual void initialize() = 0;

  // Restores everything from a checkpoint: tensors, step and the metadata written by snapshot().
  // Throws FailedPrecondition naming the first tensor whose name, dtype or shape differs.
  virtual void restore(const TensorSource& checkpoint) = 0;

  // Copies the current state into `out` (out.reshape(tensor_specs()) first). Called at a step
  // boundary on the training thread; the training loop is blocked only for this copy.
  virtual void snapshot(Snapshot& out) = 0;

  // Optimizer steps taken so far. Safe to call from any thread.
  virtual int64_t global_step() const = 0;

  // The readiness check: names of what is not initialised (empty when ready).
  virtual std::vector<std::string> uninitialized() const { return {}; }
};

}  // namespace longhaul::supervisor
