// AVX-512 VNNI kernels for Panel16-packed Q8_0 / Q4_0 / MXFP4 / Q4_K / Q5_K / Q6_K weights
// (kernels/weight_pack.h). Same arithmetic as matmul_avx512.cpp, bit for
// bit (block_step and the same per-lane float chain); only where the weight
// vectors come from changes: one aligned 64-B load per vector from the
// packed panel instead of 16 row loads, a transpose and a scale gather.
//
// n = 1 (decode) streams several panels at a time, front to back, with
// software prefetch ahead: how many and how far is the machine's decode
// variant (kernels/decode_variant.h). 1 < n < 64 (Q8_0 / Q4_0 / MXFP4) runs register tiles directly
// on the packed panels; larger n and K-quants at any n > 1 copy K slices into
// the scratch layout first (matmul_avx512.cpp, gemm_via_scratch).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/decode_variant.h"
#include "kernels/matmul_avx512_unpack.h"
#include "kernels/matmul_internal.h"
#include "kernels/target_region.h"

namespace kvs::mm {

KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2,popcnt")

namespace {

using namespace avx512_detail;
constexpr int KB = 32;  // blocks per K slice (two Q8_0 panels: 34 KiB, stays in L1)
constexpr int R = 8;    // activation rows per one-panel register tile


// Whole storage units of ub bytes ahead that a prefetch distance of pf
// bytes means: the nearest count, at least one (0 when pf is 0). Whole units
// at a time, fully unrolled, kept DRAM busier than line-by-line prefetch of
// the same distance (bench_matmul Q4_0 n = 1, docs/PERFORMANCE.md).
inline int64_t units_ahead(int64_t pf, int64_t ub) { return pf <= 0 ? 0 : std::max<int64_t>(1, (pf + ub / 2) / ub); }

// Prefetch unit u + ahead of each of MP panels (nothing past the end).
template <int MP, int64_t UB>
inline void prefetch_unit(const uint8_t* pan0, int64_t pbytes, int64_t u, int64_t ahead, int64_t units) {
  if (ahead == 0 || u + ahead >= units) return;
  for (int m = 0; m < MP; ++m)
    for (int64_t o = 0; o < UB; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pan0 + m * pbytes + (u + ahead) * UB + o), _MM_HINT_T0);
}

// MP panels at once: MP independent memory streams and float chains. One
// sequential stream per core left DRAM bandwidth unused; how many streams
// and how far ahead to prefetch is the machine's decode variant.
template <int MP, class P>
inline void matvec_panels(const uint8_t* pan0, int64_t pbytes, int64_t nb, const XBlock* xq, float* y,
                          int64_t avail, int64_t pf) {
  const int64_t ahead = units_ahead(pf, P::UB);
  __m512 acc[MP];
  for (int m = 0; m < MP; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if ((b & (P::kPer - 1)) == 0) prefetch_unit<MP, P::UB>(pan0, pbytes, b >> P::kShift, ahead, (nb + P::kPer - 1) >> P::kShift);
    for (int m = 0; m < MP; ++m) {
      const uint8_t* pan = pan0 + m * pbytes;
      const uint8_t* l = P::lev(pan, b);
      __m512i W[8];
      for (int k = 0; k < 8; ++k) W[k] = P::vec(l, k);
      const __m512 ws = P::scale(pan, b);
      acc[m] = block_step<false, false>(W, ws, ws, ws, xq[b], acc[m]);
    }
  }
  for (int m = 0; m < MP; ++m) _mm512_mask_storeu_ps(y + m * L, lanes(avail - m * L), acc[m]);
}

template <class P>
void matvec_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, float* y) {
  const int64_t nb = w.cols / kQBlock, pbytes = P::panel_bytes(nb);
  const DecodeVariant v = decode_variant(w.type);
  int64_t p0 = r0;
  if (v.panels >= 4)
    for (; p0 + 3 * L < r1; p0 += 4 * L)
      matvec_panels<4, P>(w.packed + (p0 / L) * pbytes, pbytes, nb, xq, y + p0, r1 - p0, v.prefetch);
  if (v.panels >= 2)
    for (; p0 + L < r1; p0 += 2 * L)
      matvec_panels<2, P>(w.packed + (p0 / L) * pbytes, pbytes, nb, xq, y + p0, r1 - p0, v.prefetch);
  for (; p0 < r1; p0 += L)
    matvec_panels<1, P>(w.packed + (p0 / L) * pbytes, pbytes, nb, xq, y + p0, r1 - p0, v.prefetch);
}

