// The self-check harness: runs each family's implementations against the reference in
// preference order and reports error vs tolerance. See selfcheck.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "longhaul/base/error.h"
#include "longhaul/selfcheck/selfcheck.h"
#include "selfcheck_internal.h"

namespace longhaul::selfcheck {
namespace {

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", x);
  return buf;
}

double tolerance(OutputKind kind, Precision precision) {
  const bool bf = precision == Precision::kBf16;
  switch (kind) {
    case OutputKind::kActivation:
      return bf ? 1e-2 : 1e-5;
    case OutputKind::kStatistic:
      return 1e-5;
    case OutputKind::kGemmFp32:
      return bf ? 1e-4 : 1e-5;
    case OutputKind::kExact:
    case OutputKind::kStochasticBf16:
      return 0;
  }
  return 0;
}

// Relative L2 error (infinite when `got` has a non-finite value or the sizes differ) and the
// max absolute error.
OutputCheck compare(const std::vector<float>& got, const std::vector<float>& want) {
  OutputCheck c;
  if (got.size() != want.size()) {
    c.error = c.max_abs_error = INFINITY;
    return c;
  }
  double diff = 0, norm = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      c.error = c.max_abs_error = INFINITY;
      return c;
    }
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  c.error = std::sqrt(diff / std::max(norm, 1e-30));
  c.max_abs_error = max_abs;
  return c;
}

// Each bf16 value must be one of the two bf16 neighbours of its fp32 master value; error = the
// fraction that is not.
OutputCheck bracket(const std::vector<float>& working, const std::vector<float>& master) {
  OutputCheck c;
  if (working.size() != master.size() || working.empty()) {
    c.error = c.max_abs_error = INFINITY;
    return c;
  }
  size_t bad = 0;
  double max_abs = 0;
  for (size_t i = 0; i < working.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &master[i], 4);
    const uint32_t down_bits = bits & 0xffff0000u, up_bits = down_bits + 0x10000u;
    float down, up;
    std::memcpy(&down, &down_bits, 4);
    std::memcpy(&up, &up_bits, 4);
    if (!(working[i] == down || working[i] == up)) {
      ++bad;
      max_abs = std::max(max_abs, std::isfinite(working[i])
                                      ? std::fabs(static_cast<double>(working[i]) - master[i])
                                      : INFINITY);
    }
  }
  c.error = static_cast<double>(bad) / static_cast<double>(working.size());
  c.max_abs_error = max_abs;
  return c;
}

Attempt attempt(const Implementation& impl, const CheckShape& shape, uint64_t seed) {
  Attempt a;
  a.implementation = impl.name;
  const std::string where = std::string(family_name(impl.family)) + "/" + impl.name;
  const auto start = std::chrono::steady_clock::now();
  try {
    const Case k = make_case(impl.family, shape, impl.precision, seed);
    const Tensors got = impl.run(k);
    a.passed = true;
    size_t compared = 0;
    for (const auto& [name, want] : k.expected) {
      auto it = got.find(name);
      if (it == got.end()) continue;  // an output this implementation does not produce
      ++compared;
      const OutputKind kind = output_kind(impl.family, name);
      OutputCheck c = kind == OutputKind::kStochasticBf16 ? bracket(it->second, got.at("master"))
                                                          : compare(it->second, want);
      c.output = name;
      c.tolerance = tolerance(kind, impl.precision);
      c.passed = c.error <= c.tolerance;
      if (!c.passed && a.passed) {
        a.passed = false;
        a.failure = where + ": output " + name + " (" + shape.to_string() + "): " +
                    (kind == OutputKind::kStochasticBf16 ? "fraction of values not a bf16 "
                                                           "neighbour of the master weight "
                                                         : "relative error ") +
                    sci(c.error) + " > tolerance " + sci(c.tolerance) + " (max abs error " +
                    sci(c.max_abs_error) + ")";
      }
      a.outputs.push_back(c);
    }
    if (compared == 0) {
      a.passed = false;
      a.failure = where + ": produced none of the outputs the check compares";
    }
  } catch (const std::exception& e) {
    a.passed = false;
    a.error = e.what();
    a.failure = where + " (" + shape.to_string() + "): failed to run: " + e.what();
  }
  a.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return a;
}

}  // namespace

std::string_view family_name(Family family) {
  switch (family) {
    case Family::kEmbedding:
      return "embedding";
    case Family::kLayerNorm:
      return "layernorm+residual";
    case Family::kMatmulBias:
      return "matmul.bias";
    case Family::kMatmulGelu:
      return "matmul.gelu";
    case Family::kMatmulBackward:
      return "matmul.backward";
    case Family::kClassifierMatmul:
      return "matmul.classifier";
    case Family::kAttention:
      return "attention";
    case Family::kGelu:
      return "gelu";
    case Family::kClassifier:
      return "classifier";
    case Family::kAdamW:
      return "adamw";
    case Family::kGlobalNorm:
      return "global_norm";
    case Family::kCast:
      return "cast";
  }
  return "?";
}

std::string_view status_name(Status status) {
  switch (status) {
    case Status::kPass:
      return "PASS";
    case Status::kFallback:
      return "FALLBACK";
    case Status::kFail:
      return "FAIL";
  }
  return "?";
}

std::string CheckShape::to_string() const {
  return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C()) +
         " NH=" + std::to_string(NH) + " HS=" + std::to_string(HS) + " V=" + std::to_string(V);
}

CheckShape check_shape_for(int n_embd, int n_head, int vocab_size, int context_length) {
  CheckShape s;
  s.HS = std::max(1, n_embd / std::max(1, n_head));
  s.NH = 2;
  s.V = std::max(2, std::min(vocab_size, 300));
  s.T = std::max(1, std::min(80, context_length));
  return s;
}

