// The kernel self-check: before a backend is trusted with a days-long run, every kernel family
// the model uses runs on small random inputs of the model's real head size and dtypes, on the
// real device, and is compared with a plain double-precision reference (families.cc) within
// the tolerances the kernel tests state. A family may have several implementations in
// preference order (attention: flash, then cuBLAS; each cuBLASLt epilogue, then a separate
// kernel): the first that passes is chosen, and a failure names the family, the implementation,
// the output, the shape, the error and the tolerance.
//
// The harness is backend-agnostic: an Implementation takes host fp32 inputs and returns host
// fp32 outputs (a device implementation uploads, runs and downloads inside). Backends fill a
// Registry (cpu_registry() here, backend_cuda::cuda_kernel_registry() for the GPU); tests build
// registries of their own, e.g. with a deliberately wrong implementation swapped in.
//
// Tolerances, as ||impl - reference|| / ||reference|| (the kernel tests' measure), by what the
// output is and the precision the implementation computes in:
//                                  bf16 (CUDA)   fp32 (CPU)
//   activation (bf16 on the GPU)   1e-2          1e-5
//   statistic (fp32, CUDA cores)   1e-5          1e-5
//   GEMM fp32 (tensor cores)       1e-4          1e-5
//   exact (casts)                  0             0
// plus, for AdamW's stochastic rounding, "every bf16 value is one of the two bf16 neighbours of
// its fp32 master weight".
//
// Thread-safety: a Registry is immutable once built and may be shared; run_self_check runs on
// the calling thread (implementations may use their own device streams and threads).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longhaul::selfcheck {

enum class Family {
  kEmbedding,         // token + position embedding, forward and backward
  kLayerNorm,         // residual add fused with layernorm, forward; layernorm backward
  kMatmulBias,        // dense layer forward with bias (cuBLASLt BIAS epilogue)
  kMatmulGelu,        // dense layer + bias + GELU forward (cuBLASLt GELU_AUX_BIAS epilogue)
  kMatmulBackward,    // dense layer backward with the bias gradient (cuBLASLt BGRADA epilogue)
  kClassifierMatmul,  // tied classifier product logits = x @ wte^T, forward and backward
  kAttention,         // causal multi-head attention, forward and backward
  kGelu,              // GELU forward and backward (recomputation in the backward pass)
  kClassifier,        // softmax + cross-entropy + dlogits
  kAdamW,             // AdamW update (+ stochastic rounding of the bf16 copy)
  kGlobalNorm,        // sum of squares of the gradients
  kCast,              // fp32 -> bf16 round to nearest even
};
inline constexpr Family kAllFamilies[] = {
    Family::kEmbedding,  Family::kLayerNorm,      Family::kMatmulBias,
    Family::kMatmulGelu, Family::kMatmulBackward, Family::kClassifierMatmul,
    Family::kAttention,  Family::kGelu,           Family::kClassifier,
    Family::kAdamW,      Family::kGlobalNorm,     Family::kCast};
std::string_view family_name(Family family);  // "attention", "matmul.gelu", ...

// What an implementation computes in: bf16 inputs/activations (the CUDA backend) or fp32.
enum class Precision { kBf16, kFp32 };

// The problem size of every check, derived from the model so the kernels run with its real head
// size: NH heads of the model's head size HS (C = NH * HS), B x T tokens, a vocabulary that is
// not a multiple of 128 (so the GPU's padding is exercised).
struct CheckShape {
  int B = 2;
  int T = 80;  // not a multiple of the flash kernels' 64-row tile
  int NH = 2;
  int HS = 64;  // the model's n_embd / n_head
  int V = 300;
  int C() const { return NH * HS; }
  int N() const { return B * T; }
  std::string to_string() const;  // "B=2 T=80 C=128 NH=2 HS=64 V=300"
};
// The check shape for a model: its head size, min(its vocabulary, 300) (at least 2), T = 80
// capped at its context length.
CheckShape check_shape_for(int n_embd, int n_head, int vocab_size, int context_length);

using Tensors = std::map<std::string, std::vector<float>>;

// One generated problem: inputs (floats, integers, scalars) and the reference's outputs.
struct Case {
  Family family;
  CheckShape shape;
  Precision precision;  // inputs the implementation sees as bf16 are already rounded to bf16
  Tensors inputs;
  std::map<std::string, std::vector<int32_t>> ints;
  std::map<std::string, double> scalars;
  Tensors expected;
};

// Generates the problem of `family` for an implementation of `precision` (deterministic for
// the seed) and computes the reference outputs in double precision.
Case make_case(Family family, const CheckShape& shape, Precision precision, uint64_t seed);

