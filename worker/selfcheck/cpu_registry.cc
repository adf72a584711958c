// The CPU backend's kernels (longhaul::kernels_cpu, fp32, OpenMP team + OpenBLAS) as self-check
// implementations: what `doctor` and a CPU run check against the double-precision reference.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <longhaul/kernels/cpu/adamw.h>
#include <longhaul/kernels/cpu/attention.h>
#include <longhaul/kernels/cpu/crossentropy.h>
#include <longhaul/kernels/cpu/encoder.h>
#include <longhaul/kernels/cpu/gelu.h>
#include <longhaul/kernels/cpu/global_norm.h>
#include <longhaul/kernels/cpu/layernorm.h>
#include <longhaul/kernels/cpu/matmul.h>

#include "longhaul/selfcheck/selfcheck.h"
#include "selfcheck_internal.h"

namespace longhaul::selfcheck {
namespace {

namespace cpu = longhaul::kernels::cpu;
using Vec = std::vector<float>;

Implementation make(Family family, std::function<Tensors(const Case&)> run) {
  Implementation impl;
  impl.family = family;
  impl.name = "cpu";
  impl.precision = Precision::kFp32;
  impl.run = std::move(run);
  return impl;
}

Tensors embedding(const Case& k) {
  const CheckShape& s = k.shape;
  const int C = s.C();
  Vec out(static_cast<size_t>(s.N()) * C), dwte(static_cast<size_t>(s.V) * C, 0.0f),
      dwpe(static_cast<size_t>(s.T) * C, 0.0f);
  const auto& tokens = k.ints.at("tokens");
  cpu::encoder_forward(out.data(), tokens.data(), k.inputs.at("wte").data(),
                       k.inputs.at("wpe").data(), s.B, s.T, C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), k.inputs.at("dout").data(), tokens.data(), s.B,
                        s.T, C);
  return {{"out", out}, {"dwte", dwte}, {"dwpe", dwpe}};
}

Tensors layernorm(const Case& k) {
  const int N = k.shape.N(), C = k.shape.C();
  const Vec& a = k.inputs.at("a");
  const Vec& b = k.inputs.at("b");
  Vec residual(a.size());
  for (size_t i = 0; i < a.size(); ++i) residual[i] = a[i] + b[i];
  Vec out(residual.size()), mean(N), rstd(N), dinp(residual.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
  // Normalises the residual as the case's precision stores it (bf16 on a GPU; equal to
  // `residual` at fp32).
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), k.inputs.at("residual").data(),
                         k.inputs.at("weight").data(), k.inputs.at("bias").data(), N, C);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), k.inputs.at("dout").data(),
                          k.inputs.at("residual").data(), k.inputs.at("weight").data(),
                          k.inputs.at("mean").data(), k.inputs.at("rstd").data(), N, C);
  return {{"residual", residual}, {"out", out},    {"mean", mean}, {"rstd", rstd},
          {"dinp", dinp},         {"dweight", dw}, {"dbias", db}};
}

Tensors matmul_forward(const Case& k, bool with_gelu) {
  const int N = k.shape.N(), C = k.shape.C(), OC = static_cast<int>(k.scalars.at("OC"));
  Vec pre(static_cast<size_t>(N) * OC);
  cpu::matmul_forward(pre.data(), k.inputs.at("inp").data(), k.inputs.at("weight").data(),
                      k.inputs.at("bias").data(), N, C, OC);
  if (!with_gelu) return {{"out", pre}};
  Vec out(pre.size());
  cpu::gelu_forward(out.data(), pre.data(), pre.size());
  return {{"pre", pre}, {"out", out}};
}

Tensors matmul_backward(const Case& k) {
  const int N = k.shape.N(), C = k.shape.C(), OC = static_cast<int>(k.scalars.at("OC"));
  Vec dinp(static_cast<size_t>(N) * C, 0.0f), dw(static_cast<size_t>(C) * OC, 0.0f), db(OC, 0.0f);
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), k.inputs.at("dout").data(),
                       k.inputs.at("inp").data(), k.inputs.at("weight").data(), N, C, OC);
  return {{"dinp", dinp}, {"dweight", dw}, {"dbias", db}};
}

