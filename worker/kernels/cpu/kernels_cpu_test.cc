// Every CPU kernel's backward against central finite differences of its forward, plus the
// forward against a plain reference where one is short to write.
//
// Method: for a kernel y = f(x) we take a fixed random projection w and the scalar
// L(x) = sum_i w_i y_i, accumulated in double from the fp32 outputs. The backward called with
// dout = w must give dL/dx. Numeric derivative: (L(x + eps e_j) - L(x - eps e_j)) / (2 eps) with
// eps = 1e-3 on O(1) inputs; fp32 rounding of the outputs puts ~1e-4 of noise on it, the
// truncation error is O(eps^2). Tolerance: |numeric - analytic| <= 2e-3 + 2e-2 |numeric|.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/kernels/cpu/adamw.h>
#include <longhaul/kernels/cpu/attention.h>
#include <longhaul/kernels/cpu/crossentropy.h>
#include <longhaul/kernels/cpu/encoder.h>
#include <longhaul/kernels/cpu/gelu.h>
#include <longhaul/kernels/cpu/global_norm.h>
#include <longhaul/kernels/cpu/layernorm.h>
#include <longhaul/kernels/cpu/matmul.h>
#include <longhaul/kernels/cpu/residual.h>
#include <longhaul/kernels/cpu/threading.h>

namespace longhaul::kernels::cpu {
namespace {

constexpr float kEps = 1e-3f;
constexpr double kAtol = 2e-3;
constexpr double kRtol = 2e-2;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Compares `analytic` with central differences of `loss` with respect to every element of `x`.
void expect_gradient(std::vector<float>& x, const std::vector<float>& analytic,
                     const std::function<double()>& loss, const std::string& what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  int failures = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    const float saved = x[j];
    x[j] = saved + kEps;
    const double plus = loss();
    x[j] = saved - kEps;
    const double minus = loss();
    x[j] = saved;
    const double numeric = (plus - minus) / (2.0 * kEps);
    if (std::abs(numeric - analytic[j]) > kAtol + kRtol * std::abs(numeric) && ++failures < 5) {
      ADD_FAILURE() << what << "[" << j << "]: analytic " << analytic[j] << " numeric " << numeric;
    }
  }
}

TEST(Encoder, ForwardAddsTokenAndPositionRows) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 4};
  auto wte = randn(V * C, 1), wpe = randn(T * C, 2);
  std::vector<float> out(B * T * C);
  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int bt = 0; bt < B * T; ++bt) {
    for (int c = 0; c < C; ++c) {
      EXPECT_EQ(out[bt * C + c], wte[tokens[bt] * C + c] + wpe[(bt % T) * C + c]);
    }
  }
}

TEST(Encoder, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 20, V = 5;             // C > 16 exercises more than one channel block
  std::vector<int32_t> tokens = {1, 4, 1, 0, 1, 4};  // repeated tokens must accumulate
  auto wte = randn(V * C, 1), wpe = randn(T * C, 2), w = randn(B * T * C, 3);
  std::vector<float> out(B * T * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, w);
  };
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  expect_gradient(wte, dwte, loss, "dwte");
  expect_gradient(wpe, dwpe, loss, "dwpe");
}

TEST(LayerNorm, ForwardNormalisesEachRow) {
  const int N = 3, C = 33;
  auto inp = randn(N * C, 4, 3.0f);
  for (float& x : inp) x += 5.0f;
  std::vector<float> weight(C, 1.0f), bias(C, 0.0f), out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N,
                    C);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += out[i * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (out[i * C + c] - m) * (out[i * C + c] - m);
    v /= C;
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v, 1.0, 1e-3);
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int N = 4, C = 20;
  auto inp = randn(N * C, 5), weight = randn(C, 6), bias = randn(C, 7), w = randn(N * C, 8);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                      N, C);
    return dot(out, w);
  };
  loss();
  std::vector<float> dinp(N * C, 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), N, C);
  expect_gradient(inp, dinp, loss, "dinp");
  expect_gradient(weight, dweight, loss, "dweight");
  expect_gradient(bias, dbias, loss, "dbias");
}

TEST(LayerNorm, BackwardIsBitIdenticalForAnyThreadCount) {
  const int N = 1024, C = 48;  // large enough to run multi-threaded
  auto inp = randn(N * C, 9), weight = randn(C, 10), bias = randn(C, 11), d = randn(N * C, 12);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N,
                    C);
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> g(N * C + 2 * C, 0.0f);
    layernorm_backward(g.data(), g.data() + N * C, g.data() + N * C + C, d.data(), inp.data(),
                       weight.data(), mean.data(), rstd.data(), N, C);
    return g;
  };
  const auto one = run(1), three = run(3);
  set_num_threads(0);
  EXPECT_EQ(one, three);
}

