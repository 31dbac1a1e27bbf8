// The SIMD tile kernel of flash_attention.h, written once over a vector
// traits type V and compiled per ISA: include it only inside a
// KVS_TARGET_BEGIN region, after <immintrin.h> and flash_attention.h, with
// V defined (flash_avx512.cpp, flash_avx2.cpp). It includes nothing itself,
// so no std code is compiled for the wider ISA.
//
// Layout: lanes are rows (16 or 8 rows of the query block per vector), so
// the online softmax is vertical (no horizontal reduction per score):
//   scores   s_t = sum_d qT[d] * K_t[d]   qT [hd, L] per row group, K_t[d]
//            broadcast from the tile (one fma chain per key, over d)
//   values   oT[d] += V_t[d] * p_t        oT [hd, L], V_t[d] broadcast
// V provides: reg, mask, L (lanes), KB (keys per score pass), load, store,
// bcast, zero, set1, add, sub, mul, div, max, fma (a * b + c), fma_m (lanes
// outside the mask keep c), select (mask ? a : b), exp2n, exp (exp_poly.h's
// exp, for soft-capped scores), all_equal,
// mask_of (lane bits -> mask), gather (base[off[lane]]), scatter (the
// lanes whose bit is set to base[off[lane]]).

namespace flash_rows {

using kvs::attn::FlashQuery;
using kvs::attn::kTile;

struct Layout {
  int G;           // row groups of V::L lanes
  float* qt;       // [G, hd, L] scaled queries, zero on pad lanes
  float* ot;       // [G, hd, L] unnormalized outputs
  float* m;        // [G, L] running max (log2 units)
  float* l;        // [G, L] running sum
};

template <class V>
inline Layout layout(const FlashQuery& fq, float* st) {
  const int G = (fq.rows() + V::L - 1) / V::L;
  const size_t n = size_t(G) * fq.hd * V::L;
  return {G, st, st + n, st + 2 * n, st + 2 * n + size_t(G) * V::L};
}

// Row of lane `lane` in group g (pad lanes repeat the last row, so they
// stay finite and are never written out).
inline int row_of(const FlashQuery& fq, int g, int lane, int L) {
  const int row = g * L + lane;
  return row < fq.rows() ? row : fq.rows() - 1;
}

// Float offsets from base of row `row`'s element 0, per lane of group g.
template <class V>
inline void lane_offsets(const FlashQuery& fq, int g, size_t ld, int* off) {
  for (int lane = 0; lane < V::L; ++lane) {
    const int row = row_of(fq, g, lane, V::L);
    off[lane] = int(size_t(row / fq.r) * ld + size_t(row % fq.r) * fq.hd);
  }
}

// Lanes of group g that hold a row (the others are padding).
template <class V>
inline unsigned live_lanes(const FlashQuery& fq, int g) {
  const int n = fq.rows() - g * V::L;
  return n >= V::L ? (1u << V::L) - 1 : (1u << n) - 1;
}

// Kernels whose V has transpose() (an L x L block: rows <-> columns) move
// rows to lanes and back by blocks of L elements, not element by element
// with gathers and scatters (same values either way).
template <class V>
constexpr bool kBlocks = requires(typename V::reg* r) { V::transpose(r); };
template <class V>
inline bool by_blocks(const FlashQuery& fq) {
  return kBlocks<V> && fq.hd % V::L == 0;
}

// c[i] = element d0 + i of each lane's row (row offsets off from base);
// only where by_blocks().
template <class V>
inline void rows_to_lanes(const float* base, const int* off, int d0, typename V::reg* c) {
  for (int lane = 0; lane < V::L; ++lane) c[lane] = V::load(base + off[lane] + d0);
  if constexpr (kBlocks<V>) V::transpose(c);
}

// The rows' outputs and sums zero, their maxima -inf.
template <class V>
inline void clear_state(const Layout& lo, int hd) {
  const size_t n = size_t(lo.G) * hd * V::L;
  for (size_t e = 0; e < n; e += V::L) V::store(lo.ot + e, V::zero());
  for (int e = 0; e < lo.G * V::L; e += V::L) {
    V::store(lo.m + e, V::set1(-__builtin_inff()));
    V::store(lo.l + e, V::zero());
  }
}

template <class V>
void begin(const FlashQuery& fq, float* st) {
  using R = typename V::reg;
  const Layout lo = layout<V>(fq, st);
  const R c = V::set1(fq.query_factor());
  for (int g = 0; g < lo.G; ++g) {
    int off[V::L];
    lane_offsets<V>(fq, g, fq.ldq, off);
    const typename V::mask live = V::mask_of(live_lanes<V>(fq, g));
    float* qt = lo.qt + size_t(g) * fq.hd * V::L;  // [hd, L]
    int d = 0;
    if (by_blocks<V>(fq))
      for (; d < fq.hd; d += V::L) {
        R x[V::L];
        rows_to_lanes<V>(fq.q, off, d, x);
        for (int i = 0; i < V::L; ++i) V::store(qt + size_t(d + i) * V::L, V::select(live, V::mul(x[i], c), V::zero()));
      }
    for (; d < fq.hd; ++d)
      V::store(qt + size_t(d) * V::L, V::select(live, V::mul(V::gather(fq.q + d, off), c), V::zero()));
  }
  clear_state<V>(lo, fq.hd);
}

// s[t] for the 16 keys of the tile, V::KB keys per pass (their chains run
// side by side).
template <class V, int HD>
inline void scores(const float* qt, const float* k, int hd_rt, typename V::reg* s) {
  const int hd = HD ? HD : hd_rt;
  for (int kb = 0; kb < kTile; kb += V::KB) {
    typename V::reg acc[V::KB];
#pragma GCC unroll 16
    for (int t = 0; t < V::KB; ++t) acc[t] = V::zero();
    const float* kt = k + size_t(kb) * hd;
#pragma GCC unroll 4
    for (int d = 0; d < hd; ++d) {
      const typename V::reg qd = V::load(qt + size_t(d) * V::L);
#pragma GCC unroll 16
      for (int t = 0; t < V::KB; ++t) acc[t] = V::fma(V::bcast(kt + size_t(t) * hd + d), qd, acc[t]);
    }
#pragma GCC unroll 16
    for (int t = 0; t < V::KB; ++t) s[kb + t] = acc[t];
  }
}

// Soft-capped scores (flash_attention.h): C1 - C2 / (1 + exp(acc)).
template <class V>
inline void cap_scores(const FlashQuery& fq, typename V::reg* s) {
  using R = typename V::reg;
  const R c1 = V::set1(fq.cap_c1()), c2 = V::set1(fq.cap_c2()), one = V::set1(1.0f);
#pragma GCC unroll 16
  for (int t = 0; t < kTile; ++t) s[t] = V::sub(c1, V::div(c2, V::add(one, V::exp(s[t]))));
}

// 16 values to one by the fixed tree of flash_attention.h (Max = false:
// sums) or the maximum (exact in any order). No lambdas in this file: GCC
// compiles a lambda's body without the region's target.
template <class V, bool Max>
inline typename V::reg op2(typename V::reg a, typename V::reg b) {
  return Max ? V::max(a, b) : V::add(a, b);
}
template <class V, bool Max>
inline typename V::reg tree16(const typename V::reg* x) {
  using R = typename V::reg;
  R a[8], b[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) a[i] = op2<V, Max>(x[i], x[i + 8]);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) b[i] = op2<V, Max>(a[i], a[i + 4]);
  return op2<V, Max>(op2<V, Max>(b[0], b[2]), op2<V, Max>(b[1], b[3]));
}

