// Helpers shared by the self-check's sources (not part of the public interface).
#pragma once

#include <string>
#include <vector>

#include <longhaul/kernels/adamw_hyper.h>

#include "longhaul/selfcheck/selfcheck.h"

namespace longhaul::selfcheck {

// How an output is compared (the tolerance table in selfcheck.h).
enum class OutputKind { kActivation, kStatistic, kGemmFp32, kExact, kStochasticBf16 };
OutputKind output_kind(Family family, const std::string& output);

// Host bf16 rounding (round to nearest even), values kept as fp32.
float round_bf16(float x);
std::vector<float> round_bf16(const std::vector<float>& x);
std::vector<float> maybe_round(std::vector<float> x, bool to_bf16);

// The AdamW case's scalars (families.cc) as both optimizers take them; seed 1234.
kernels::AdamWHyper adamw_hyper(const Case& c);

}  // namespace longhaul::selfcheck
