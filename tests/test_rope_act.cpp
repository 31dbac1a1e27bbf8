// RoPE frequencies with the files' scalings (kernels/rope.h) against ggml's
// formula computed in double, and bit for bit equal to the plain RopeTable
// without them; GeGLU and soft-capping (exp_poly.h definitions) on every ISA
// path bit for bit, and against double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "kernels/cpu.h"
#include "kernels/exp_poly.h"
#include "kernels/ops.h"
#include "kernels/rope.h"

using namespace kvs;

namespace {

// ggml's rope_yarn / ggml_rope_cache_init, in double.
void rope_reference(const RopeConfig& c, int n_rot, const float* ff, int pos, std::vector<double>& cs,
                    std::vector<double>& sn) {
  const int half = n_rot / 2;
  auto corr = [&](double rot) {
    return n_rot * std::log(c.n_ctx_orig / (rot * 2 * std::numbers::pi)) / (2 * std::log(double(c.theta)));
  };
  const double lo = std::max(0.0, std::floor(corr(c.beta_fast))), hi = std::min(n_rot - 1.0, std::ceil(corr(c.beta_slow)));
  cs.assign(size_t(half), 0);
  sn.assign(size_t(half), 0);
  for (int i = 0; i < half; ++i) {
    const double extrap = pos * std::pow(double(c.theta), -2.0 * i / n_rot) / (ff ? ff[i] : 1.0);
    double a = c.freq_scale * extrap, m = c.attn_factor;
    if (c.ext_factor != 0) {
      const double mix = (1 - std::min(1.0, std::max(0.0, (i - lo) / std::max(0.001, hi - lo)))) * c.ext_factor;
      a = a * (1 - mix) + extrap * mix;
      m *= 1 + 0.1 * std::log(1.0 / c.freq_scale);
    }
    cs[size_t(i)] = std::cos(a) * m;
    sn[size_t(i)] = std::sin(a) * m;
  }
}

TEST(RopeFreqs, PlainIsRopeTableBitForBit) {
  for (int n_rot : {4, 8, 64, 128})
    for (float theta : {10000.f, 500000.f, 1e6f}) {
      const RopeFreqs f(RopeConfig{theta}, n_rot, nullptr);
      std::vector<float> c1(size_t(n_rot / 2)), s1(c1.size()), c2(c1.size()), s2(c1.size());
      for (int pos : {0, 1, 17, 4095, 131071}) {
        f.compute(pos, c1.data(), s1.data());
        RopeTable().compute(pos, n_rot, theta, c2.data(), s2.data());
        ASSERT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * 4)) << n_rot << " " << theta << " " << pos;
        ASSERT_EQ(0, std::memcmp(s1.data(), s2.data(), s1.size() * 4)) << n_rot << " " << theta << " " << pos;
      }
    }
}

TEST(RopeFreqs, ScalingsMatchGgmlFormula) {
  const int n_rot = 64;
  std::vector<float> ff(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) ff[size_t(i)] = 1.f + 7.f * float(i) / (n_rot / 2 - 1);
  RopeConfig linear{10000.f, 0.25f};
  RopeConfig yarn{1e6f, 0.125f, 1.f, 1.f, 32.f, 1.f, 64};
  RopeConfig attn{10000.f, 1.f, 0.f, 1.19f};
  for (const RopeConfig& c : {linear, yarn, attn})
    for (const float* factors : {static_cast<const float*>(nullptr), static_cast<const float*>(ff.data())}) {
      const RopeFreqs f(c, n_rot, factors);
      std::vector<float> cs(n_rot / 2), sn(cs.size());
      std::vector<double> rc, rs;
      for (int pos : {0, 3, 100, 255}) {
        f.compute(pos, cs.data(), sn.data());
        rope_reference(c, n_rot, factors, pos, rc, rs);
        for (int i = 0; i < n_rot / 2; ++i) {
          ASSERT_NEAR(cs[size_t(i)], rc[size_t(i)], 2e-5) << "pos " << pos << " pair " << i;
          ASSERT_NEAR(sn[size_t(i)], rs[size_t(i)], 2e-5) << "pos " << pos << " pair " << i;
        }
      }
    }
  // YaRN's ramp matters: low pairs extrapolate (unscaled), high pairs interpolate.
  const RopeFreqs f(yarn, n_rot, nullptr), plain(RopeConfig{1e6f}, n_rot, nullptr);
  std::vector<float> a(n_rot / 2), b(a.size()), x(a.size()), y(a.size());
  f.compute(50, a.data(), b.data());
  plain.compute(50, x.data(), y.data());
  const float m = 1.f + 0.1f * std::log(8.f);
  EXPECT_NEAR(a[0], x[0] * m, 1e-5);
  EXPECT_NEAR(b[10], std::sin(50.f * 0.125f * std::pow(1e6f, -20.f / 64)) * m, 1e-5);
}