// K-quants (U = PkK for Q4_K, PkQ5K for Q5_K, PkQ6K for Q6_K): MP panels at once, one
// super-block (8 blocks) at a time. Without software prefetch the streams
// left DRAM idle (perf: the stalls sat on the level loads).
template <class U, int MP>
inline void matvec_panels_k(const uint8_t* pan0, int64_t pbytes, int64_t nsb, const XBlock* xq, float* y,
                            int64_t avail, int64_t pf) {
  const int64_t ahead = units_ahead(pf, U::UB);
  __m512 acc[MP];
  KSum S[MP];  // K-quants: super-block sums (kblock)
  for (int m = 0; m < MP; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t u = 0; u < nsb; ++u) {
    const XBlock* xb = xq + 8 * u;
    prefetch_unit<MP, U::UB>(pan0, pbytes, u, ahead, nsb);
    for (int m = 0; m < MP; ++m)
      U::unit(pan0 + m * pbytes + u * U::UB, [&](int j, const __m512i* W, __m512 ws0, __m512 ws1, __m512 wm) {
        acc[m] = kblock<U::kSuper, U::kMin, U::kNib>(W, ws0, ws1, wm, xb[j], j, S[m], acc[m]);
      });
  }
  for (int m = 0; m < MP; ++m) _mm512_mask_storeu_ps(y + m * L, lanes(avail - m * L), acc[m]);
}

template <class U>
void matvec_packed_k(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, float* y) {
  const int64_t nsb = w.cols / 256, pbytes = nsb * U::UB;
  const DecodeVariant v = decode_variant(w.type);
  int64_t p0 = r0;
  if (v.panels >= 4)
    for (; p0 + 3 * L < r1; p0 += 4 * L)
      matvec_panels_k<U, 4>(w.packed + (p0 / L) * pbytes, pbytes, nsb, xq, y + p0, r1 - p0, v.prefetch);
  if (v.panels >= 2)
    for (; p0 + L < r1; p0 += 2 * L)
      matvec_panels_k<U, 2>(w.packed + (p0 / L) * pbytes, pbytes, nsb, xq, y + p0, r1 - p0, v.prefetch);
  for (; p0 < r1; p0 += L)
    matvec_panels_k<U, 1>(w.packed + (p0 / L) * pbytes, pbytes, nsb, xq, y + p0, r1 - p0, v.prefetch);
}

// RT activation rows x one panel over blocks [kb0, kb0 + kb). Accumulators
// live in y between K slices (exact round trip).
template <int RT, class P>
void tile1(const uint8_t* pan, int64_t kb0, int64_t kb, const XBlock* xq, int64_t nb, int64_t i0,
           float* y, int64_t ldy, int64_t p0, __mmask16 valid) {
  __m512 acc[RT];
  for (int i = 0; i < RT; ++i)
    acc[i] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, y + (i0 + i) * ldy + p0);
  for (int64_t b = kb0; b < kb0 + kb; ++b) {
    const uint8_t* l = P::lev(pan, b);
    __m512i W[8];
    for (int k = 0; k < 8; ++k) W[k] = P::vec(l, k);
    const __m512 ws = P::scale(pan, b);
    for (int i = 0; i < RT; ++i) acc[i] = block_step<false, false>(W, ws, ws, ws, xq[(i0 + i) * nb + b], acc[i]);
  }
  for (int i = 0; i < RT; ++i) _mm512_mask_storeu_ps(y + (i0 + i) * ldy + p0, valid, acc[i]);
}

// RT activation rows x two panels (32 weight rows): each broadcast
// activation dword feeds two vpdpbusd. One integer chain per (row, panel),
// then exactly block_step's float step, so results equal tile1's.
template <int RT, class P>
void tile2(const uint8_t* pa, const uint8_t* pb, int64_t kb0, int64_t kb, const XBlock* xq,
           int64_t nb, int64_t i0, float* y, int64_t ldy, int64_t p0, __mmask16 valid_b) {
  __m512 aa[RT], ab[RT];
  for (int i = 0; i < RT; ++i) {
    float* yr = y + (i0 + i) * ldy + p0;
    aa[i] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(yr);
    ab[i] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid_b, yr + L);
  }
  for (int64_t b = kb0; b < kb0 + kb; ++b) {
    const uint8_t* la = P::lev(pa, b);
    const uint8_t* lb = P::lev(pb, b);
    const XBlock* xr[RT];
    for (int i = 0; i < RT; ++i) xr[i] = xq + (i0 + i) * nb + b;
    __m512i ia[RT], ib[RT];
    for (int i = 0; i < RT; ++i) ia[i] = ib[i] = _mm512_set1_epi32(xr[i]->corr[0]);
    for (int k = 0; k < 8; ++k) {
      const __m512i va = P::vec(la, k), vb = P::vec(lb, k);
      for (int i = 0; i < RT; ++i) {
        const __m512i xv = bcast4(xr[i]->q + 4 * k);
        ia[i] = _mm512_dpbusd_epi32(ia[i], va, xv);
        ib[i] = _mm512_dpbusd_epi32(ib[i], vb, xv);
      }
    }
    const __m512 wsa = P::scale(pa, b), wsb = P::scale(pb, b);
    for (int i = 0; i < RT; ++i) {
      const __m512 xd = _mm512_set1_ps(xr[i]->d);
      aa[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[i]), _mm512_mul_ps(wsa, xd), aa[i]);
      ab[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[i]), _mm512_mul_ps(wsb, xd), ab[i]);
    }
  }
  for (int i = 0; i < RT; ++i) {
    float* yr = y + (i0 + i) * ldy + p0;
    _mm512_storeu_ps(yr, aa[i]);
    _mm512_mask_storeu_ps(yr + L, valid_b, ab[i]);
  }
}

