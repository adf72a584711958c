// The self-check problems: for each kernel family, random inputs at the check shape and the
// outputs of a plain double-precision reference written from the math in the CPU kernels'
// headers (worker/kernels/cpu/include), independent of both backends' optimisations (no BLAS,
// no approximate exp/tanh, no threads). Inputs an implementation of bf16 precision reads as bf16
// are rounded to bf16 first, so the comparison measures the kernel's own arithmetic, as the
// kernel tests do.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "longhaul/base/error.h"
#include "longhaul/selfcheck/selfcheck.h"
#include "selfcheck_internal.h"

namespace longhaul::selfcheck {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}
  // Non-zero values: a uniform magnitude in [0.1, 1] * scale with a random sign.
  Vec floats(size_t n, float scale = 1.0f) {
    std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
    std::bernoulli_distribution sign(0.5);
    Vec out(n);
    for (float& x : out) x = scale * magnitude(rng_) * (sign(rng_) ? 1.0f : -1.0f);
    return out;
  }
  std::vector<int32_t> ints(size_t n, int32_t bound) {
    std::uniform_int_distribution<int32_t> d(0, bound - 1);
    std::vector<int32_t> out(n);
    for (int32_t& x : out) x = d(rng_);
    return out;
  }

 private:
  std::mt19937_64 rng_;
};

Vec to_float(const DVec& x) { return Vec(x.begin(), x.end()); }

double gelu(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) +
         0.5 * x * (1.0 - th * th) * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

// y (N, OC) = x (N, C) @ w (C, OC) + bias
DVec linear(const Vec& x, const Vec& w, const Vec* bias, int N, int C, int OC) {
  DVec y(static_cast<size_t>(N) * OC);
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[i * C + c]) * w[c * OC + o];
      y[static_cast<size_t>(i) * OC + o] = s;
    }
  }
  return y;
}

void embedding(Case& k, Random& rng) {
  const CheckShape& s = k.shape;
  const int B = s.B, T = s.T, C = s.C(), V = s.V, N = s.N();
  const bool bf = k.precision == Precision::kBf16;
  Vec wte = maybe_round(rng.floats(static_cast<size_t>(V) * C), bf);
  Vec wpe = maybe_round(rng.floats(static_cast<size_t>(T) * C), bf);
  Vec dout = maybe_round(rng.floats(static_cast<size_t>(N) * C), bf);
  // Few distinct tokens: many repeats per bucket in the backward pass.
  std::vector<int32_t> tokens = rng.ints(N, std::min(V, 40));
  DVec out(static_cast<size_t>(N) * C), dwte(static_cast<size_t>(V) * C, 0.0),
      dwpe(static_cast<size_t>(T) * C, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int i = b * T + t, tok = tokens[i];
      for (int c = 0; c < C; ++c) {
        out[static_cast<size_t>(i) * C + c] =
            static_cast<double>(wte[static_cast<size_t>(tok) * C + c]) + wpe[t * C + c];
        dwte[static_cast<size_t>(tok) * C + c] += dout[static_cast<size_t>(i) * C + c];
        dwpe[t * C + c] += dout[static_cast<size_t>(i) * C + c];
      }
    }
  }
  k.inputs = {{"wte", wte}, {"wpe", wpe}, {"dout", dout}};
  k.ints = {{"tokens", tokens}};
  k.expected = {{"out", to_float(out)}, {"dwte", to_float(dwte)}, {"dwpe", to_float(dwpe)}};
}