// Runs `op` under every ISA this CPU has; each result must be `want`'s bits.
template <class Op>
void expect_same_bits_on_every_isa(const std::vector<float>& want, Op op, const char* what) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    set_isa_override(isa);
    if (active_isa() != isa) {
      clear_isa_override();
      continue;
    }
    const std::vector<float> got = op();
    clear_isa_override();
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << what << " " << isa_name(isa) << " n=" << want.size();
  }
}

TEST(Ops, GegluAndSoftcapSimdMatchScalarDefinitions) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> small(-6.f, 6.f), wide(-200.f, 200.f);
  for (int n : {1, 7, 16, 37, 5633}) {
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) g[size_t(i)] = i % 5 == 0 ? wide(rng) : small(rng), u[size_t(i)] = small(rng);
    std::vector<float> gw(static_cast<size_t>(n)), sw(static_cast<size_t>(n));
    const float cap = 30.f;
    const poly::Softcap sc(cap);
    for (int i = 0; i < n; ++i) {
      const double v = g[size_t(i)];
      gw[size_t(i)] = poly::geglu_scalar(g[size_t(i)], u[size_t(i)]);
      sw[size_t(i)] = poly::softcap_scalar(g[size_t(i)], sc);
      // 0.5 v (1 + tanh y) = v / (1 + exp(-2y)): the same in exact math, but
      // without tanh's rounding to -1 far below zero.
      const double gelu = v / (1 + std::exp(-2 * std::sqrt(2 / std::numbers::pi) * v * (1 + 0.044715 * v * v)));
      ASSERT_NEAR(gw[size_t(i)], gelu * u[size_t(i)], 2e-6 * std::fabs(gelu * u[size_t(i)]) + 1e-9) << "v=" << v;
      ASSERT_NEAR(sw[size_t(i)], cap * std::tanh(v / cap), 4e-7 * cap) << "v=" << v;
    }
    expect_same_bits_on_every_isa(gw, [&] {
      std::vector<float> x = g;
      geglu_inplace(x.data(), u.data(), n);
      return x;
    }, "geglu");
    expect_same_bits_on_every_isa(sw, [&] {
      std::vector<float> x = g;
      softcap_inplace(x.data(), n, cap);
      return x;
    }, "softcap");
  }
}

// rmsnorm's sum of squares: one order on every ISA (ops.cpp), so the same
// bits; values over many magnitudes, where another order would round
// differently, and lengths around the 32 lanes.
TEST(Ops, SumOfSquaresSameBitsOnEveryIsa) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> v(-1.f, 1.f);
  std::uniform_int_distribution<int> e(-20, 20);
  for (int n : {1, 7, 31, 32, 33, 64, 100, 2048, 5633}) {
    std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) x[size_t(i)] = std::ldexp(v(rng), e(rng)), w[size_t(i)] = v(rng);
    const double got = sum_squares_scalar(x.data(), n);
    long double exact = 0;
    for (float f : x) exact += static_cast<long double>(f) * f;
    ASSERT_NEAR(got, double(exact), 1e-14 * double(exact)) << "n=" << n;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      set_isa_override(isa);
      if (active_isa() == isa) {
        const double s = sum_squares(x.data(), n);
        ASSERT_EQ(0, std::memcmp(&s, &got, sizeof s)) << isa_name(isa) << " n=" << n;
      }
      clear_isa_override();
    }
    std::vector<float> want(x.size());
    const float scale = float(1.0 / std::sqrt(got / n + 1e-5f));
    for (int i = 0; i < n; ++i) want[size_t(i)] = x[size_t(i)] * scale * w[size_t(i)];
    expect_same_bits_on_every_isa(want, [&] {
      std::vector<float> o(x.size());
      rmsnorm(x.data(), w.data(), o.data(), n, 1e-5f);
      return o;
    }, "rmsnorm");
  }
}

}  // namespace