// Online softmax step of one row group: scores s -> probabilities p, the
// rescale factor alpha, m and l updated. km: per key, the lanes that see it.
// Lazy (the bf16 kernel, V::gt needed): a row's reference m moves only
// when a score passes it by more than kLazyMaxLog2, so p <= 2^kLazyMaxLog2
// and alpha is 1 (no rescale of the outputs) on almost every tile after
// the first; the fp32 kernels keep the exact running maximum.
template <class V, bool Masked, bool Lazy = false>
inline typename V::reg softmax(typename V::reg* s, const typename V::mask* km, float* m, float* l,
                               typename V::reg* p) {
  using R = typename V::reg;
  if constexpr (Masked)
    for (int t = 0; t < kTile; ++t) s[t] = V::select(km[t], s[t], V::set1(-__builtin_inff()));
  const R mt = tree16<V, true>(s);
  const R m_old = V::load(m);
  R mn;
  if constexpr (Lazy) mn = V::select(V::gt(mt, V::add(m_old, V::set1(kvs::attn::kLazyMaxLog2))), mt, m_old);
  else mn = V::max(m_old, mt);
  const R alpha = V::exp2n(V::sub(m_old, mn));
#pragma GCC unroll 16
  for (int t = 0; t < kTile; ++t) {
    p[t] = V::exp2n(V::sub(s[t], mn));
    if constexpr (Masked) p[t] = V::select(km[t], p[t], V::zero());
  }
  const R sum = tree16<V, false>(p);
  V::store(l, V::fma(V::load(l), alpha, sum));
  V::store(m, mn);
  return alpha;
}