void layernorm(Case& k, Random& rng) {
  const int N = k.shape.N(), C = k.shape.C();
  const bool bf = k.precision == Precision::kBf16;
  const Vec a = maybe_round(rng.floats(static_cast<size_t>(N) * C, 2.0f), bf);
  const Vec b = maybe_round(rng.floats(static_cast<size_t>(N) * C), bf);
  const Vec w = maybe_round(rng.floats(C), bf), bias = maybe_round(rng.floats(C), bf);
  const Vec dout = maybe_round(rng.floats(static_cast<size_t>(N) * C), bf);
  Vec residual(static_cast<size_t>(N) * C);
  for (size_t i = 0; i < residual.size(); ++i) residual[i] = a[i] + b[i];
  // A bf16 kernel stores the residual in bf16 and normalises what it stored.
  const Vec stored = maybe_round(residual, bf);
  DVec out(static_cast<size_t>(N) * C), mean(N), rstd(N), dinp(static_cast<size_t>(N) * C),
      dw(C, 0.0), db(C, 0.0);
  for (int i = 0; i < N; ++i) {
    const float* x = &stored[static_cast<size_t>(i) * C];
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + 1e-5);
    mean[i] = m;
    rstd[i] = r;
    double mean_g = 0, mean_gn = 0;
    for (int c = 0; c < C; ++c) {
      const double n = (x[c] - m) * r;
      out[static_cast<size_t>(i) * C + c] = n * w[c] + bias[c];
      const double d = dout[static_cast<size_t>(i) * C + c];
      db[c] += d;
      dw[c] += d * n;
      mean_g += d * w[c];
      mean_gn += d * w[c] * n;
    }
    mean_g /= C;
    mean_gn /= C;
    for (int c = 0; c < C; ++c) {
      const double n = (x[c] - m) * r;
      const double g = dout[static_cast<size_t>(i) * C + c] * w[c];
      dinp[static_cast<size_t>(i) * C + c] = r * (g - mean_g - n * mean_gn);
    }
  }
  k.inputs = {{"a", a},
              {"b", b},
              {"weight", w},
              {"bias", bias},
              {"dout", dout},
              {"residual", stored},
              {"mean", to_float(mean)},
              {"rstd", to_float(rstd)}};
  k.expected = {{"residual", residual},   {"out", to_float(out)},   {"mean", to_float(mean)},
                {"rstd", to_float(rstd)}, {"dinp", to_float(dinp)}, {"dweight", to_float(dw)},
                {"dbias", to_float(db)}};
}

void matmul_forward(Case& k, Random& rng, bool with_gelu) {
  const int N = k.shape.N(), C = k.shape.C(), OC = (with_gelu ? 4 : 3) * C;
  const bool bf = k.precision == Precision::kBf16;
  const Vec x = maybe_round(rng.floats(static_cast<size_t>(N) * C), bf);
  const Vec w = maybe_round(rng.floats(static_cast<size_t>(C) * OC, 0.2f), bf);
  const Vec bias = maybe_round(rng.floats(OC), bf);
  const DVec pre = linear(x, w, &bias, N, C, OC);
  k.inputs = {{"inp", x}, {"weight", w}, {"bias", bias}};
  k.scalars = {{"OC", OC}};
  if (!with_gelu) {
    k.expected = {{"out", to_float(pre)}};
    return;
  }
  DVec out(pre.size());
  for (size_t i = 0; i < pre.size(); ++i) out[i] = gelu(pre[i]);
  k.expected = {{"pre", to_float(pre)}, {"out", to_float(out)}};
}

void matmul_backward(Case& k, Random& rng) {
  const int N = k.shape.N(), C = k.shape.C(), OC = 3 * C;
  const bool bf = k.precision == Precision::kBf16;
  const Vec x = maybe_round(rng.floats(static_cast<size_t>(N) * C), bf);
  const Vec w = maybe_round(rng.floats(static_cast<size_t>(C) * OC, 0.2f), bf);
  const Vec dout = maybe_round(rng.floats(static_cast<size_t>(N) * OC), bf);
  DVec dinp(static_cast<size_t>(N) * C, 0.0), dw(static_cast<size_t>(C) * OC, 0.0), db(OC, 0.0);
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OC; ++o) {
      const double d = dout[static_cast<size_t>(i) * OC + o];
      db[o] += d;
      for (int c = 0; c < C; ++c) {
        dinp[static_cast<size_t>(i) * C + c] += d * w[static_cast<size_t>(c) * OC + o];
        dw[static_cast<size_t>(c) * OC + o] += d * x[static_cast<size_t>(i) * C + c];
      }
    }
  }
  k.inputs = {{"inp", x}, {"weight", w}, {"dout", dout}};
  k.scalars = {{"OC", OC}};
  k.expected = {{"dinp", to_float(dinp)}, {"dweight", to_float(dw)}, {"dbias", to_float(db)}};
}