TEST(Matmul, ForwardMatchesNaiveProduct) {
  const int N = 5, C = 7, OC = 6;
  auto inp = randn(N * C, 13), weight = randn(C * OC, 14), bias = randn(OC, 15);
  std::vector<float> out(N * OC);
  matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OC; ++o) {
      double ref = bias[o];
      for (int c = 0; c < C; ++c) ref += static_cast<double>(inp[i * C + c]) * weight[c * OC + o];
      EXPECT_NEAR(out[i * OC + o], ref, 1e-5) << i << "," << o;
    }
  }
  matmul_forward(out.data(), inp.data(), weight.data(), nullptr, N, C, OC);
  double ref = 0;
  for (int c = 0; c < C; ++c) ref += static_cast<double>(inp[c]) * weight[c * OC];
  EXPECT_NEAR(out[0], ref, 1e-5);
}

TEST(Matmul, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 4, C = 5, OC = 70;  // OC > 64 exercises two bias blocks
  auto inp = randn(N * C, 16), weight = randn(C * OC, 17), bias = randn(OC, 18),
       w = randn(N * OC, 19);
  std::vector<float> out(N * OC);
  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return dot(out, w);
  };
  std::vector<float> dinp(N * C, 0.0f), dweight(C * OC, 0.0f), dbias(OC, 0.0f);
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), N,
                  C, OC);
  expect_gradient(inp, dinp, loss, "dinp");
  expect_gradient(weight, dweight, loss, "dweight");
  expect_gradient(bias, dbias, loss, "dbias");

  // A second call adds the same gradient again.
  auto dinp2 = dinp, dweight2 = dweight, dbias2 = dbias;
  matmul_backward(dinp2.data(), dweight2.data(), dbias2.data(), w.data(), inp.data(), weight.data(),
                  N, C, OC);
  for (size_t i = 0; i < dinp.size(); ++i) EXPECT_FLOAT_EQ(dinp2[i], 2 * dinp[i]);
  for (size_t i = 0; i < dbias.size(); ++i) EXPECT_FLOAT_EQ(dbias2[i], 2 * dbias[i]);
}

TEST(Matmul, LargeBackwardMatchesNaiveReferenceWhicheverSideIsSplit) {
  // Big enough to run multi-threaded; once with C > OC (dW split by rows), once with C < OC.
  for (auto [C, OC] : {std::pair{96, 40}, std::pair{40, 96}}) {
    const int N = 300;
    auto inp = randn(N * C, 30), weight = randn(C * OC, 31), dout = randn(N * OC, 32);
    std::vector<float> dinp(N * C, 0.0f), dweight(C * OC, 0.0f), dbias(OC, 0.0f);
    matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                    weight.data(), N, C, OC);
    for (int c = 0; c < C; c += 7) {
      for (int o = 0; o < OC; o += 5) {
        double ref = 0;
        for (int i = 0; i < N; ++i) ref += static_cast<double>(inp[i * C + c]) * dout[i * OC + o];
        ASSERT_NEAR(dweight[c * OC + o], ref, 1e-3)
            << C << "x" << OC << " dW[" << c << "," << o << "]";
      }
    }
    for (int i = 0; i < N; i += 37) {
      for (int c = 0; c < C; c += 11) {
        double ref = 0;
        for (int o = 0; o < OC; ++o)
          ref += static_cast<double>(dout[i * OC + o]) * weight[c * OC + o];
        ASSERT_NEAR(dinp[i * C + c], ref, 1e-3)
            << C << "x" << OC << " dinp[" << i << "," << c << "]";
      }
    }
  }
}

TEST(MatmulNT, BackwardMatchesFiniteDifferences) {
  const int N = 4, C = 6, OC = 9;
  auto inp = randn(N * C, 20), weight = randn(OC * C, 21), w = randn(N * OC, 22);
  std::vector<float> out(N * OC);
  auto loss = [&] {
    matmul_nt_forward(out.data(), inp.data(), weight.data(), N, C, OC);
    return dot(out, w);
  };
  loss();
  double ref = 0;
  for (int c = 0; c < C; ++c) ref += static_cast<double>(inp[C + c]) * weight[2 * C + c];
  EXPECT_NEAR(out[OC + 2], ref, 1e-5);
  std::vector<float> dinp(N * C, 0.0f), dweight(OC * C, 0.0f);
  matmul_nt_backward(dinp.data(), dweight.data(), w.data(), inp.data(), weight.data(), N, C, OC);
  expect_gradient(inp, dinp, loss, "dinp");
  expect_gradient(weight, dweight, loss, "dweight");
}