// acc + V_t[d] * p_t (masked: lanes that do not see key t keep acc).
template <class V, bool Masked>
inline typename V::reg pv_step(typename V::reg acc, const float* vtd, typename V::reg pt, const typename V::mask* km,
                               int t) {
  if constexpr (Masked) return V::fma_m(V::bcast(vtd), pt, acc, km[t]);
  else return V::fma(V::bcast(vtd), pt, acc);
}

// oT[d] = oT[d] * alpha, then += V_t[d] * p_t for t in order; eight d at a
// time so eight independent chains hide the fma latency.
template <class V, int HD, bool Masked>
inline void accumulate(float* ot, const float* v, int hd_rt, const typename V::reg* p, typename V::reg alpha,
                       const typename V::mask* km) {
  using R = typename V::reg;
  const int hd = HD ? HD : hd_rt;
  const bool rescale = !V::all_equal(alpha, 1.0f);  // times 1 changes no bit
  int d = 0;
  for (; d + 8 <= hd; d += 8) {
    R acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      acc[j] = V::load(ot + size_t(d + j) * V::L);
      if (rescale) acc[j] = V::mul(acc[j], alpha);
    }
#pragma GCC unroll 16
    for (int t = 0; t < kTile; ++t)
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = pv_step<V, Masked>(acc[j], v + size_t(t) * hd + d + j, p[t], km, t);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) V::store(ot + size_t(d + j) * V::L, acc[j]);
  }
  for (; d < hd; ++d) {
    R acc = V::load(ot + size_t(d) * V::L);
    if (rescale) acc = V::mul(acc, alpha);
    for (int t = 0; t < kTile; ++t) acc = pv_step<V, Masked>(acc, v + size_t(t) * hd + d, p[t], km, t);
    V::store(ot + size_t(d) * V::L, acc);
  }
}

// Per key, the lanes of group g that see it (vis: per token, bit t = key t),
// as masks km and as lane bits.
template <class V>
inline unsigned lane_masks(const FlashQuery& fq, int g, const uint16_t* vis, typename V::mask* km, unsigned* lanes) {
  unsigned any = 0;
  for (int t = 0; t < kTile; ++t) lanes[t] = 0;
  for (int lane = 0; lane < V::L; ++lane) {
    const unsigned bits = vis[row_of(fq, g, lane, V::L) / fq.r];
    any |= bits;
    for (int t = 0; t < kTile; ++t) lanes[t] |= (bits >> t & 1u) << lane;
  }
  for (int t = 0; t < kTile; ++t) km[t] = V::mask_of(lanes[t]);
  return any;
}