void classifier_matmul(Case& k, Random& rng) {
  const int N = k.shape.N(), C = k.shape.C(), V = k.shape.V;
  const bool bf = k.precision == Precision::kBf16;
  const Vec x = maybe_round(rng.floats(static_cast<size_t>(N) * C), bf);
  const Vec wte = maybe_round(rng.floats(static_cast<size_t>(V) * C, 0.2f), bf);
  const Vec dlogits = maybe_round(rng.floats(static_cast<size_t>(N) * V), bf);
  DVec logits(static_cast<size_t>(N) * V), dinp(static_cast<size_t>(N) * C, 0.0),
      dwte(static_cast<size_t>(V) * C, 0.0);
  for (int i = 0; i < N; ++i) {
    for (int v = 0; v < V; ++v) {
      double s = 0;
      const double d = dlogits[static_cast<size_t>(i) * V + v];
      for (int c = 0; c < C; ++c) {
        s += static_cast<double>(x[static_cast<size_t>(i) * C + c]) *
             wte[static_cast<size_t>(v) * C + c];
        dinp[static_cast<size_t>(i) * C + c] += d * wte[static_cast<size_t>(v) * C + c];
        dwte[static_cast<size_t>(v) * C + c] += d * x[static_cast<size_t>(i) * C + c];
      }
      logits[static_cast<size_t>(i) * V + v] = s;
    }
  }
  k.inputs = {{"inp", x}, {"wte", wte}, {"dlogits", dlogits}};
  k.expected = {{"logits", to_float(logits)}, {"dinp", to_float(dinp)}, {"dwte", to_float(dwte)}};
}

void attention(Case& k, Random& rng) {
  const CheckShape& s = k.shape;
  const int B = s.B, T = s.T, C = s.C(), NH = s.NH, HS = s.HS;
  const bool bf = k.precision == Precision::kBf16;
  const Vec qkv = maybe_round(rng.floats(static_cast<size_t>(B) * T * 3 * C), bf);
  const Vec dout = maybe_round(rng.floats(static_cast<size_t>(B) * T * C), bf);
  DVec out(static_cast<size_t>(B) * T * C, 0.0), dqkv(qkv.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  auto at = [&](int b, int t, int part, int h, int d) {
    return static_cast<size_t>(b * T + t) * 3 * C + static_cast<size_t>(part) * C + h * HS + d;
  };
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double sc = 0;
          for (int d = 0; d < HS; ++d)
            sc += static_cast<double>(qkv[at(b, t, 0, h, d)]) * qkv[at(b, u, 1, h, d)];
          p[u] = sc * scale;
          mx = std::max(mx, p[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; ++u) sum += (p[u] = std::exp(p[u] - mx));
        for (int u = 0; u <= t; ++u) p[u] /= sum;
        const size_t o = static_cast<size_t>(b * T + t) * C + h * HS;
        for (int d = 0; d < HS; ++d) {
          double y = 0;
          for (int u = 0; u <= t; ++u) y += p[u] * qkv[at(b, u, 2, h, d)];
          out[o + d] = y;
        }
        // Backward of this query row.
        double dot = 0;
        for (int u = 0; u <= t; ++u) {
          double g = 0;
          for (int d = 0; d < HS; ++d)
            g += static_cast<double>(dout[o + d]) * qkv[at(b, u, 2, h, d)];
          dp[u] = g;
          dot += p[u] * g;
        }
        for (int u = 0; u <= t; ++u) {
          const double dz = p[u] * (dp[u] - dot) * scale;
          for (int d = 0; d < HS; ++d) {
            dqkv[at(b, u, 2, h, d)] += p[u] * dout[o + d];
            dqkv[at(b, t, 0, h, d)] += dz * qkv[at(b, u, 1, h, d)];
            dqkv[at(b, u, 1, h, d)] += dz * qkv[at(b, t, 0, h, d)];
          }
        }
      }
    }
  }
  k.inputs = {{"qkv", qkv}, {"dout", dout}};
  k.expected = {{"out", to_float(out)}, {"dqkv", to_float(dqkv)}};
}