TEST(Attention, ForwardIsCausalAndRowsSumToOne) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 23);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int r = 0; r < B * NH * T; ++r) {
    const int t = r % T;
    double sum = 0;
    for (int s = 0; s < T; ++s) {
      sum += att[r * T + s];
      if (s > t) {
        EXPECT_EQ(att[r * T + s], 0.0f);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  // Changing the last position's k and v leaves every earlier output unchanged.
  auto before = out;
  for (int c = C; c < 3 * C; ++c) qkv[(T - 1) * 3 * C + c] += 1.0f;
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int t = 0; t < T - 1; ++t) {
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[t * C + c], before[t * C + c]);
  }
  // Position 0 attends only to itself: its output is its own v.
  for (int c = 0; c < C; ++c) EXPECT_FLOAT_EQ(out[c], qkv[2 * C + c]);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 4, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 24), w = randn(B * T * C, 25);
  std::vector<float> out(B * T * C), att(B * NH * T * T), datt(B * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, w);
  };
  loss();
  std::vector<float> dqkv(B * T * 3 * C, 0.0f);
  attention_backward(dqkv.data(), datt.data(), w.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_gradient(qkv, dqkv, loss, "dqkv");
}

TEST(Gelu, ForwardMatchesTanhFormulaAndBackwardMatchesFiniteDifferences) {
  std::vector<float> x = {-3.0f, -1.0f, -0.1f, 0.0f, 0.5f, 1.0f, 2.5f};
  std::vector<float> y(x.size());
  gelu_forward(y.data(), x.data(), x.size());
  EXPECT_NEAR(y[5], 0.8411920f, 1e-6);   // gelu_tanh(1)
  EXPECT_NEAR(y[1], -0.1588080f, 1e-6);  // gelu_tanh(-1)
  EXPECT_EQ(y[3], 0.0f);
  auto w = randn(x.size(), 26);
  auto loss = [&] {
    gelu_forward(y.data(), x.data(), x.size());
    return dot(y, w);
  };
  std::vector<float> dx(x.size(), 0.0f);
  gelu_backward(dx.data(), x.data(), w.data(), x.size());
  expect_gradient(x, dx, loss, "dx");
}

TEST(Residual, AddsAndPassesGradientToBothInputs) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30}, out(3), da(3, 1.0f), db(3, 0.0f);
  residual_forward(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33}));
  std::vector<float> d = {0.5f, -1.0f, 2.0f};
  residual_backward(da.data(), db.data(), d.data(), 3);
  EXPECT_EQ(da, (std::vector<float>{1.5f, 0.0f, 3.0f}));
  EXPECT_EQ(db, d);
}

TEST(CrossEntropy, LossMatchesReferenceAndGradientMatchesFiniteDifferences) {
  const int N = 3, V = 7;
  auto logits = randn(N * V, 27, 2.0f);
  std::vector<int32_t> targets = {0, 6, 3};
  std::vector<float> losses(N);
  crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
  for (int i = 0; i < N; ++i) {
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(static_cast<double>(logits[i * V + j]));
    EXPECT_NEAR(losses[i], std::log(sum) - logits[i * V + targets[i]], 1e-5);
  }
  const float dloss = 0.25f;
  auto loss = [&] {
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (float l : losses) s += dloss * l;
    return s;
  };
  auto dlogits = logits;
  std::vector<float> losses2(N);
  crossentropy_forward_backward(losses2.data(), dlogits.data(), targets.data(), dloss, N, V);
  EXPECT_EQ(losses2, losses);
  expect_gradient(logits, dlogits, loss, "dlogits");
}

TEST(CrossEntropy, StableForHugeLogits) {
  std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  std::vector<int32_t> target = {1};
  float loss = 0;
  crossentropy_forward_backward(&loss, logits.data(), target.data(), 1.0f, 1, 3);
  EXPECT_NEAR(loss, 1.3132617f, 1e-5);                         // log(1 + e) for logits (1, 0)
  EXPECT_NEAR(logits[0] + logits[1] + logits[2], 0.0f, 1e-6);  // softmax - onehot sums to 0
  EXPECT_TRUE(std::isfinite(logits[2]));
}