struct Implementation {
  Family family;
  std::string name;  // "flash", "cublas", "cublaslt-epilogue", "separate-kernel", "cpu", ...
  Precision precision = Precision::kFp32;
  // Whether it can run this shape at all (flash attention: head size 64 only). Empty: always.
  std::function<bool(const CheckShape&)> supports;
  // Computes the outputs (names as in Case::expected; an output it does not produce is not
  // compared). May throw: the error is reported as this implementation's failure.
  std::function<Tensors(const Case&)> run;
};

// Implementations per family, in preference order.
class Registry {
 public:
  void add(Implementation implementation);
  // Replaces the implementation of that family and name (tests: a deliberately wrong one).
  // Throws InvalidArgument when there is none.
  void replace(Implementation implementation);
  const std::vector<Implementation>& implementations(Family family) const;
  bool has(Family family) const { return !implementations(family).empty(); }

 private:
  std::map<Family, std::vector<Implementation>> by_family_;
};

// The CPU backend's kernels (longhaul::kernels_cpu), precision fp32, one per family it uses
// (everything but kCast).
Registry cpu_registry();

struct OutputCheck {
  std::string output;
  double error = 0;          // relative L2 error (or the fraction of bad elements, bracket checks)
  double max_abs_error = 0;  // max |impl - reference|
  double tolerance = 0;
  bool passed = false;
};

struct Attempt {
  std::string implementation;
  bool passed = false;
  std::string error;  // the exception an implementation threw, if any
  std::vector<OutputCheck> outputs;
  double seconds = 0;
  // "attention/flash: output dqkv (B=2 T=80 C=128 NH=2 HS=64 V=300): relative error 3.1e-01 >
  // tolerance 1.0e-02 (max abs error 2.3)" for the first failing output, or the thrown error.
  std::string failure;
};

enum class Status {
  kPass,      // the preferred implementation passed
  kFallback,  // it failed, a later one passed and is chosen
  kFail,      // none passed
};
std::string_view status_name(Status status);  // "PASS", "FALLBACK", "FAIL"

struct FamilyResult {
  Family family;
  Status status = Status::kFail;
  std::optional<std::string> chosen;  // the implementation to use
  std::vector<Attempt> attempts;      // in the order tried
};

// One training step of a small model on the candidate device vs the reference backend.
struct ModelStepResult {
  bool ran = false;  // false: not run (e.g. no second backend to compare)
  bool passed = false;
  std::string description;  // "model 2 layers, C=128, ...: loss 5.62 vs 5.62 ..."
  std::string failure;
  double seconds = 0;
};

struct Report {
  std::string backend;  // "cuda", "cpu", or a test's name
  CheckShape shape;
  std::vector<FamilyResult> families;
  ModelStepResult model_step;
  double seconds = 0;

  // Every family has a passing implementation and the model step (if run) passed.
  bool passed() const;
  const FamilyResult* family(Family f) const;
  // The chosen implementation of a family, or "" when none passed / not checked.
  std::string chosen(Family f) const;
  // One line per failure ("attention/flash: ..."), for the warning or the exit-2 message.
  std::vector<std::string> failures() const;
  // A readable table (family, implementation, status, error vs tolerance), one line per attempt.
  std::string to_text() const;
};

// The collective check of data-parallel replicas (NCCL all-reduce on GPUs): every rank fills
// `count` floats from (seed, rank), calls `allreduce_mean` on them (host in, host out: a device
// implementation uploads, reduces and downloads), and compares the result with the mean of all
// ranks' values, which each rank computes itself in double. Tolerance 1e-6 relative L2 (an fp32
// sum of world_size values). Every rank reaches the same verdict when the collective is wrong
// everywhere; a rank that alone sees wrong values fails alone (its peers then lose it).
struct CollectiveCheck {
  bool passed = false;
  double error = 0;
  double max_abs_error = 0;
  double tolerance = 1e-6;
  std::string failure;  // "allreduce/nccl (rank 1 of 4, 1048576 floats): relative error ..."
};
CollectiveCheck check_allreduce_mean(const std::function<void(std::vector<float>&)>& allreduce_mean,
                                     const std::string& implementation, int rank, int world_size,
                                     size_t count = size_t{1} << 20, uint64_t seed = 20261124);

// Runs every family in `families` through the registry: for each, its implementations in
// order until one passes. A family with no implementation in the registry is reported FAIL
// ("no implementation"). Never throws for a kernel failure (that is the report's job).
Report run_self_check(const Registry& registry, const CheckShape& shape,
                      const std::vector<Family>& families, uint64_t seed = 20261124);

}  // namespace longhaul::selfcheck