void Registry::add(Implementation implementation) {
  by_family_[implementation.family].push_back(std::move(implementation));
}

void Registry::replace(Implementation implementation) {
  auto& list = by_family_[implementation.family];
  for (Implementation& existing : list) {
    if (existing.name == implementation.name) {
      existing = std::move(implementation);
      return;
    }
  }
  throw InvalidArgument("self-check registry has no implementation '" + implementation.name +
                        "' of " + std::string(family_name(implementation.family)) + " to replace");
}

const std::vector<Implementation>& Registry::implementations(Family family) const {
  static const std::vector<Implementation> kNone;
  auto it = by_family_.find(family);
  return it == by_family_.end() ? kNone : it->second;
}

bool Report::passed() const {
  for (const FamilyResult& f : families) {
    if (f.status == Status::kFail) return false;
  }
  return !model_step.ran || model_step.passed;
}

const FamilyResult* Report::family(Family f) const {
  for (const FamilyResult& r : families) {
    if (r.family == f) return &r;
  }
  return nullptr;
}

std::string Report::chosen(Family f) const {
  const FamilyResult* r = family(f);
  return r && r->chosen ? *r->chosen : std::string();
}

std::vector<std::string> Report::failures() const {
  std::vector<std::string> out;
  for (const FamilyResult& f : families) {
    for (const Attempt& a : f.attempts) {
      if (!a.passed) out.push_back(a.failure);
    }
  }
  if (model_step.ran && !model_step.passed) out.push_back(model_step.failure);
  return out;
}

std::string Report::to_text() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %-18s %-9s %-20s %s\n", "kernel family", "implementation",
                "status", "output", "error / tolerance");
  out << line;
  for (const FamilyResult& f : families) {
    if (f.attempts.empty()) {
      std::snprintf(line, sizeof line, "%-20s %-18s %-9s no implementation\n",
                    std::string(family_name(f.family)).c_str(), "-", "FAIL");
      out << line;
    }
    for (const Attempt& a : f.attempts) {
      // The attempt's own verdict; the chosen fallback is marked FALLBACK.
      const bool chosen = f.chosen && *f.chosen == a.implementation;
      const std::string status = !a.passed ? "FAIL"
                                 : chosen  ? std::string(status_name(f.status))
                                           : "PASS";
      std::string worst = a.error.empty() ? "" : "error: " + a.error;
      const OutputCheck* shown = nullptr;
      for (const OutputCheck& c : a.outputs) {
        // The failing output, else the one closest to its tolerance.
        if (!shown || (!c.passed && shown->passed) ||
            (c.passed == shown->passed && c.tolerance > 0 && shown->tolerance > 0 &&
             c.error / c.tolerance > shown->error / shown->tolerance)) {
          shown = &c;
        }
      }
      if (shown && worst.empty()) {
        worst = sci(shown->error) + " / " + sci(shown->tolerance);
      }
      std::snprintf(line, sizeof line, "%-20s %-18s %-9s %-20s %s\n",
                    std::string(family_name(f.family)).c_str(), a.implementation.c_str(),
                    status.c_str(), shown ? shown->output.c_str() : "-", worst.c_str());
      out << line;
    }
  }
  if (model_step.ran) {
    out << "model step           " << (model_step.passed ? "PASS" : "FAIL") << "  "
        << (model_step.passed ? model_step.description : model_step.failure) << "\n";
  }
  return out.str();
}

Report run_self_check(const Registry& registry, const CheckShape& shape,
                      const std::vector<Family>& families, uint64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  Report report;
  report.shape = shape;
  for (Family family : families) {
    FamilyResult result;
    result.family = family;
    bool first = true;
    for (const Implementation& impl : registry.implementations(family)) {
      if (impl.supports && !impl.supports(shape)) continue;
      Attempt a = attempt(impl, shape, seed);
      const bool passed = a.passed;
      result.attempts.push_back(std::move(a));
      if (passed) {
        result.chosen = impl.name;
        result.status = first ? Status::kPass : Status::kFallback;
        break;
      }
      first = false;
    }
    report.families.push_back(std::move(result));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

CollectiveCheck check_allreduce_mean(const std::function<void(std::vector<float>&)>& allreduce_mean,
                                     const std::string& implementation, int rank, int world_size,
                                     size_t count, uint64_t seed) {
  auto values_of = [&](int r) {
    std::mt19937_64 rng(seed * 7919u + static_cast<uint64_t>(r));
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> v(count);
    for (float& x : v) x = d(rng);
    return v;
  };
  std::vector<double> mean(count, 0.0);
  for (int r = 0; r < world_size; ++r) {
    const std::vector<float> v = values_of(r);
    for (size_t i = 0; i < count; ++i) mean[i] += v[i];
  }
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = static_cast<float>(mean[i] / world_size);
  CollectiveCheck c;
  const std::string where = "allreduce/" + implementation + " (rank " + std::to_string(rank) +
                            " of " + std::to_string(world_size) + ", " + std::to_string(count) +
                            " floats)";
  try {
    std::vector<float> got = values_of(rank);
    allreduce_mean(got);
    const OutputCheck o = compare(got, want);
    c.error = o.error;
    c.max_abs_error = o.max_abs_error;
    c.passed = c.error <= c.tolerance;
    if (!c.passed) {
      c.failure = where + ": relative error " + sci(c.error) + " > tolerance " + sci(c.tolerance) +
                  " (max abs error " + sci(c.max_abs_error) + ")";
    }
  } catch (const std::exception& e) {
    c.passed = false;
    c.failure = where + ": failed to run: " + e.what();
  }
  return c;
}

}  // namespace longhaul::selfcheck