template <class P>
void tiles1(const uint8_t* pan, int64_t kb0, int64_t kb, const XBlock* xq, int64_t nb, int64_t n,
            float* y, int64_t ldy, int64_t p0, __mmask16 valid) {
  int64_t i0 = 0;
  for (; i0 + R <= n; i0 += R) tile1<R, P>(pan, kb0, kb, xq, nb, i0, y, ldy, p0, valid);
  for (; i0 + 4 <= n; i0 += 4) tile1<4, P>(pan, kb0, kb, xq, nb, i0, y, ldy, p0, valid);
  for (; i0 < n; ++i0) tile1<1, P>(pan, kb0, kb, xq, nb, i0, y, ldy, p0, valid);
}

template <class P>
void tiles2(const uint8_t* pa, const uint8_t* pb, int64_t kb0, int64_t kb, const XBlock* xq,
            int64_t nb, int64_t n, float* y, int64_t ldy, int64_t p0, __mmask16 valid_b) {
  int64_t i0 = 0;
  for (; i0 + 6 <= n; i0 += 6) tile2<6, P>(pa, pb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
  switch (n - i0) {
    case 5: return tile2<5, P>(pa, pb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    case 4: return tile2<4, P>(pa, pb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    case 3: return tile2<3, P>(pa, pb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    case 2: return tile2<2, P>(pa, pb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    case 1: return tile2<1, P>(pa, pb, kb0, kb, xq, nb, i0, y, ldy, p0, valid_b);
    default: return;
  }
}

template <class P>
void gemm_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                 int64_t ldy) {
  const int64_t nb = w.cols / kQBlock, pbytes = P::panel_bytes(nb);
  for (int64_t p0 = r0; p0 < r1; p0 += 2 * L) {
    const uint8_t* pa = w.packed + (p0 / L) * pbytes;
    const bool two = p0 + L < r1;
    for (int64_t kb0 = 0; kb0 < nb; kb0 += KB) {
      const int64_t kb = nb - kb0 < KB ? nb - kb0 : KB;
      if (two) tiles2<P>(pa, pa + pbytes, kb0, kb, xq, nb, n, y, ldy, p0, lanes(r1 - p0 - L));
      else tiles1<P>(pa, kb0, kb, xq, nb, n, y, ldy, p0, lanes(r1 - p0));
    }
  }
}

template <class P>
void run_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n, float* y,
                int64_t ldy) {
  if (n == 1) matvec_packed<P>(w, r0, r1, xq, y);
  else gemm_packed<P>(w, r0, r1, xq, n, y, ldy);
}

}  // namespace

void quant_rows_avx512_packed(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq,
                              int64_t n, float* y, int64_t ldy) {
  // Tasks start on panel boundaries (the driver's row_align is 2 panels).
  // K-quants: n > 1 goes through scratch (matmul_avx512.cpp).
  switch (w.type) {  // packable() admits exactly these
    case GgmlType::Q4_K: return matvec_packed_k<PkK>(w, r0, r1, xq, y);
    case GgmlType::Q5_K: return matvec_packed_k<PkQ5K>(w, r0, r1, xq, y);
    case GgmlType::Q6_K: return matvec_packed_k<PkQ6K>(w, r0, r1, xq, y);
    case GgmlType::Q4_0: return run_packed<Pk<GgmlType::Q4_0>>(w, r0, r1, xq, n, y, ldy);
    case GgmlType::MXFP4: return run_packed<Pk<GgmlType::MXFP4>>(w, r0, r1, xq, n, y, ldy);
    default: return run_packed<Pk<GgmlType::Q8_0>>(w, r0, r1, xq, n, y, ldy);
  }
}

KVS_TARGET_END()

}  // namespace kvs::mm