Tensors classifier_matmul(const Case& k) {
  const int N = k.shape.N(), C = k.shape.C(), V = k.shape.V;
  Vec logits(static_cast<size_t>(N) * V), dinp(static_cast<size_t>(N) * C, 0.0f),
      dwte(static_cast<size_t>(V) * C, 0.0f);
  cpu::matmul_nt_forward(logits.data(), k.inputs.at("inp").data(), k.inputs.at("wte").data(), N, C,
                         V);
  cpu::matmul_nt_backward(dinp.data(), dwte.data(), k.inputs.at("dlogits").data(),
                          k.inputs.at("inp").data(), k.inputs.at("wte").data(), N, C, V);
  return {{"logits", logits}, {"dinp", dinp}, {"dwte", dwte}};
}

Tensors attention(const Case& k) {
  const CheckShape& s = k.shape;
  const int C = s.C();
  const Vec& qkv = k.inputs.at("qkv");
  Vec out(static_cast<size_t>(s.N()) * C), att(static_cast<size_t>(s.B) * s.NH * s.T * s.T),
      dqkv(qkv.size(), 0.0f), datt(att.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, C, s.NH);
  cpu::attention_backward(dqkv.data(), datt.data(), k.inputs.at("dout").data(), qkv.data(),
                          att.data(), s.B, s.T, C, s.NH);
  return {{"out", out}, {"dqkv", dqkv}};
}

Tensors gelu(const Case& k) {
  const Vec& x = k.inputs.at("inp");
  Vec out(x.size()), dinp(x.size(), 0.0f);
  cpu::gelu_forward(out.data(), x.data(), x.size());
  cpu::gelu_backward(dinp.data(), x.data(), k.inputs.at("dout").data(), x.size());
  return {{"out", out}, {"dinp", dinp}};
}

Tensors classifier(const Case& k) {
  const int N = k.shape.N(), V = k.shape.V;
  Vec logits = k.inputs.at("logits"), losses(N);
  cpu::crossentropy_forward_backward(losses.data(), logits.data(), k.ints.at("targets").data(),
                                     static_cast<float>(k.scalars.at("dloss")), N, V);
  return {{"losses", losses}, {"dlogits", logits}};
}

Tensors adamw(const Case& k) {
  Vec params = k.inputs.at("params"), m = k.inputs.at("m"), v = k.inputs.at("v");
  cpu::adamw_update(params.data(), k.inputs.at("grads").data(), m.data(), v.data(), params.size(),
                    adamw_hyper(k));
  return {{"master", params}, {"m", m}, {"v", v}};
}

Tensors global_norm(const Case& k) {
  const Vec& x = k.inputs.at("x");
  return {{"sum_of_squares", {static_cast<float>(cpu::sum_of_squares(x.data(), x.size()))}}};
}

}  // namespace

Registry cpu_registry() {
  Registry r;
  r.add(make(Family::kEmbedding, embedding));
  r.add(make(Family::kLayerNorm, layernorm));
  r.add(make(Family::kMatmulBias, [](const Case& k) { return matmul_forward(k, false); }));
  r.add(make(Family::kMatmulGelu, [](const Case& k) { return matmul_forward(k, true); }));
  r.add(make(Family::kMatmulBackward, matmul_backward));
  r.add(make(Family::kClassifierMatmul, classifier_matmul));
  r.add(make(Family::kAttention, attention));
  r.add(make(Family::kGelu, gelu));
  r.add(make(Family::kClassifier, classifier));
  r.add(make(Family::kAdamW, adamw));
  r.add(make(Family::kGlobalNorm, global_norm));
  return r;
}

}  // namespace longhaul::selfcheck