TEST(AdamW, OneStepMatchesHandComputation) {
  // Step 1 from zero moments: m = (1-b1) g, v = (1-b2) g^2, m_hat = g, v_hat = g^2, so the update
  // is lr * (g / (|g| + eps) + wd * p). Step 2 is written out in full below.
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, -0.25f}, m = {0, 0}, v = {0, 0};
  AdamWHyper h;
  h.lr = 0.1f;
  h.beta1 = 0.9f;
  h.beta2 = 0.99f;
  h.eps = 1e-8f;
  h.weight_decay = 0.5f;
  h.grad_scale = 2.0f;  // the step sees g * 2 = {1.0, -0.5}
  h.t = 1;
  adamw_update(p.data(), g.data(), m.data(), v.data(), 2, h);
  EXPECT_NEAR(m[0], 0.1, 1e-7);
  EXPECT_NEAR(v[0], 0.01, 1e-7);
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-6);     // 0.85
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.5 * -2.0), 1e-6);  // -1.8
  // Step 2 with the same gradient: m = 0.9*0.1 + 0.1*1 = 0.19, v = 0.99*0.01 + 0.01*1 = 0.0199,
  // m_hat = 0.19/0.19 = 1, v_hat = 0.0199/0.0199 = 1.
  h.t = 2;
  adamw_update(p.data(), g.data(), m.data(), v.data(), 2, h);
  EXPECT_NEAR(m[0], 0.19, 1e-6);
  EXPECT_NEAR(v[0], 0.0199, 1e-6);
  EXPECT_NEAR(p[0], 0.85 - 0.1 * (1.0 + 0.5 * 0.85), 1e-5);
}

TEST(GlobalNorm, SumOfSquaresMatchesDoubleReferenceForAnyThreadCount) {
  auto x = randn(100003, 28);
  double ref = 0;
  for (float f : x) ref += static_cast<double>(f) * f;
  set_num_threads(1);
  const double one = sum_of_squares(x.data(), x.size());
  set_num_threads(4);
  const double four = sum_of_squares(x.data(), x.size());
  set_num_threads(0);
  EXPECT_NEAR(one, ref, 1e-9 * ref);
  EXPECT_EQ(one, four);
  EXPECT_EQ(sum_of_squares(x.data(), 0), 0.0);
}

// A fake cgroup filesystem under a temporary root: the files a kernel would show.
class CgroupTree {
 public:
  CgroupTree()
      : root_(std::filesystem::temp_directory_path() /
              ("longhaul-cgroup-" +
               std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(root_);
  }
  ~CgroupTree() { std::filesystem::remove_all(root_); }
  void write(const std::string& relative, const std::string& text) {
    const auto path = root_ / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

TEST(CgroupCpuLimit, ReadsCgroupV2CpuMaxRoundedUpToWholeCpus) {
  CgroupTree t;
  t.write("kubepods/pod1/ctr/cpu.max", "250000 100000");  // limits.cpu: 2500m
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", t.root()), 3);
  t.write("kubepods/pod1/ctr/cpu.max", "25000 100000");  // 250m still gets one thread
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", t.root()), 1);
  t.write("kubepods/pod1/ctr/cpu.max", "max 100000");
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", t.root()), 0);
}

TEST(CgroupCpuLimit, AParentsLimitBindsItsChildren) {
  CgroupTree t;
  t.write("kubepods/pod1/cpu.max", "200000 100000");
  t.write("kubepods/pod1/ctr/cpu.max", "max 100000");
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr", t.root()), 2);
  t.write("kubepods/pod1/ctr/cpu.max", "100000 100000");
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/ctr", t.root()), 1);
}

TEST(CgroupCpuLimit, ReadsCgroupV1QuotaInAHybridHierarchy) {
  CgroupTree t;
  const std::string membership =
      "12:pids:/kubepods/pod1/ctr\n4:cpu,cpuacct:/kubepods/pod1/ctr\n0::/kubepods/pod1/ctr\n";
  t.write("cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_quota_us", "150000");
  t.write("cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroup_cpu_limit(membership, t.root()), 2);
  t.write("cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_quota_us", "-1");
  EXPECT_EQ(cgroup_cpu_limit(membership, t.root()), 0);
}

TEST(CgroupCpuLimit, InsideAContainerTheMountShowsOnlyItsOwnCgroup) {
  // runc bind-mounts the container's own cgroup at the mount point while /proc/self/cgroup
  // still lists the host's path: the walk up finds the limit at the mount's root.
  CgroupTree t;
  t.write("cpu/cpu.cfs_quota_us", "50000");
  t.write("cpu/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroup_cpu_limit("3:cpu:/kubepods/burstable/pod1/ctr\n", t.root()), 1);
}

TEST(CgroupCpuLimit, NoLimitWhenNothingCanBeRead) {
  CgroupTree t;
  EXPECT_EQ(cgroup_cpu_limit("0::/\n", t.root()), 0);
  EXPECT_EQ(cgroup_cpu_limit("", t.root()), 0);
  EXPECT_EQ(cgroup_cpu_limit("garbage without colons", t.root()), 0);
  t.write("cpu.max", "nonsense");
  EXPECT_EQ(cgroup_cpu_limit("0::/", t.root()), 0);
}

}  // namespace
}  // namespace longhaul::kernels::cpu