void gelu_family(Case& k, Random& rng) {
  const size_t n = static_cast<size_t>(k.shape.N()) * 4 * k.shape.C();
  const bool bf = k.precision == Precision::kBf16;
  const Vec x = maybe_round(rng.floats(n, 4.0f), bf), dout = maybe_round(rng.floats(n), bf);
  DVec out(n), dinp(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = gelu(x[i]);
    dinp[i] = gelu_grad(x[i]) * dout[i];
  }
  k.inputs = {{"inp", x}, {"dout", dout}};
  k.expected = {{"out", to_float(out)}, {"dinp", to_float(dinp)}};
}

void classifier(Case& k, Random& rng) {
  const int N = k.shape.N(), V = k.shape.V;
  const bool bf = k.precision == Precision::kBf16;
  const Vec logits = maybe_round(rng.floats(static_cast<size_t>(N) * V, 4.0f), bf);
  const std::vector<int32_t> targets = rng.ints(N, V);
  const double dloss = 1.0 / N;
  DVec losses(N), dlogits(logits.size());
  for (int i = 0; i < N; ++i) {
    const float* z = &logits[static_cast<size_t>(i) * V];
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const double lse = mx + std::log(sum);
    losses[i] = lse - z[targets[i]];
    for (int v = 0; v < V; ++v) {
      dlogits[static_cast<size_t>(i) * V + v] =
          dloss * (std::exp(z[v] - lse) - (v == targets[i] ? 1.0 : 0.0));
    }
  }
  k.inputs = {{"logits", logits}};
  k.ints = {{"targets", targets}};
  k.scalars = {{"dloss", dloss}};
  k.expected = {{"losses", to_float(losses)}, {"dlogits", to_float(dlogits)}};
}

void adamw(Case& k, Random& rng) {
  const size_t n = 20000;
  // fp32 everywhere (master weights, gradients and moments are fp32 on every backend).
  const Vec params = rng.floats(n, 0.05f), grads = rng.floats(n, 0.01f), m0 = rng.floats(n, 0.001f);
  Vec v0 = rng.floats(n, 1e-5f);
  for (float& x : v0) x = std::fabs(x);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, grad_scale = 0.7;
  const int64_t t = 3;
  DVec master(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(grads[i]) * grad_scale;
    m[i] = b1 * m0[i] + (1 - b1) * g;
    v[i] = b2 * v0[i] + (1 - b2) * g * g;
    const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
    master[i] = params[i] - lr * (mh / (std::sqrt(vh) + eps) + wd * params[i]);
  }
  k.inputs = {{"params", params}, {"grads", grads}, {"m", m0}, {"v", v0}};
  k.scalars = {{"lr", lr},
               {"beta1", b1},
               {"beta2", b2},
               {"eps", eps},
               {"weight_decay", wd},
               {"grad_scale", grad_scale},
               {"t", static_cast<double>(t)}};
  k.expected = {
      {"master", to_float(master)}, {"m", to_float(m)}, {"v", to_float(v)}, {"params_bf16", {}}};
}