// Few rows (at most half a vector: a decode step's token, its group's
// heads): the outputs are kept row-major, o [rows, hd] with lanes along d,
// so the value pass costs rows * hd / L vector fmas per key, not hd with
// most lanes idle. Each element sees the same operations in the same order
// as in accumulate(), so the bits are the same: o * alpha, then
// fma(p_t, V_t[d], o) for the keys the row sees, in order (masked, not
// skipped by p = 0, which could turn a -0 into +0).
template <class V>
inline bool few_rows(const FlashQuery& fq) {
  return fq.rows() <= V::L / 2 && fq.hd % V::L == 0;
}

template <class V, int HD, bool Masked>
inline void accumulate_few(const FlashQuery& fq, float* o, const float* v, const typename V::reg* p,
                           typename V::reg alpha, const unsigned* lanes) {
  using R = typename V::reg;
  constexpr int W = 4;  // d vectors per pass: independent chains
  const int hd = HD ? HD : fq.hd, rows = fq.rows();
  alignas(64) float pm[kTile * V::L], am[V::L];  // p and alpha, lane = row
#pragma GCC unroll 16
  for (int t = 0; t < kTile; ++t) V::store(pm + t * V::L, p[t]);
  V::store(am, alpha);
  const bool rescale = !V::all_equal(alpha, 1.0f);  // times 1 changes no bit
  const typename V::mask all = V::mask_of((1u << V::L) - 1u), none = V::mask_of(0u);
  for (int j = 0; j < rows; ++j) {
    float* oj = o + size_t(j) * hd;  // [hd]
    for (int d = 0; d < hd; d += W * V::L) {
      const int nv = (hd - d) / V::L < W ? (hd - d) / V::L : W;
      R acc[W];
      for (int i = 0; i < nv; ++i) {
        acc[i] = V::load(oj + d + i * V::L);
        if (rescale) acc[i] = V::mul(acc[i], V::bcast(am + j));
      }
      for (int t = 0; t < kTile; ++t) {
        const R pt = V::bcast(pm + t * V::L + j);
        const float* vt = v + size_t(t) * hd + d;
        if constexpr (Masked) {
          const typename V::mask mk = (lanes[t] >> j & 1u) ? all : none;
          for (int i = 0; i < nv; ++i) acc[i] = V::fma_m(pt, V::load(vt + i * V::L), acc[i], mk);
        } else {
          for (int i = 0; i < nv; ++i) acc[i] = V::fma(pt, V::load(vt + i * V::L), acc[i]);
        }
      }
      for (int i = 0; i < nv; ++i) V::store(oj + d + i * V::L, acc[i]);
    }
  }
}

template <class V, int HD>
void tile(const FlashQuery& fq, float* st, const float* k, const float* v, const uint16_t* vis) {
  using R = typename V::reg;
  const Layout lo = layout<V>(fq, st);
  const size_t gq = size_t(fq.hd) * V::L;
  const bool few = few_rows<V>(fq);  // (then one group: o is [rows, hd])
  for (int g = 0; g < lo.G; ++g) {
    float* m = lo.m + size_t(g) * V::L;
    float* l = lo.l + size_t(g) * V::L;
    R s[kTile], p[kTile];
    if (!vis) {
      scores<V, HD>(lo.qt + g * gq, k, fq.hd, s);
      if (fq.softcap > 0.0f) cap_scores<V>(fq, s);
      const R alpha = softmax<V, false>(s, nullptr, m, l, p);
      if (few) accumulate_few<V, HD, false>(fq, lo.ot, v, p, alpha, nullptr);
      else accumulate<V, HD, false>(lo.ot + g * gq, v, fq.hd, p, alpha, nullptr);
      continue;
    }
    typename V::mask km[kTile];
    unsigned lanes[kTile];
    if (lane_masks<V>(fq, g, vis, km, lanes) == 0) continue;  // no lane sees the tile: left as it is
    scores<V, HD>(lo.qt + g * gq, k, fq.hd, s);
    if (fq.softcap > 0.0f) cap_scores<V>(fq, s);
    const R alpha = softmax<V, true>(s, km, m, l, p);
    if (few) accumulate_few<V, HD, true>(fq, lo.ot, v, p, alpha, lanes);
    else accumulate<V, HD, true>(lo.ot + g * gq, v, fq.hd, p, alpha, km);
  }
}