void global_norm(Case& k, Random& rng) {
  const size_t n = 200003;  // not a multiple of 4: the vector kernels' scalar tail
  const Vec x = rng.floats(n);
  double s = 0;
  for (float value : x) s += static_cast<double>(value) * value;
  k.inputs = {{"x", x}};
  k.expected = {{"sum_of_squares", {static_cast<float>(s)}}};
}

void cast(Case& k, Random& rng) {
  const Vec x = rng.floats(10007, 3.0f);
  k.inputs = {{"x", x}};
  k.expected = {{"out", round_bf16(x)}};
}

}  // namespace

float round_bf16(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  bits &= 0xffff0000u;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

std::vector<float> round_bf16(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = round_bf16(x[i]);
  return out;
}

std::vector<float> maybe_round(std::vector<float> x, bool to_bf16) {
  return to_bf16 ? round_bf16(x) : x;
}

kernels::AdamWHyper adamw_hyper(const Case& c) {
  kernels::AdamWHyper h;
  h.lr = static_cast<float>(c.scalars.at("lr"));
  h.beta1 = static_cast<float>(c.scalars.at("beta1"));
  h.beta2 = static_cast<float>(c.scalars.at("beta2"));
  h.eps = static_cast<float>(c.scalars.at("eps"));
  h.weight_decay = static_cast<float>(c.scalars.at("weight_decay"));
  h.grad_scale = static_cast<float>(c.scalars.at("grad_scale"));
  h.t = static_cast<int64_t>(c.scalars.at("t"));
  h.seed = 1234;
  return h;
}

OutputKind output_kind(Family family, const std::string& output) {
  switch (family) {
    case Family::kEmbedding:
      return output == "out" ? OutputKind::kActivation : OutputKind::kStatistic;
    case Family::kLayerNorm:
      return (output == "residual" || output == "out" || output == "dinp") ? OutputKind::kActivation
                                                                           : OutputKind::kStatistic;
    case Family::kMatmulBias:
    case Family::kMatmulGelu:
    case Family::kGelu:
    case Family::kAttention:
      return OutputKind::kActivation;
    case Family::kMatmulBackward:
      return output == "dinp" ? OutputKind::kActivation : OutputKind::kGemmFp32;
    case Family::kClassifierMatmul:
      return output == "dwte" ? OutputKind::kGemmFp32 : OutputKind::kActivation;
    case Family::kClassifier:
      return output == "losses" ? OutputKind::kStatistic : OutputKind::kActivation;
    case Family::kAdamW:
      return output == "params_bf16" ? OutputKind::kStochasticBf16 : OutputKind::kStatistic;
    case Family::kGlobalNorm:
      return OutputKind::kStatistic;
    case Family::kCast:
      return OutputKind::kExact;
  }
  return OutputKind::kStatistic;
}

Case make_case(Family family, const CheckShape& shape, Precision precision, uint64_t seed) {
  Case k;
  k.family = family;
  k.shape = shape;
  k.precision = precision;
  Random rng(seed * 1000003u + static_cast<uint64_t>(family));
  switch (family) {
    case Family::kEmbedding:
      embedding(k, rng);
      break;
    case Family::kLayerNorm:
      layernorm(k, rng);
      break;
    case Family::kMatmulBias:
      matmul_forward(k, rng, false);
      break;
    case Family::kMatmulGelu:
      matmul_forward(k, rng, true);
      break;
    case Family::kMatmulBackward:
      matmul_backward(k, rng);
      break;
    case Family::kClassifierMatmul:
      classifier_matmul(k, rng);
      break;
    case Family::kAttention:
      attention(k, rng);
      break;
    case Family::kGelu:
      gelu_family(k, rng);
      break;
    case Family::kClassifier:
      classifier(k, rng);
      break;
    case Family::kAdamW:
      adamw(k, rng);
      break;
    case Family::kGlobalNorm:
      global_norm(k, rng);
      break;
    case Family::kCast:
      cast(k, rng);
      break;
  }
  return k;
}

}  // namespace longhaul::selfcheck