template <class V>
void tile_any(const FlashQuery& fq, float* st, const float* k, const float* v, const uint16_t* vis) {
  switch (fq.hd) {
    case 64: return tile<V, 64>(fq, st, k, v, vis);
    case 128: return tile<V, 128>(fq, st, k, v, vis);
    default: return tile<V, 0>(fq, st, k, v, vis);
  }
}

// out = (oT * alpha) * (1 / l), lanes back to rows; alpha and l take the
// rows' sinks in (flash_attention.h), alpha = 1 without them. FEW: o is
// row-major as tile() keeps it for few_rows() (the bf16 kernel never does).
template <class V, bool FEW = true>
void finish(const FlashQuery& fq, const float* st, float* out, size_t ldo) {
  using R = typename V::reg;
  const Layout lo = layout<V>(fq, const_cast<float*>(st));
  for (int g = 0; g < lo.G; ++g) {
    int off[V::L];
    lane_offsets<V>(fq, g, ldo, off);
    const unsigned live = live_lanes<V>(fq, g);
    R l = V::load(lo.l + size_t(g) * V::L), alpha = V::set1(1.0f);
    if (fq.sinks) {
      float z[V::L];  // [L] each lane's head's sink
      for (int lane = 0; lane < V::L; ++lane) z[lane] = fq.sinks[row_of(fq, g, lane, V::L) % fq.r];
      const R m = V::load(lo.m + size_t(g) * V::L), zs = V::mul(V::load(z), V::set1(kvs::attn::kLog2e));
      const R mn = V::max(m, zs);
      alpha = V::exp2n(V::sub(m, mn));
      l = V::fma(l, alpha, V::exp2n(V::sub(zs, mn)));
    }
    const R inv = V::div(V::set1(1.0f), l);
    if (FEW && few_rows<V>(fq)) {  // o [rows, hd]: per row, (o * alpha) * inv along d
      alignas(64) float am[V::L], im[V::L];
      V::store(am, alpha);
      V::store(im, inv);
      for (int j = 0; j < fq.rows(); ++j)
        for (int d = 0; d < fq.hd; d += V::L)
          V::store(out + off[j] + d,
                   V::mul(V::mul(V::load(lo.ot + size_t(j) * fq.hd + d), V::bcast(am + j)), V::bcast(im + j)));
      continue;
    }
    const float* ot = lo.ot + size_t(g) * fq.hd * V::L;  // [hd, L]
    if (by_blocks<V>(fq)) {
      for (int d = 0; d < fq.hd; d += V::L) {
        R x[V::L];
        for (int i = 0; i < V::L; ++i) x[i] = V::mul(V::mul(V::load(ot + size_t(d + i) * V::L), alpha), inv);
        if constexpr (kBlocks<V>) V::transpose(x);
        for (int lane = 0; lane < V::L; ++lane)
          if (live >> lane & 1u) V::store(out + off[lane] + d, x[lane]);
      }
      continue;
    }
    for (int d = 0; d < fq.hd; ++d)
      V::scatter(out + d, off, live, V::mul(V::mul(V::load(ot + size_t(d) * V::L), alpha), inv));
  }
}

}  // namespace flash_rows
